"""Every status transition of a payment: one conditional UPDATE each.

Losing a race is not an exception: each function returns a typed result
that says what happened. The SQL is in ``transitions.sql``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from psycopg import Connection

from paycron.enums import Status
from paycron.errors import CancelRefused, NotFound
from paycron.ids import due_range
from paycron.payments import get_payment
from paycron.sql import q

#: Why a cancel lost, by the status it found.
_CANCEL_REFUSALS = {
    Status.PROCESSING: "ALREADY_PROCESSING",
    Status.COMPLETED: "ALREADY_COMPLETED",
    Status.FAILED: "ALREADY_FAILED",
}
#: A lost CAS re-reads the row; a row seen back at PENDING (a retry) is tried again.
_CANCEL_TRIES = 3


@dataclass(frozen=True)
class Claim:
    """One claimed payment: the message a worker receives."""

    payment_id: uuid.UUID
    due_at: datetime
    attempt: int


def cancel(conn: Connection, payment_id: uuid.UUID, *, actor: str) -> None:
    """PENDING -> CANCELLED by CAS; idempotent when already cancelled.

    Raises :class:`NotFound` (also for another payer's payment) or
    :class:`CancelRefused` carrying the stable code of why it lost.
    """
    due_from, due_to = due_range(payment_id)
    params = {"id": payment_id, "due_from": due_from, "due_to": due_to, "actor": actor}
    for _ in range(_CANCEL_TRIES):
        if conn.execute(q("cancel"), params).fetchone() is not None:
            return
        # Lost, or nothing to cancel: a fresh statement sees the winner's commit.
        row = get_payment(conn, payment_id, actor=actor, with_attempts=False)
        if row is None:
            raise NotFound("no such payment")
        status = Status(row["status"])
        if status is Status.CANCELLED:
            return
        if status is Status.PENDING and row["in_doubt"]:
            raise CancelRefused("OUTCOME_IN_DOUBT", status)
        if status is not Status.PENDING:
            raise CancelRefused(_CANCEL_REFUSALS[status], status)
    raise CancelRefused("ALREADY_PROCESSING", Status.PROCESSING)


def claim_due(conn: Connection, *, limit: int, lease_seconds: float) -> list[Claim]:
    """PENDING -> PROCESSING for up to ``limit`` due rows (lease, attempt + 1)."""
    rows = conn.execute(
        q("claim_due"), {"limit": limit, "lease_seconds": lease_seconds}, prepare=True
    ).fetchall()
    return [Claim(r["id"], r["due_at"], r["attempt"]) for r in rows]
