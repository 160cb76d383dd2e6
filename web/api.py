"""flask-smorest, set up once for every route of the API.

A route states its contract on the view, once: ``@bp.arguments`` names the
schema that loads its query, header, path or body, ``@bp.response`` the one
that dumps its answer, ``@bp.alt_response`` its refusals, and
``require_key`` (``web/auth.py``) its security. ``GET /openapi.json`` is
generated from those same objects. Set here: how a request is read
(:class:`Parser`), the document's frame (title, security scheme, operation
ids), and that errors are answered by ``web.problems``.
"""

from __future__ import annotations

import copy
import json

import flask_smorest
from apispec import BasePlugin
from flask import Flask, current_app, request
from marshmallow import EXCLUDE, Schema
from webargs import core
from webargs.flaskparser import FlaskParser
from werkzeug.routing import BaseConverter

from web.bodies import json_object
from web.problems import ProblemSchema, http_problem, refusal

JSON = "application/json"
BEARER = "bearerAuth"


class Parser(FlaskParser):
    """webargs as this API reads requests.

    A JSON body is read by :func:`web.bodies.json_object` (415 unless JSON,
    400 ``INVALID_JSON`` unless an object, 413 when too large); an empty one
    is an absent one, which the schema's required fields then refuse.
    Unknown query parameters and body fields are refused, as their schemas
    say (``unknown = RAISE``; webargs would drop unknown query parameters);
    unknown headers are ignored. A refused load is ``web.problems.refusal``:
    400 with the messages per field, not webargs' 422.
    """

    DEFAULT_VALIDATION_STATUS = 400
    DEFAULT_UNKNOWN_BY_LOCATION = {"headers": EXCLUDE}

    def load_json(self, req, schema):
        return json_object() if req.get_data(cache=True) else core.missing

    def handle_error(self, error, req, schema, *, error_status_code, error_headers):
        (messages,) = error.messages.values()  # webargs keys them by location
        raise refusal(messages)


def _recorded(decorator):
    """A flask-smorest decorator that only documents (``doc``,
    ``alt_response``) wraps the view in a call-through layer, ~1 µs a request
    each and six on the create path: keep the documentation it records on the
    view (``_apidoc``, which ``@bp.route`` reads), drop the layer."""

    def record(view):
        view._apidoc = decorator(view)._apidoc
        return view

    return record


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = Parser()

    @staticmethod
    def doc(**kwargs):
        return _recorded(flask_smorest.Blueprint.doc(**kwargs))

    def alt_response(self, status_code, **kwargs):
        return _recorded(super().alt_response(status_code, **kwargs))

    def path(self, schema: Schema):
        """Loads the URL's ids into the view's keyword arguments. A malformed
        id is a 404 (see ``web.schemas.PathId``), and so is documented."""
        return self.arguments(schema, location="path", as_kwargs=True, error_status_code=404)


class OperationIds(BasePlugin):
    """Names each operation after its Flask endpoint (``payments.show`` ->
    ``payments_show``): stable names that links and client generators use."""

    def operation_helper(self, path=None, operations=None, **kwargs):
        for operation in operations.values():
            operation.setdefault("operationId", kwargs["rule"].endpoint.replace(".", "_"))


def links(parameter: str, *operation_ids: str) -> dict:
    """OpenAPI links from a created resource to the operations that take its
    ``id`` as ``parameter`` (a stateful client follows create -> read -> cancel)."""
    return {
        target: {"operationId": target, "parameters": {parameter: "$response.body#/id"}}
        for target in operation_ids
    }


def json_body(component: str) -> dict:
    """A required JSON request body described by a schema the app registered
    itself (:func:`document_schema`), for a view that loads its body itself."""
    return {"required": True, "content": {JSON: {"schema": component}}}


class ResourceId(BaseConverter):
    """``/<id:name>``: a resource's id in a path, any segment but the names of
    a collection's own routes (``batch``). Without it
    ``/v1/scheduled-payments/batch`` would also be a payment's URL, and its
    OPTIONS would offer that payment's GET and DELETE. The view's own schema
    checks the id (``web.schemas.PathId``)."""

    regex = r"(?!batch$)[^/]+"


class Api(flask_smorest.Api):
    """The API of one app, serving its document at ``GET /openapi.json``."""

    ERROR_SCHEMA = ProblemSchema
    DEFAULT_ERROR_RESPONSE_NAME = None  # every operation lists the refusals it makes

    def __init__(self, app: Flask):
        app.url_map.converters["id"] = ResourceId
        app.config.update(
            API_TITLE="paycron",
            API_VERSION="1",
            OPENAPI_VERSION="3.1.0",
            OPENAPI_URL_PREFIX="/",
            OPENAPI_JSON_PATH="openapi.json",
        )
        super().__init__(
            app,
            spec_kwargs={
                "extra_plugins": [OperationIds()],
                "info": {
                    "description": (
                        "Scheduled payments. Money is integer minor units; times are RFC 3339 "
                        "with an offset. Every error is application/problem+json (RFC 9457) "
                        "with a stable machine code."
                    )
                },
            },
        )
        self.register_converter(ResourceId, lambda converter: {"type": "string"})
        self.spec.components.security_scheme(
            BEARER,
            {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key from `paycron api-key create`; its actor is the payer.",
            },
        )

    def handle_http_exception(self, error):
        return http_problem(error)

    def _openapi_json(self):
        """The document, with the admin routes only for an admin key: to
        anyone else they do not exist (they answer 404), so they are not
        described either."""
        document = self.spec.to_dict()
        if not _asked_by_admin():
            document = without_admin(document)
        return current_app.response_class(
            json.dumps(document, indent=2, sort_keys=False), mimetype="application/json"
        )


ADMIN_PREFIX = "/v1/admin/"


def _asked_by_admin() -> bool:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return False
    principal = current_app.extensions["paycron.principals"].authenticate(
        current_app.extensions["paycron.pool"], key.strip()
    )
    return principal is not None and principal.is_admin


def _refs(node, found: set[str]) -> set[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.add(value.rsplit("/", 1)[-1])
            else:
                _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)
    return found


def without_admin(document: dict) -> dict:
    """``document`` less the admin paths, their tags and the schemas only
    they use."""
    document = copy.deepcopy(document)
    paths = document.get("paths", {})
    for path in [p for p in paths if p.startswith(ADMIN_PREFIX)]:
        del paths[path]
    used_tags = {
        t
        for item in paths.values()
        for op in item.values()
        if isinstance(op, dict)
        for t in op.get("tags", [])
    }
    if "tags" in document:
        document["tags"] = [t for t in document["tags"] if t["name"] in used_tags]
    schemas = document.get("components", {}).get("schemas", {})
    keep = _refs({k: v for k, v in document.items() if k != "components"}, set())
    while True:  # what the kept schemas use, transitively
        more = _refs([schemas[name] for name in keep if name in schemas], set()) - keep
        if not more:
            break
        keep |= more
    for name in [n for n in schemas if n not in keep]:
        del schemas[name]
    return document


def document_schema(app: Flask, component: str, schema: Schema) -> Schema:
    """Adds to ``app``'s document a schema instance the app built for itself
    (from its config), under ``component``; returns the schema."""
    api = app.extensions["flask-smorest"]["apis"][""]["ext_obj"]
    api.spec.components.schema(component, schema=schema)
    return schema
