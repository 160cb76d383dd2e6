"""Stripe's wire format, as the official SDK speaks it.

Requests are form-encoded (POST bodies, GET query strings) with nested keys
(``metadata[k]=v``, ``created[gte]=…``, ``expand[0]=…``), booleans as
``true``/``false``, authenticated by ``Authorization: Bearer sk_…``. Answers
are JSON; an error is ``{"error": {"type", "message", "code"?, "param"?,
"doc_url"?, …}}`` with Stripe's statuses (400/404 invalid_request_error,
401, 402 card_error, 409, 429, 5xx api_error), lists are ``{"object":
"list", "data", "has_more", "url"}``. Every answer carries ``Request-Id``
and ``Stripe-Version``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from gateway.fake.jsonapi import dumps, raw_json_response
from gateway.fake.stripe_objects import doc_url

Params = dict[str, Any]

#: `name[a][b]` → `name`, `[a][b]`.
_KEY = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)")
_PART = re.compile(r"\[([^\[\]]*)\]")
#: Stripe lists return 10 objects unless asked, at most 100.
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
RANGE_OPERATORS = ("gt", "gte", "lt", "lte")
NO_KEY_MESSAGE = (
    "You did not provide an API key. You need to provide your API key in the "
    "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
    "YOUR_SECRET_KEY')."
)


class StripeError(Exception):
    """An error answer in Stripe's shape, raised anywhere in a handler.

    `stored`: the error happened after the endpoint began executing, so it
    is kept for the idempotency key and replayed (a validation error is not).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        stored: bool = False,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message)
        error: dict[str, Any] = {"type": type, "message": message}
        if code is not None:
            error.update(code=code, doc_url=doc_url(code))
        if param is not None:
            error["param"] = param
        error.update(fields)
        self.status, self.body, self.stored = status, {"error": error}, stored
        self.headers = headers or {}

    def response(self) -> web.Response:
        return raw_json_response(self.status, dumps(self.body), headers=dict(self.headers))


def invalid(message: str, *, code: str | None = None, param: str | None = None) -> StripeError:
    """A 400 `invalid_request_error` (never stored: Stripe rejects before executing)."""
    return StripeError(400, message, code=code, param=param)


def missing(kind: str, object_id: str, param: str, status: int = 404) -> StripeError:
    """Stripe's `resource_missing` for an id it does not know."""
    return StripeError(
        status, f"No such {kind}: '{object_id}'", code="resource_missing", param=param
    )


# ---- requests


def parse_form(text: str) -> Params:
    """A form-encoded string as nested params: `a[b]=1` → {"a": {"b": "1"}};
    `a[0]=x&a[1]=y` and `a[]=x&a[]=y` → {"a": ["x", "y"]}."""
    params: Params = {}
    for raw_key, value in parse_qsl(text, keep_blank_values=True):
        match = _KEY.fullmatch(raw_key)
        if match is None:
            raise invalid(f"Invalid parameter name: {raw_key}")
        path = [match.group(1), *_PART.findall(match.group(2))]
        _insert(params, path, value)
    return _listify(params)


def _insert(node: Params, path: list[str], value: str) -> None:
    for index, part in enumerate(path[:-1]):
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        if path[index + 1] == "":  # `a[]`: append
            path[index + 1] = str(len(child))
        node = child
    node[path[-1]] = value


def _listify(node: Any) -> Any:
    """Dicts whose keys are all indexes become lists, in index order."""
    if not isinstance(node, dict):
        return node
    items = {key: _listify(value) for key, value in node.items()}
    if items and all(key.isdigit() for key in items):
        return [items[key] for key in sorted(items, key=int)]
    return items


def fingerprint(method: str, path: str, params: Params) -> tuple[Any, ...]:
    """What an idempotency key is bound to: the endpoint and its parameters, in any order."""
    return (method, path, dumps(_sorted(params)))


def _sorted(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _sorted(node[key]) for key in sorted(node)}
    if isinstance(node, list):
        return [_sorted(item) for item in node]
    return node


