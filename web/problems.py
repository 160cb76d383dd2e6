"""Errors as RFC 9457 problem details. HTTP status codes are decided here,
in one place, from the domain's error codes."""

from __future__ import annotations

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from paycron.errors import (
    CancelRefused,
    DeadLetterActionRefused,
    GatewayError,
    IdempotencyKeyReused,
    NotFound,
    PaycronError,
    ValidationFailed,
)

PROBLEM_JSON = "application/problem+json"

_STATUS_BY_ERROR: list[tuple[type[PaycronError], int]] = [
    (ValidationFailed, 400),
    (NotFound, 404),
    (IdempotencyKeyReused, 409),
    (CancelRefused, 409),
    (DeadLetterActionRefused, 409),
    (GatewayError, 502),
]

#: Codes for errors Flask/werkzeug raise before a view runs.
_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "BODY_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    503: "UNAVAILABLE",
}


class Problem(Exception):
    """Raised by views for an HTTP-level refusal (auth, headers, media type)."""

    def __init__(self, status: int, code: str, detail: str, errors: dict | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.errors = status, code, detail, errors


def problem_response(status: int, code: str, detail: str, errors: dict | None = None):
    body = {
        "type": f"https://paycron.dev/problems/{code.lower().replace('_', '-')}",
        "title": code.replace("_", " ").capitalize(),
        "status": status,
        "code": code,
        "detail": detail,
    }
    if errors:
        body["errors"] = errors
    response = jsonify(body)
    response.status_code = status
    response.mimetype = PROBLEM_JSON
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="paycron"'
    return response


def status_for(error: PaycronError) -> int:
    for kind, status in _STATUS_BY_ERROR:
        if isinstance(error, kind):
            return status
    return 500


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(Problem)
    def _problem(error: Problem):
        return problem_response(error.status, error.code, error.detail, error.errors)

    @app.errorhandler(PaycronError)
    def _domain(error: PaycronError):
        errors = error.messages if isinstance(error, ValidationFailed) else None
        return problem_response(status_for(error), error.code, str(error), errors)

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException):
        status = error.code or 500
        response = problem_response(status, _HTTP_CODES.get(status, "HTTP_ERROR"),
                                    error.description)
        valid_methods = getattr(error, "valid_methods", None)
        if valid_methods:  # a 405 must say what is allowed (RFC 9110 §15.5.6)
            response.headers["Allow"] = ", ".join(sorted(valid_methods))
        return response

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        app.logger.exception("unhandled error")
        return problem_response(500, "INTERNAL", "internal error")
