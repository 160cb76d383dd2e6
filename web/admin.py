"""``/v1/admin/dead-letters``: the DLQ tools of the CLI, for admin keys.

A non-admin key gets 404 here, as if the endpoints did not exist. Every
action is recorded with the operator's actor.
"""

from __future__ import annotations

from flask import Blueprint, current_app, g, jsonify, request
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from paycron import dead_letters
from paycron.errors import ValidationFailed
from web.auth import require_admin
from web.bodies import json_object, payment_id_or_404
from web.schemas import NO_NUL, AttemptSchema, PaymentSchema, unicode_text

bp = Blueprint("admin", __name__, url_prefix="/v1/admin/dead-letters")


class DeadLetterSchema(Schema):
    payment_id = fields.UUID(data_key="paymentId")
    reason = fields.String()
    last_error = fields.String(data_key="lastError", allow_none=True)
    created_at = fields.AwareDateTime(data_key="createdAt")
    resolution = fields.String(allow_none=True)
    resolved_by = fields.String(data_key="resolvedBy", allow_none=True)
    resolved_at = fields.AwareDateTime(data_key="resolvedAt", allow_none=True)
    note = fields.String(allow_none=True)


class DismissSchema(Schema):
    class Meta:
        unknown = RAISE

    note = fields.String(load_default=None, validate=[
        validate.Length(max=1000), unicode_text,
        validate.Regexp(NO_NUL, error="note must not contain U+0000")])




def _letter_id(text: str):
    return payment_id_or_404(text, "no dead letter for this payment")


_letters = DeadLetterSchema(many=True)
_payment = PaymentSchema()
_attempts = AttemptSchema(many=True)
_dismiss = DismissSchema()


def _pool():
    return current_app.extensions["paycron.pool"]


@bp.get("")
@require_admin
def index():
    limit = request.args.get("limit", "100")
    if not limit.isdigit() or not 1 <= int(limit) <= 1000:
        raise ValidationFailed({"limit": ["an integer from 1 to 1000"]})
    with _pool().connection() as conn:
        rows = dead_letters.list_open(conn, limit=int(limit))
    return jsonify({"data": _letters.dump(rows)})


@bp.get("/<payment_id>")
@require_admin
def show(payment_id: str):
    with _pool().connection() as conn:
        found = dead_letters.show(conn, _letter_id(payment_id))
    return jsonify({"payment": _payment.dump(found["payment"]),
                    "deadLetters": _letters.dump(found["dead_letters"])})


def _action(action, payment_id: str, **kwargs):
    gateway = current_app.extensions["paycron.gateway"]
    with _pool().connection() as conn:
        result = action(conn, gateway, _letter_id(payment_id), actor=g.principal.actor,
                        **kwargs)
    return jsonify({"paymentId": str(result.payment_id), "action": result.action,
                    "detail": result.detail})


@bp.post("/<payment_id>/redrive")
@require_admin
def redrive(payment_id: str):
    return _action(dead_letters.redrive, payment_id)


@bp.post("/<payment_id>/refund")
@require_admin
def refund(payment_id: str):
    return _action(dead_letters.refund, payment_id)


@bp.post("/<payment_id>/dismiss")
@require_admin
def dismiss(payment_id: str):
    # The body is optional; when there is one it must be a JSON object.
    raw = json_object() if request.get_data() else {}
    try:
        body = _dismiss.load(raw)
    except ValidationError as exc:
        raise ValidationFailed(exc.normalized_messages()) from None
    return _action(lambda conn, _gateway, pid, **kw: dead_letters.dismiss(conn, pid, **kw),
                   payment_id, note=body["note"])