def check_known(params: Params, known: frozenset[str]) -> None:
    for name in params:
        if name not in known:
            raise invalid(
                f"Received unknown parameter: {name}", code="parameter_unknown", param=name
            )


def string(params: Params, name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise invalid(f"Missing required param: {name}.", code="parameter_missing", param=name)
        return None
    if not isinstance(value, str):
        raise invalid(f"Invalid string: {name}", code="parameter_invalid_string", param=name)
    return value


def integer(params: Params, name: str, *, required: bool = False) -> int | None:
    text = string(params, name, required=required)
    if text is None:
        return None
    if not re.fullmatch(r"-?\d+", text):
        raise invalid(f"Invalid integer: {text}", code="parameter_invalid_integer", param=name)
    return int(text)


def boolean(params: Params, name: str) -> bool | None:
    text = string(params, name)
    if text is None:
        return None
    if text not in ("true", "false"):
        raise invalid(f"Invalid boolean: {text}", code="parameter_invalid_boolean", param=name)
    return text == "true"


def metadata(params: Params) -> dict[str, str]:
    """`metadata[k]=v` pairs (an empty value unsets a key, as at Stripe)."""
    value = params.get("metadata", {})
    if value == "":
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid("Invalid hash", code="parameter_invalid_empty", param="metadata")
    if len(value) > 50 or any(len(k) > 40 or len(v) > 500 for k, v in value.items()):
        raise invalid(
            "Metadata can have up to 50 keys of at most 40 characters and values of at most 500.",
            code="parameter_invalid_string",
            param="metadata",
        )
    return {key: text for key, text in value.items() if text != ""}


def expansions(params: Params) -> list[str]:
    value = params.get("expand", [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid("Invalid array", param="expand")
    return value


def created_range(params: Params, name: str = "created") -> dict[str, int]:
    """A `created` filter: an exact second or `created[gt|gte|lt|lte]`."""
    value = params.get(name)
    if value is None:
        return {}
    if isinstance(value, str):
        exact = integer(params, name)
        assert exact is not None
        return {"gte": exact, "lte": exact}
    if not isinstance(value, dict) or not set(value) <= set(RANGE_OPERATORS):
        raise invalid(f"Invalid {name} filter", param=name)
    return {op: _as_int(text, f"{name}[{op}]") for op, text in value.items()}


def _as_int(text: Any, name: str) -> int:
    if not isinstance(text, str) or not re.fullmatch(r"-?\d+", text):
        raise invalid(f"Invalid integer: {text}", code="parameter_invalid_integer", param=name)
    return int(text)


def limit(params: Params) -> int:
    value = integer(params, "limit")
    if value is None:
        return DEFAULT_LIMIT
    if not 1 <= value <= MAX_LIMIT:
        raise invalid(
            f"This value must be between 1 and {MAX_LIMIT}.",
            code="parameter_invalid_integer",
            param="limit",
        )
    return value


# ---- authentication


def api_key_of(request: web.Request) -> str | None:
    """The secret key a request presents: Bearer (the SDK's) or Basic (curl's `-u sk_…:`)."""
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip() or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[0] or None
    return None


def authenticate(request: web.Request, expected: str) -> None:
    """401 unless the request presents `expected`; the key shown back is masked."""
    presented = api_key_of(request)
    if presented is None:
        raise StripeError(401, NO_KEY_MESSAGE)
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise StripeError(401, f"Invalid API Key provided: {mask(presented)}")


def mask(key: str) -> str:
    """A key as Stripe shows it in errors: its first 8 and last 4 characters, the rest
    starred (all of it starred when it is too short to leave anything hidden)."""
    if len(key) < 16:
        return "*" * len(key)
    return key[:8] + "*" * (len(key) - 12) + key[-4:]


# ---- answers


def list_object(url: str, data: list[Any], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "has_more": has_more, "url": url}


def search_result(
    url: str, data: list[Any], has_more: bool, next_page: str | None
) -> dict[str, Any]:
    return {
        "object": "search_result",
        "data": data,
        "has_more": has_more,
        "next_page": next_page,
        "url": url,
    }
