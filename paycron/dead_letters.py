"""The dead-letter table: parked payments and what a human does with them.

Re-drive first asks the gateway by reference (it may forget idempotency
keys after 24 h): a charge found completes the payment; otherwise it goes
back to PENDING with a fresh budget and the same key. Refund goes through
the gateway keyed ``refund:<payment id>``. Every action records who and when.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from psycopg import Connection

from paycron import transitions
from paycron.enums import Outcome, Resolution
from paycron.errors import DeadLetterActionRefused, NotFound
from paycron.gateway_client import Gateway
from paycron.ids import due_range
from paycron.payments import get_payment
from paycron.sql import q


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
            f"the dead letter is already resolved ({letters[0]['resolution']})")
    return letters[0]


def redrive(conn: Connection, gateway: Gateway, payment_id: uuid.UUID, *,
            actor: str) -> ActionResult:
    _open_letter(conn, payment_id)
    charge = gateway.find_charge(str(payment_id))
    if charge is not None:
        if transitions.complete_from_gateway(conn, payment_id, outcome=Outcome.FOUND_BY_LOOKUP,
                                             gateway_ref=charge.id, actor=actor):
            return ActionResult(payment_id, "completed",
                                f"the gateway already holds charge {charge.id}")
        raise DeadLetterActionRefused("the payment changed state; look again")
    if not transitions.redrive(conn, payment_id, actor=actor):
        raise DeadLetterActionRefused("only RETRIES_EXHAUSTED and LEASE_EXPIRED_REPEATEDLY "
                                      "payments can be re-driven")
    return ActionResult(payment_id, "redriven", "back to PENDING with a fresh budget")


def refund(conn: Connection, gateway: Gateway, payment_id: uuid.UUID, *,
           actor: str) -> ActionResult:
    """Refund the payment's charge (if the gateway holds one) and close its letter."""
    _open_letter(conn, payment_id)
    charge = gateway.find_charge(str(payment_id))
    if charge is None:
        raise DeadLetterActionRefused("the gateway holds no charge for this payment: "
                                      "dismiss it instead")
    key = f"refund:{payment_id}"
    answer = gateway.refund(charge_id=charge.id, idempotency_key=key)
    due_from, due_to = due_range(payment_id)
    with conn.transaction():
        conn.execute(q("record_refund"), {
            "id": payment_id, "due_from": due_from, "due_to": due_to, "gateway_key": key,
            "charge_id": charge.id, "gateway_refund_id": answer["id"],
            "amount_minor": answer.get("amount", charge.amount), "actor": actor,
        })
        conn.execute(q("resolve_dead_letter"), {
            "id": payment_id, "resolution": Resolution.REFUNDED, "actor": actor,
            "note": f"refund {answer['id']} of charge {charge.id}",
        })
    return ActionResult(payment_id, "refunded", f"refund {answer['id']} of charge {charge.id}")


def dismiss(conn: Connection, payment_id: uuid.UUID, *, actor: str,
            note: str | None = None) -> ActionResult:
    _open_letter(conn, payment_id)
    conn.execute(q("resolve_dead_letter"), {
        "id": payment_id, "resolution": Resolution.DISMISSED, "actor": actor, "note": note,
    })
    return ActionResult(payment_id, "dismissed", note or "")
