"""Reading request bodies, the same way for every endpoint: through
``web.api.Parser`` for ``@bp.arguments``, and through :func:`load` for the
one body a view loads itself (the create: see ``web.payments``)."""

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


def load(schema: Schema, body: dict):
    """``schema.load(body)``, a refusal answered as ``@bp.arguments`` answers it."""
    try:
        return schema.load(body)
    except ValidationError as exc:
        raise refusal(exc.messages) from None
