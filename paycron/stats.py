"""Health figures read from the database: the demo's summary and
``paycron stats``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from psycopg import Connection

from paycron.sql import q


def lateness(conn: Connection, *, since: datetime) -> dict:
    """Trigger lateness p50/p99/max in seconds over first attempts since ``since``."""
    return conn.execute(q("lateness"), {"since": since}).fetchone()


def outcome_summary(conn: Connection) -> dict:
    return conn.execute(q("outcome_summary")).fetchone()


def status_counts(conn: Connection) -> dict[str, int]:
    return {r["status"]: r["n"] for r in conn.execute(q("status_counts"))}


def health(conn: Connection, *, window: timedelta = timedelta(hours=1)) -> dict:
    now = datetime.now(UTC)
    since = now - window
    return {**conn.execute(q("health"), {"since": since, "now": now}).fetchone(),
            "lateness": lateness(conn, since=since)}
