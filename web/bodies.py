"""Reading request bodies, the same way for every endpoint."""

from __future__ import annotations

from flask import request

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
