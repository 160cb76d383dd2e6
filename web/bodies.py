"""Reading requests, the same way for every endpoint: through
``web.api.Parser`` for ``@bp.arguments``, and through :func:`load` for the
inputs a view loads itself (the create's: see ``web.payments``)."""

from __future__ import annotations

from flask import request
from marshmallow import Schema, ValidationError

from web.problems import Problem, refusal


def json_object() -> dict:
    """The request body as a JSON object: 415 unless JSON, 400 unless an object."""
    if not request.mimetype or request.mimetype != "application/json":
        raise Problem(415, "UNSUPPORTED_MEDIA_TYPE", "send Content-Type: application/json")
    body = request.get_json(silent=True)  # may raise 413 first: the body is read here
    if body is None:
        raise Problem(400, "INVALID_JSON", "the request body is not valid JSON")
    if not isinstance(body, dict):
        raise Problem(400, "INVALID_JSON", "the request body must be a JSON object")
    return body


def headers(schema: Schema) -> dict:
    """The request's headers that ``schema`` names, as a mapping it can load
    (werkzeug's ``Headers`` is not one)."""
    names = (field.data_key or name for name, field in schema.load_fields.items())
    return {name: request.headers[name] for name in names if name in request.headers}


def load(schema: Schema, data: dict):
    """``schema.load(data)``, a refusal answered as ``@bp.arguments`` answers it."""
    try:
        return schema.load(data)
    except ValidationError as exc:
        raise refusal(exc.messages) from None
