"""``/v1/scheduled-payments``: create, read, list, cancel.

The API never enqueues work: it writes rows, and the database is the schedule.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import UTC, datetime

from flask import Blueprint, current_app, g, jsonify, request
from marshmallow import ValidationError

from paycron import payments, transitions
from paycron.enums import CancelOutcome
from paycron.errors import CancelRefused, NotFound, ValidationFailed
from paycron.payments import NewPayment
from web.auth import require_key
from web.bodies import json_object, payment_id_or_404
from web.problems import Problem
from web.schemas import (
    CreatePaymentSchema,
    ListQuerySchema,
    PaymentPageSchema,
    PaymentSchema,
)

bp = Blueprint("payments", __name__, url_prefix="/v1/scheduled-payments")

_payment = PaymentSchema()
_page = PaymentPageSchema()
_list_query = ListQuerySchema()
_MAX_KEY_LENGTH = 255


def _pool():
    return current_app.extensions["paycron.pool"]


def _config():
    return current_app.extensions["paycron.config"]


def _idempotency_key() -> str:
    key = request.headers.get("Idempotency-Key")
    if key is None or key == "":
        raise Problem(400, "IDEMPOTENCY_KEY_MISSING", "the Idempotency-Key header is required")
    if len(key) > _MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        raise Problem(400, "IDEMPOTENCY_KEY_INVALID",
                      f"Idempotency-Key must be 1-{_MAX_KEY_LENGTH} printable ASCII characters")
    return key


@bp.record_once
def _build_create_schema(state) -> None:
    # One schema per app: building one per request costs as much as loading.
    # Schemas keep no per-load state, so the gthread workers share it.
    extensions = state.app.extensions
    extensions["paycron.create_schema"] = CreatePaymentSchema(
        extensions["paycron.config"], extensions["paycron.clock"])


def _validated(body: dict) -> NewPayment:
    try:
        data = current_app.extensions["paycron.create_schema"].load(body)
    except ValidationError as exc:
        raise ValidationFailed(exc.normalized_messages()) from None
    return NewPayment(
        payee=data["payee"], amount_minor=data["amount"],
        currency=data["currency"] or _config().default_currency,
        due_at=data["due_at"].astimezone(UTC),
    )


def _created(payment: dict, replayed: bool):
    response = jsonify(_payment.dump(payment))
    response.status_code = 201
    response.headers["Location"] = f"{bp.url_prefix}/{payment['id']}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@bp.post("")
@require_key
def create():
    actor = g.principal.actor
    body = json_object()
    key = _idempotency_key()
    body_hash = payments.request_hash(body)
    try:
        new = _validated(body)
    except ValidationFailed:
        # A replay is answered even when its body no longer validates (its
        # dueAt has passed since the first create): look the key up before
        # refusing. Valid creates skip this round trip: the insert itself
        # detects a used key.
        with _pool().connection() as conn:
            replay = payments.find_replay(conn, actor, key, body_hash)
        if replay is None:
            raise
        return _created(replay, replayed=True)
    with _pool().connection() as conn:
        created = payments.create_payment(
            conn, actor=actor, key=key, body_hash=body_hash, new=new,
            smear_seconds=_config().smear_seconds,
        )
    return _created(created.payment, created.replayed)


@bp.get("/<payment_id>")
@require_key
def show(payment_id: str):
    with _pool().connection() as conn:
        row = payments.get_payment(conn, payment_id_or_404(payment_id), actor=g.principal.actor)
    if row is None:
        raise NotFound("no such payment")
    return jsonify(_payment.dump(row))


@bp.delete("/<payment_id>")
@require_key
def cancel(payment_id: str):
    pid = payment_id_or_404(payment_id)
    with _pool().connection() as conn:
        outcome = transitions.cancel(conn, pid, actor=g.principal.actor)
    if outcome is CancelOutcome.NOT_FOUND:
        raise NotFound("no such payment")
    if outcome is not CancelOutcome.CANCELLED:
        raise CancelRefused(outcome)
    return jsonify({"id": str(pid), "status": "CANCELLED"})


def encode_cursor(key: tuple[datetime, uuid.UUID]) -> str:
    raw = json.dumps([key[0].isoformat(), str(key[1])]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, payment_id = json.loads(raw)
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None:
            raise ValueError("naive")
        return when, uuid.UUID(payment_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed({"cursor": ["not a cursor this API returned"]}) from None


@bp.get("")
@require_key
def index():
    try:
        query = _list_query.load(request.args.to_dict())
    except ValidationError as exc:
        raise ValidationFailed(exc.normalized_messages()) from None
    after = decode_cursor(query["cursor"]) if query["cursor"] else None
    with _pool().connection() as conn:
        page, next_key = payments.list_payments(
            conn, actor=g.principal.actor, status=query["status"], limit=query["limit"],
            after=after,
        )
    return jsonify(_page.dump({
        "data": page, "next_cursor": encode_cursor(next_key) if next_key else None,
    }))
