"""Rows the tests seed: the shared factories (``devtools.factories``, which
the benchmarks use too) and the states only tests set up."""

from __future__ import annotations

from datetime import datetime, timedelta

from devtools.factories import bulk_insert, insert_event, insert_payment

__all__ = [
    "add_attempt",
    "add_dead_letter",
    "bulk_insert",
    "insert_event",
    "insert_payment",
    "park",
]


def park(
    conn, *, reason: str = "RETRIES_EXHAUSTED", last_error: str | None = "http_503", **columns
) -> dict:
    """A payment parked as the executor parks one: FAILED after its six
    calls, with an open dead letter for a human."""
    columns.setdefault("attempt", 6)
    columns.setdefault("failures", 6)
    row = insert_payment(conn, status="FAILED", failure_reason=reason, **columns)
    add_dead_letter(conn, row, reason=reason, last_error=last_error)
    return row


def add_dead_letter(
    conn, row: dict, *, reason: str = "RETRIES_EXHAUSTED", last_error: str | None = None
) -> None:
    """An open dead letter for payment ``row``, as the executor writes one."""
    conn.execute(
        "INSERT INTO dead_letters (payment_id, due_at, payer, reason, last_error) "
        "VALUES (%s, %s, %s, %s, %s)",
        (row["id"], row["due_at"], row["payer"], reason, last_error),
    )


def add_attempt(
    conn,
    row: dict,
    *,
    attempt: int,
    outcome: str,
    finished_at: datetime,
    gateway_ref: str | None = None,
    error_code: str | None = None,
) -> None:
    """A finished attempt row of payment ``row`` (its call took 80 ms)."""
    conn.execute(
        "INSERT INTO attempts (payment_id, attempt, gateway_key, started_at, finished_at, "
        "outcome, gateway_ref, error_code, worker, due_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'w', %s)",
        (
            row["id"],
            attempt,
            str(row["id"]),
            finished_at - timedelta(milliseconds=80),
            finished_at,
            outcome,
            gateway_ref,
            error_code,
            row["due_at"],
        ),
    )
