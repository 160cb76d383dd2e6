"""Health figures read from the database, for ``paycron stats`` (the demo's
and the benchmarks' own figures are in ``devtools.stats``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from paycron.sql import q
from paycron.store.db import Connection, one_row


def lateness(conn: Connection, *, since: datetime) -> dict:
    """Trigger lateness p50/p99/max in seconds over first attempts since ``since``."""
    return one_row(conn.execute(q("lateness"), {"since": since}))


def health(
    conn: Connection, *, window: timedelta = timedelta(hours=1), processor: str = "fake"
) -> dict:
    """``other_processor``: due payments first called at another processor
    than ``processor`` (the configured one), which are never claimed here."""
    now = datetime.now(UTC)
    since = now - window
    return {
        **one_row(conn.execute(q("health"), {"since": since, "now": now, "processor": processor})),
        "lateness": lateness(conn, since=since),
    }
