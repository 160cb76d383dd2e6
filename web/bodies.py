"""Reading requests (bodies, path ids), the same way for every endpoint."""

from __future__ import annotations

import uuid

from flask import request

from paycron.errors import NotFound
from paycron.ids import parse_payment_id
from web.problems import Problem


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


def payment_id_or_404(text: str, message: str = "no such payment") -> uuid.UUID:
    """The payment id in a URL; a malformed one is a 404 like an unknown one."""
    payment_id = parse_payment_id(text)
    if payment_id is None:
        raise NotFound(message)
    return payment_id
