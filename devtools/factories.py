"""Rows written directly, bypassing the API's time rules: the tests seed
states with them and the benchmarks load volume."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from paycron.domain.ids import new_payment_id


def insert_payment(
    conn,
    *,
    payer: str = "alice",
    due_at: datetime | None = None,
    amount_minor: int = 2500,
    status: str = "PENDING",
    payment_method: str | None = None,
    customer: str | None = None,
    **columns,
) -> dict:
    """One payment row in any state; ``payment_method`` and ``customer`` are
    the processor's tokens (Stripe ``pm_…``, ``cus_…``; none for the fake).
    The customer is not bound to the payer (``customers``): that is the API's."""
    due_at = due_at or datetime.now(UTC) - timedelta(seconds=1)
    row = {
        "id": new_payment_id(due_at),
        "due_at": due_at,
        "payer": payer,
        "payee": "shop",
        "amount_minor": amount_minor,
        "currency": "USD",
        "run_at": due_at,
        "status": status,
        "payment_method": payment_method,
        "customer": customer,
    }
    if status == "PROCESSING":
        row.setdefault("lease_until", datetime.now(UTC) + timedelta(minutes=2))
    if status == "FAILED":
        row.setdefault("failure_reason", "DECLINED")
    row.update(columns)
    cols = ", ".join(row)
    values = ", ".join(f"%({c})s" for c in row)
    return conn.execute(
        f"INSERT INTO payments ({cols}) VALUES ({values}) RETURNING *", row
    ).fetchone()


def bulk_insert(
    conn,
    n: int,
    *,
    due_at: datetime | None = None,
    payer: str = "alice",
    amount_minor: int | None = None,
    payment_method: str | None = None,
    customer: str | None = None,
) -> None:
    """``n`` PENDING payments due at ``due_at`` (default: just now), by COPY."""
    due_at = due_at or datetime.now(UTC) - timedelta(seconds=2)
    with conn.cursor().copy(
        "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at, "
        "payment_method, customer) FROM STDIN"
    ) as copy:
        for i in range(n):
            due = due_at - timedelta(microseconds=i)
            amount = amount_minor or 100 + i % 10_000
            copy.write_row(
                (
                    new_payment_id(due),
                    due,
                    payer,
                    "shop",
                    amount,
                    "USD",
                    due,
                    payment_method,
                    customer,
                )
            )


def insert_event(
    conn, payer: str = "alice", type: str = "payment.created", status: str = "PENDING"
) -> int:
    """One payment_events row, committed unless ``conn`` is in a transaction."""
    return conn.execute(
        "INSERT INTO payment_events (payment_id, payer, type, status, attempt)"
        " VALUES (%s, %s, %s, %s, 0) RETURNING id",
        (uuid.uuid4(), payer, type, status),
    ).fetchone()["id"]
