"""JSON over HTTP, as every surface of the fake answers it.

Errors are ``{"error": {"code", "type", "message"}}``; a malformed request is
400 ``invalid_request``. A handler raises `ApiError` (or a core `Refusal`
that its surface maps to one) and `api` renders it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from aiohttp import web

from gateway.fake.errors import Refusal

JSON_TYPE = "application/json"
REPLAYED_HEADERS = {"Idempotent-Replayed": "true"}
#: The latency the fake waited before answering (a test affordance; no real processor has it).
LATENCY_HEADER = "Fake-Latency-Ms"
#: Idempotency keys are 1..255 printable characters (255 is Stripe's limit too).
MAX_KEY_LENGTH = 255

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error answer, raised anywhere in a handler and rendered by `api`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind
        self.headers = headers

    def response(self) -> web.Response:
        """The HTTP answer for this error."""
        payload = {"error": {"code": self.code, "type": self.kind, "message": self.message}}
        return json_response(self.status, payload, headers=self.headers)


def invalid(message: str) -> ApiError:
    """A 400 for a malformed request."""
    return ApiError(400, "invalid_request", message)


class ErrorShape(NamedTuple):
    """How a surface answers one kind of core `Refusal` (the message is the refusal's)."""

    status: int
    code: str
    kind: str = "invalid_request_error"
    headers: dict[str, str] | None = None

    def error(self, refusal: Refusal) -> ApiError:
        """The answer to `refusal` in this shape."""
        return ApiError(self.status, self.code, str(refusal), kind=self.kind, headers=self.headers)


RefusalAnswers = Mapping[type[Refusal], ErrorShape]

#: One encoder for every answer: `json.dumps` with options would build one per call.
_ENCODE_JSON = json.JSONEncoder(separators=(",", ":")).encode


def dumps(payload: Any) -> bytes:
    """Compact JSON bytes: the stored, replayable form of an answer."""
    return _ENCODE_JSON(payload).encode()


def json_response(
    status: int, payload: Any, *, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer."""
    return raw_json_response(status, dumps(payload), headers=headers)


def raw_json_response(
    status: int, body: bytes, *, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer whose body is already encoded (a stored answer)."""
    return web.Response(body=body, status=status, content_type=JSON_TYPE, headers=headers)


def latency_headers(latency_ms: float) -> dict[str, str] | None:
    """The header reporting an injected latency, if there was one."""
    return {LATENCY_HEADER: f"{latency_ms:.3f}"} if latency_ms else None


def api(handler: Handler, refusals: RefusalAnswers) -> Handler:
    """Render the `ApiError`s a handler raises, and its `Refusal`s through `refusals`.

    A refusal missing from `refusals` is a bug in the surface, left to
    propagate as a 500 (a test checks every surface maps every refusal it
    can meet).
    """

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except Refusal as exc:
            shape = refusals.get(type(exc))
            if shape is None:
                raise
            return shape.error(exc).response()

    return wrapper


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        payload = json.loads((await request.read()).decode())
    except ValueError:
        raise invalid("the body must be a JSON object") from None
    if not isinstance(payload, dict):
        raise invalid("the body must be a JSON object")
    return payload


def route_table(
    table: list[tuple[str, str, Handler]], refusals: RefusalAnswers
) -> list[web.RouteDef]:
    """``(method, path, handler)`` rows as aiohttp routes, each wrapped by
    :func:`api` with the surface's own refusal table."""
    return [web.route(method, path, api(handler, refusals)) for method, path, handler in table]


def idempotency_key(request: web.Request) -> str:
    """The request's `Idempotency-Key` header, required on every POST that moves money."""
    key = request.headers.get("Idempotency-Key")
    if not key:
        raise invalid("the Idempotency-Key header is required")
    if len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise invalid(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters")
    return key
