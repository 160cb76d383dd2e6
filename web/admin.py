"""``/v1/admin/dead-letters``: the DLQ tools of the CLI, for admin keys.

A non-admin key gets 404 here, as if the endpoints did not exist. Every
action is recorded with the operator's actor.
"""

from __future__ import annotations

from uuid import UUID

from flask import current_app, g
from marshmallow import Schema, fields, validate

from paycron.domain.ids import parse_payment_id
from paycron.engine import dead_letters
from web.api import Blueprint
from web.audit import audit, audited
from web.auth import require_admin
from web.problems import NOT_JSON, TOO_LARGE, problem
from web.schemas import NO_NUL, PathId, PaymentSchema, ResponseSchema, Strict, unicode_text

bp = Blueprint(
    "admin",
    __name__,
    url_prefix="/v1/admin/dead-letters",
    description="Dead letters: list, show, re-drive, refund, dismiss (admin).",
)


class LetterPath(Schema):
    payment_id = PathId(
        parse_payment_id,
        "no dead letter for this payment",
        metadata={"description": "The id of a payment that was parked (UUIDv7)."},
    )


class DeadLetterQuery(Strict):
    limit = fields.Integer(
        load_default=100,
        validate=validate.Range(min=1, max=1000, error="an integer from 1 to 1000"),
        error_messages={"invalid": "an integer from 1 to 1000"},
    )


class DismissSchema(Strict):
    note = fields.String(
        load_default=None,
        validate=[
            validate.Length(max=1000),
            unicode_text,
            validate.Regexp(NO_NUL, error="note must not contain U+0000"),
        ],
    )


class DeadLetterSchema(ResponseSchema):
    class Meta:
        # The open list leaves out what an open letter cannot have yet.
        optional = ("resolution", "resolved_by", "resolved_at", "note")

    payment_id = fields.UUID(data_key="paymentId")
    reason = fields.String()
    last_error = fields.String(data_key="lastError", allow_none=True)
    created_at = fields.AwareDateTime(data_key="createdAt")
    resolution = fields.String(allow_none=True)
    resolved_by = fields.String(data_key="resolvedBy", allow_none=True)
    resolved_at = fields.AwareDateTime(data_key="resolvedAt", allow_none=True)
    note = fields.String(allow_none=True)


class DeadLetterPageSchema(ResponseSchema):
    data = fields.List(fields.Nested(DeadLetterSchema))


class DeadLetterDetailSchema(ResponseSchema):
    payment = fields.Nested(PaymentSchema)
    dead_letters = fields.List(fields.Nested(DeadLetterSchema), data_key="deadLetters")


class DeadLetterActionSchema(ResponseSchema):
    """The answer of redrive, refund and dismiss."""

    payment_id = fields.UUID(data_key="paymentId")
    action = fields.String(
        metadata={"enum": ["completed", "redriven", "awaiting_gateway", "refunded", "dismissed"]}
    )
    detail = fields.String()


def _pool():
    return current_app.extensions["paycron.pool"]


@bp.get("")
@require_admin
@bp.arguments(DeadLetterQuery(), location="query", as_kwargs=True)
@bp.response(200, DeadLetterPageSchema, description="Open dead letters.")
@bp.alt_response(400, **problem("A bad limit."))
def index(limit: int):
    """Open dead letters (admin)."""
    with _pool().connection() as conn:
        page = {"data": dead_letters.list_open(conn, limit=limit)}
    audit("admin.read", "success", target=f"dead letters (limit {limit})", channel="api")
    return page


@bp.get("/<payment_id>")
@require_admin
@bp.path(LetterPath())
@bp.response(200, DeadLetterDetailSchema, description="The payment and every dead letter it had.")
def show(payment_id: UUID):
    """A parked payment and its dead letters (admin)."""
    with audited("admin.read", target=f"dead letter {payment_id}", channel="api"):
        with _pool().connection() as conn:
            return dead_letters.show(conn, payment_id)


_GATEWAY_UNAVAILABLE = problem("The gateway could not be asked (GATEWAY_UNAVAILABLE).")
_PROCESSOR_REFUSED = problem(
    "The processor refused paycron's request: a bug or an API change, not an outage "
    "(PROCESSOR_REFUSED_REQUEST, PROCESSOR_PAYMENT_MISSING)."
)


def _gateway_action(refused: str):
    """The contract of an action that asks the gateway first (re-drive,
    refund): admin only, the letter's id in the path, what was done, or
    409 ``refused``, or 500 (the processor refused our request), or 502."""
    stack = [
        require_admin,
        bp.path(LetterPath()),
        bp.response(200, DeadLetterActionSchema, description="What was done."),
        bp.alt_response(409, **problem(refused)),
        bp.alt_response(500, **_PROCESSOR_REFUSED),
        bp.alt_response(502, **_GATEWAY_UNAVAILABLE),
    ]

    def declare(view):
        for decorator in reversed(stack):  # as if written top to bottom above the view
            view = decorator(view)
        return view

    return declare


@bp.post("/<payment_id>/redrive")
@_gateway_action("Resolved already, or not re-drivable (DEAD_LETTER_ACTION_REFUSED).")
def redrive(payment_id: UUID):
    """Re-drive a parked payment (admin).

    Completes it if the gateway holds the charge, else puts it back to PENDING
    with a fresh budget."""
    with audited("dead_letter.redrive", target=payment_id, channel="api"):
        with _pool().connection() as conn:
            return dead_letters.redrive(
                conn, current_app.extensions["paycron.gateway"], payment_id, actor=g.principal.actor
            )


@bp.post("/<payment_id>/refund")
@_gateway_action("Resolved already, or the gateway holds no charge (DEAD_LETTER_ACTION_REFUSED).")
def refund(payment_id: UUID):
    """Refund the charge the gateway holds and close the dead letter (admin)."""
    with audited("dead_letter.refund", target=payment_id, channel="api"):
        with _pool().connection() as conn:
            return dead_letters.refund(
                conn, current_app.extensions["paycron.gateway"], payment_id, actor=g.principal.actor
            )


@bp.post("/<payment_id>/dismiss")
@require_admin
@bp.path(LetterPath())
@bp.arguments(DismissSchema(), required=False, as_kwargs=True)
@bp.response(200, DeadLetterActionSchema, description="What was done.")
@bp.alt_response(400, **problem("An invalid body."))
@bp.alt_response(409, **problem("Resolved already (DEAD_LETTER_ACTION_REFUSED)."))
@bp.alt_response(413, **TOO_LARGE)
@bp.alt_response(415, **NOT_JSON)
def dismiss(payment_id: UUID, note: str | None):
    """Close the dead letter without action, with an optional note (admin)."""
    with audited("dead_letter.dismiss", target=payment_id, channel="api", reason=note):
        with _pool().connection() as conn:
            return dead_letters.dismiss(conn, payment_id, actor=g.principal.actor, note=note)
