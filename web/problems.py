"""Errors as RFC 9457 problem details. HTTP status codes are decided here,
in one place: from the domain's error codes, for what Flask refuses before a
view runs, and for a request its schema refused (400, where webargs would
answer 422)."""

from __future__ import annotations

from flask import Flask, jsonify
from marshmallow import fields
from psycopg import OperationalError
from psycopg.errors import (
    QueryCanceled,
    UndefinedColumn,
    UndefinedFunction,
    UndefinedObject,
    UndefinedTable,
)
from psycopg_pool import PoolTimeout
from werkzeug.exceptions import HTTPException, ServiceUnavailable

from paycron.errors import (
    CancelRefused,
    CustomerBound,
    DeadLetterActionRefused,
    GatewayError,
    GatewayRequestRefused,
    IdempotencyKeyReused,
    LimitReached,
    NotFound,
    OutcomeUnknown,
    PaycronError,
    ProcessorUnavailable,
    RateLimited,
    ValidationFailed,
)
from paycron.store.migrate import describe_pending, pending_migrations
from web.schemas import ResponseSchema

PROBLEM_JSON = "application/problem+json"

_STATUS_BY_ERROR: list[tuple[type[PaycronError], int]] = [
    (ValidationFailed, 400),
    (NotFound, 404),
    (IdempotencyKeyReused, 409),
    (CancelRefused, 409),
    (DeadLetterActionRefused, 409),
    (LimitReached, 409),
    (CustomerBound, 409),
    (RateLimited, 429),
    # The processor refused our request: our bug or its API's change, not an
    # outage (a 502 would tell the operator to wait): an internal error.
    (GatewayRequestRefused, 500),
    (GatewayError, 502),
    # A create that may or may not have committed (docs/operations.md): retry it with
    # the same Idempotency-Key, which returns the payment or creates it once.
    (OutcomeUnknown, 503),
    # A create that needed the processor's word and did not get it: nothing written.
    (ProcessorUnavailable, 503),
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

#: The Idempotency-Key header's refusals, which have codes of their own
#: rather than VALIDATION_FAILED: its schema (``web.payments``) says them.
IDEMPOTENCY_KEY_MISSING = "the Idempotency-Key header is required"
IDEMPOTENCY_KEY_INVALID = "Idempotency-Key must be 1-255 printable ASCII characters"
_CODED_MESSAGES = {
    IDEMPOTENCY_KEY_MISSING: "IDEMPOTENCY_KEY_MISSING",
    IDEMPOTENCY_KEY_INVALID: "IDEMPOTENCY_KEY_INVALID",
}


class ProblemSchema(ResponseSchema):
    """RFC 9457 problem details with a stable machine ``code``."""

    class Meta:
        # only VALIDATION_FAILED and CUSTOMER_NOT_YOURS have per-field messages
        optional = ("errors",)

    type = fields.String()
    title = fields.String()
    status = fields.Integer()
    code = fields.String()
    detail = fields.String()
    errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))


_problem = ProblemSchema()


class Problem(Exception):
    """Raised by views for an HTTP-level refusal (auth, headers, media type)."""

    def __init__(self, status: int, code: str, detail: str, errors: dict | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.errors = status, code, detail, errors


def refusal(messages: dict[str, list[str]]) -> Exception:
    """The error for a request its schema refused, ``messages`` keyed by the
    fields' wire names: 400 VALIDATION_FAILED with them, unless a message has
    a code of its own."""
    for field_messages in messages.values():
        for message in field_messages:
            if message in _CODED_MESSAGES:
                return Problem(400, _CODED_MESSAGES[message], message)
    return ValidationFailed(messages)


def problem(description: str, **kwargs) -> dict:
    """``@bp.alt_response(status, **problem("..."))``: a documented refusal."""
    return {
        "schema": ProblemSchema,
        "content_type": PROBLEM_JSON,
        "description": description,
        **kwargs,
    }


#: Refusals any route that reads a body documents.
TOO_LARGE = problem("The body is larger than MAX_BODY_BYTES (BODY_TOO_LARGE).")
NOT_JSON = problem("The body is not application/json (UNSUPPORTED_MEDIA_TYPE).")


def problem_body(status: int, code: str, detail: str, errors: dict | None = None) -> dict:
    """The problem details of a refusal, as a dict (``ProblemSchema``'s)."""
    body = {
        "type": f"https://paycron.dev/problems/{code.lower().replace('_', '-')}",
        "title": code.replace("_", " ").capitalize(),
        "status": status,
        "code": code,
        "detail": detail,
    }
    if errors:
        body["errors"] = errors
    return _problem.dump(body)


def error_body(error: PaycronError) -> dict:
    """A domain error's problem details (a batch item's refusal)."""
    errors = error.messages if isinstance(error, ValidationFailed) else None
    return problem_body(status_for(error), error.code, str(error), errors)


def problem_response(status: int, code: str, detail: str, errors: dict | None = None):
    response = jsonify(problem_body(status, code, detail, errors))
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


def http_problem(error: HTTPException):
    """What werkzeug raised (404 no route, 405, 413, ...) as a problem."""
    status = error.code or 500
    response = problem_response(status, _HTTP_CODES.get(status, "HTTP_ERROR"), error.description)
    valid_methods = getattr(error, "valid_methods", None)
    if valid_methods:  # a 405 must say what is allowed (RFC 9110 §15.5.6)
        response.headers["Allow"] = ", ".join(sorted(valid_methods))
    return response


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(Problem)
    def _problem(error: Problem):
        return problem_response(error.status, error.code, error.detail, error.errors)

    @app.errorhandler(PaycronError)
    def _domain(error: PaycronError):
        errors = error.messages if isinstance(error, ValidationFailed) else None
        response = problem_response(status_for(error), error.code, str(error), errors)
        if isinstance(error, RateLimited):
            response.headers["Retry-After"] = str(error.retry_after)
        return response

    app.register_error_handler(HTTPException, http_problem)

    @app.errorhandler(QueryCanceled)
    def _statement_cancelled(error: QueryCanceled):
        # Past WEB_STATEMENT_TIMEOUT (or cancelled): the database is too slow
        # to answer now, which is 503, not 500.
        app.logger.warning("statement cancelled: %s", type(error).__name__)
        return http_problem(ServiceUnavailable("the database did not answer in time; retry later"))

    @app.errorhandler(PoolTimeout)
    @app.errorhandler(OperationalError)
    def _database_unreachable(error: Exception):
        # No primary to talk to (a failover, a restart): 503 and retry, not a
        # 500. A create's own losses answer OUTCOME_UNKNOWN (web.payments).
        app.logger.warning("database unavailable: %s", type(error).__name__)
        return http_problem(ServiceUnavailable("the database is unavailable; retry later"))

    @app.errorhandler(UndefinedTable)
    @app.errorhandler(UndefinedColumn)
    @app.errorhandler(UndefinedFunction)
    @app.errorhandler(UndefinedObject)
    def _schema_behind(error: Exception):
        # A table or column this code expects is missing: when migrations
        # are pending that is a step not taken (503, and say which), not a bug.
        try:
            with app.extensions["paycron.pool"].connection(timeout=2) as conn:
                pending = pending_migrations(conn)
        except Exception:
            pending = []
        if not pending:
            return _unexpected(error)
        app.logger.warning("%s", describe_pending(pending))
        return problem_response(503, "SCHEMA_NOT_CURRENT", describe_pending(pending))

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        app.logger.exception("unhandled error")
        return problem_response(500, "INTERNAL", "internal error")
