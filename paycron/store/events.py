"""The payment events outbox, read as a feed: each payer's events in
``(txid, id)`` order, resumable from any position, never skipping one whose
transaction committed late (see ``events.sql``). The API's ``/v1/events``
and the webhook relay both read it this way and send the same JSON.
"""

from __future__ import annotations

from datetime import UTC
from typing import NamedTuple

from paycron.sql import q
from paycron.store.db import Connection


class Position(NamedTuple):
    """A place in a payer's feed: the last event read (its txid and id)."""

    txid: int
    event_id: int


#: Before every event.
START = Position(0, 0)


def position_of(event: dict) -> Position:
    return Position(int(event["txid"]), event["id"])


def read_feed(conn: Connection, *, payer: str, after: Position, limit: int) -> list[dict]:
    """Up to ``limit`` of ``payer``'s events after ``after``, oldest first,
    with their data as the payer may see it (:func:`public_data`)."""
    rows = conn.execute(
        q("events_after"),
        {
            "payer": payer,
            "after_txid": str(after.txid),
            "after_id": after.event_id,
            "limit": limit,
        },
    ).fetchall()
    return [{**row, "data": public_data(row["data"])} for row in rows]


#: What payers see as ``data.by``: someone on our side acted (an operator at
#: the CLI or the admin API, or reconciliation), never their name, which the
#: audit keeps (dead_letters.resolved_by, refunds.requested_by).
OPERATOR = "operator"


def public_data(data):
    """An event's data as payers see it: who acted on our side becomes
    OPERATOR (also in rows stored before this rule)."""
    if isinstance(data, dict) and "by" in data:
        return {**data, "by": OPERATOR}
    return data


def to_wire(event: dict) -> dict:
    """An event as a webhook body carries it (the feed's shape)."""
    data = public_data(event["data"])
    return {
        "id": event["id"],
        "type": event["type"],
        "paymentId": str(event["payment_id"]),
        "status": event["status"],
        "attempt": event["attempt"],
        "data": data,
        "createdAt": event["created_at"].astimezone(UTC).isoformat(),
    }
