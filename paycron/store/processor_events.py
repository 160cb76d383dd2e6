"""The processor's word on payments that wait for it (SPEC §12).

A signed event is stored as received (:func:`store`); the scheduler's
gateway-event service then applies it, or polls a waiting payment whose event
never came. Either way the processor-side payment is **retrieved** first —
an event is a hint, never the truth — and :func:`settle` decides from what
the processor holds now, writing only through the fenced CAS of
:func:`paycron.store.transitions.settle_awaiting`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from enum import StrEnum

from paycron.domain.enums import Status
from paycron.domain.ids import parse_payment_id
from paycron.domain.policy import CHARGED_STATUSES, Settlement, settlement_of
from paycron.domain.processing import Charge
from paycron.sql import q
from paycron.store import transitions
from paycron.store.db import Connection, one_row
from paycron.store.payments import get_payment

log = logging.getLogger("paycron.gateway_events")

#: The event types that can settle a payment; others are stored and ignored.
SETTLING_TYPES = frozenset(
    {
        "payment_intent.succeeded",
        "payment_intent.payment_failed",
        "payment_intent.processing",
        "payment_intent.canceled",
    }
)


class Result(StrEnum):
    """What applying an event or a poll came to (``gateway_events.result``)."""

    COMPLETED = "completed"
    FAILED = "failed"
    STILL_PROCESSING = "still_processing"
    NOT_YET = "not_yet"  # its payment has not recorded the call yet: try again later
    ALREADY_SETTLED = "already_settled"  # a duplicate: nothing to do
    PAGED = "paged"  # money moved where it should not have: a human must look
    MISMATCHED = "mismatched"  # the processor holds another amount or currency
    UNKNOWN_PAYMENT = "unknown_payment"
    DISAGREES = "disagrees"  # the event's contents are not what the processor holds
    IGNORED = "ignored"


def store(conn: Connection, *, processor: str, event: Mapping) -> bool:
    """Keep a verified event once (idempotent on its id); False for a duplicate."""
    obj = (event.get("data") or {}).get("object") or {}
    metadata = obj.get("metadata") or {}
    payment_id = parse_payment_id(str(metadata.get("paycron_payment_id") or ""))
    row = conn.execute(
        q("store_gateway_event"),
        {
            "id": str(event["id"]),
            "processor": processor,
            "type": str(event.get("type")),
            "intent_id": obj.get("id") if isinstance(obj.get("id"), str) else None,
            "payment_id": payment_id,
            "payload": json.dumps(event),
        },
    ).fetchone()
    return row is not None


def _recorded_refs(payment: Mapping) -> set[str]:
    refs = {a["gateway_ref"] for a in payment.get("attempts", ()) if a["gateway_ref"]}
    return refs | ({payment["gateway_intent_id"]} if payment["gateway_intent_id"] else set())


def settle(conn: Connection, payment_id: uuid.UUID, charge: Charge, *, actor: str) -> Result:
    """What the processor's payment ``charge`` (just retrieved) means for the
    payment: the CAS of a waiting payment fenced on it, or a page where money
    moved that the payment does not account for."""
    payment = get_payment(conn, payment_id, actor=None)
    if payment is None:
        log.warning("processor payment %s names no payment of ours", charge.id)
        return Result.UNKNOWN_PAYMENT
    status = Status(payment["status"])
    moved = charge.status in CHARGED_STATUSES
    if status is Status.AWAITING_GATEWAY and payment["gateway_intent_id"] == charge.id:
        settlement = settlement_of(charge)
        if settlement is Settlement.WAITING:
            return Result.STILL_PROCESSING
        if moved and (
            charge.amount != payment["amount_minor"]
            or charge.currency.upper() != payment["currency"].strip().upper()
        ):
            log.error(
                "processor payment %s for payment %s moved another amount or currency: "
                "left waiting for a human",
                charge.id,
                payment_id,
            )
            return Result.MISMATCHED
        target = Status.COMPLETED if settlement is Settlement.COMPLETED else Status.FAILED
        code = None if target is Status.COMPLETED else "payment_failed"
        if transitions.settle_awaiting(
            conn, payment_id, intent=charge.id, status=target, actor=actor, error_code=code
        ):
            return Result(target.value.lower())
        return Result.ALREADY_SETTLED  # settled by the other path meanwhile
    if status in (Status.PENDING, Status.PROCESSING):
        return Result.NOT_YET  # the call's answer is not recorded yet
    if not moved:
        return Result.IGNORED
    if status is Status.COMPLETED and charge.id in _recorded_refs(payment):
        return Result.ALREADY_SETTLED
    # Money moved on a processor-side payment the payment does not stand on:
    # another intent of a waiting or completed payment (a double charge), or
    # a FAILED or CANCELLED payment's (reconciliation repairs what it can).
    log.error(
        "processor payment %s of payment %s (%s) shows money moved that the "
        "payment does not account for: page",
        charge.id,
        payment_id,
        status.value,
    )
    return Result.PAGED


def pending_count(conn: Connection) -> dict:
    return one_row(conn.execute(q("pending_gateway_events")))
