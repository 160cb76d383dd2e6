"""The dead-letter table: parked payments and what a human does with them.

Re-drive first asks the processor by reference (it may forget idempotency
keys after 24 h; docs/design.md): *charged* completes the payment; a conclusive
*none* sends it back to PENDING with a fresh budget and the next key
generation; anything else is refused with the reason (and, for an
inconclusive *none*, the time it becomes conclusive). Refund goes through
the processor keyed from what it refunds. Every action records who and when.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from paycron.config import Config
from paycron.domain.enums import Outcome, Resolution, Status
from paycron.domain.ids import due_range
from paycron.domain.policy import Answer, Lookup
from paycron.engine import lookups
from paycron.errors import DeadLetterActionRefused, NotFound, OtherProcessor
from paycron.processors.base import Processor
from paycron.sql import q
from paycron.store import transitions
from paycron.store.clock import database_now
from paycron.store.db import Connection
from paycron.store.payments import get_payment


@dataclass(frozen=True)
class ActionResult:
    payment_id: uuid.UUID
    action: str
    detail: str


def list_open(conn: Connection, *, limit: int = 100) -> list[dict]:
    return conn.execute(q("open_dead_letters"), {"limit": limit}).fetchall()


def show(conn: Connection, payment_id: uuid.UUID) -> dict:
    """The payment with its attempts and every dead letter it had."""
    payment = get_payment(conn, payment_id, actor=None)
    letters = conn.execute(q("dead_letters_of"), {"id": payment_id}).fetchall()
    if payment is None or not letters:
        raise NotFound("no dead letter for this payment")
    return {"payment": payment, "dead_letters": letters}


def _open_letter(conn: Connection, payment_id: uuid.UUID) -> dict:
    letters = show(conn, payment_id)["dead_letters"]
    if letters[0]["resolution"] is not None:
        raise DeadLetterActionRefused(
            f"the dead letter is already resolved ({letters[0]['resolution']})"
        )
    return letters[0]


def redrive(
    conn: Connection,
    gateway: Processor,
    payment_id: uuid.UUID,
    *,
    actor: str,
    poll_seconds: float = Config.gateway_poll_seconds,
) -> ActionResult:
    letter = _open_letter(conn, payment_id)
    payment = get_payment(conn, payment_id, actor=None, with_attempts=False)
    assert payment is not None  # it has an open dead letter
    lookup = _ask(conn, gateway, payment)
    if lookup.answer is Answer.CHARGED:
        if transitions.complete_from_gateway(
            conn,
            payment_id,
            outcome=Outcome.FOUND_BY_LOOKUP,
            gateway_ref=lookup.found.id,
            actor=actor,
        ):
            return ActionResult(
                payment_id, "completed", f"the processor already holds charge {lookup.found.id}"
            )
        raise DeadLetterActionRefused("the payment changed state; look again")
    if lookup.answer is Answer.MISMATCHED:
        raise DeadLetterActionRefused(
            f"the processor holds {lookup.found.id} for this payment with another amount, "
            "currency or customer: look at it there; never re-driven under a new key"
        )
    if lookup.answer is Answer.PROCESSING:
        if transitions.await_from_lookup(
            conn, payment_id, intent=lookup.found.id, actor=actor, poll_seconds=poll_seconds
        ):
            return ActionResult(
                payment_id,
                "awaiting_gateway",
                f"the processor is processing {lookup.found.id}: it waits for its outcome",
            )
        raise DeadLetterActionRefused("the payment changed state; look again")
    if not lookup.conclusive:
        at = lookups.conclusive_at(payment)
        if at is None:
            raise DeadLetterActionRefused(
                "the time until which a call of this payment may still land is not known "
                "(no in-flight bound recorded): run the migrations, then re-drive"
            )
        raise DeadLetterActionRefused(
            f"a call of this payment may still land at the processor until "
            f"{at.isoformat()}: re-drive after that"
        )
    if letter["reason"] not in REDRIVABLE or not transitions.redrive(
        conn, payment_id, actor=actor, processor=gateway.name
    ):
        raise DeadLetterActionRefused(
            "only RETRIES_EXHAUSTED and LEASE_EXPIRED_REPEATEDLY payments can be re-driven"
        )
    return ActionResult(
        payment_id, "redriven", "back to PENDING with a fresh budget and a new idempotency key"
    )


def _ask(conn: Connection, gateway: Processor, payment: dict) -> Lookup:
    """The lookup a human action stands on (judged on the database's clock);
    refused, not guessed, when this process is configured for another
    processor than the payment's."""
    try:
        return lookups.ask_processor(gateway, payment, now=database_now(conn))
    except OtherProcessor as exc:
        raise DeadLetterActionRefused(str(exc)) from None


#: What a re-drive may send back: a decline or a mismatch needs a human elsewhere.
REDRIVABLE = frozenset({"RETRIES_EXHAUSTED", "LEASE_EXPIRED_REPEATEDLY"})


def refund(
    conn: Connection,
    gateway: Processor,
    payment_id: uuid.UUID,
    *,
    actor: str,
    poll_seconds: float = Config.gateway_poll_seconds,
) -> ActionResult:
    """Refund the payment's charge (if the processor holds one) and close its
    letter; a charge the processor is still processing is waited for
    (AWAITING_GATEWAY), not dismissed."""
    _open_letter(conn, payment_id)
    payment = get_payment(conn, payment_id, actor=None, with_attempts=False)
    assert payment is not None  # it has an open dead letter
    if payment["status"] == Status.AWAITING_GATEWAY:
        raise DeadLetterActionRefused(
            "the payment waits for the processor's outcome: nothing to refund yet"
        )
    lookup = _ask(conn, gateway, payment)
    if lookup.answer is Answer.PROCESSING:
        # A debit still processing (a payment parked in doubt): it waits for
        # the processor's outcome like any other, polled until it settles.
        if transitions.await_from_lookup(
            conn, payment_id, intent=lookup.found.id, actor=actor, poll_seconds=poll_seconds
        ):
            return ActionResult(
                payment_id,
                "awaiting_gateway",
                f"the processor is still processing {lookup.found.id}: nothing to refund "
                "yet; the payment waits for its outcome",
            )
        raise DeadLetterActionRefused("the payment changed state; look again")
    if lookup.answer is Answer.NONE and not lookup.conclusive:
        raise DeadLetterActionRefused(
            "the processor holds no charge for this payment yet, but a call of it may "
            "still land: look again later"
        )
    if lookup.answer is not Answer.CHARGED:
        raise DeadLetterActionRefused(
            "the processor holds no charge for this payment "
            f"({lookup.answer.value}): dismiss it instead"
        )
    charge = lookup.found
    answer = gateway.refund(charge)
    due_from, due_to = due_range(payment_id)
    with conn.transaction():
        conn.execute(
            q("record_refund"),
            {
                "id": payment_id,
                "due_from": due_from,
                "due_to": due_to,
                "gateway_key": answer.idempotency_key,
                "charge_id": charge.id,
                "gateway_refund_id": answer.id,
                "amount_minor": answer.amount,
                "actor": actor,
            },
        )
        conn.execute(
            q("resolve_dead_letter"),
            {
                "id": payment_id,
                "resolution": Resolution.REFUNDED,
                "actor": actor,
                "note": f"refund {answer.id} of charge {charge.id}",
            },
        )
    return ActionResult(payment_id, "refunded", f"refund {answer.id} of charge {charge.id}")


def dismiss(
    conn: Connection, payment_id: uuid.UUID, *, actor: str, note: str | None = None
) -> ActionResult:
    _open_letter(conn, payment_id)
    conn.execute(
        q("resolve_dead_letter"),
        {
            "id": payment_id,
            "resolution": Resolution.DISMISSED,
            "actor": actor,
            "note": note,
        },
    )
    return ActionResult(payment_id, "dismissed", note or "")
