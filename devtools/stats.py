"""Figures the demo and the benchmarks read back from the database (the
statements in ``stats.sql`` beside this file)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from psycopg import Connection

from paycron.sql import parse_blocks

QUERIES = parse_blocks((Path(__file__).parent / "stats.sql").read_text())


def status_counts(conn: Connection) -> dict[str, int]:
    return {r["status"]: r["n"] for r in conn.execute(QUERIES["status_counts"])}


def outcome_summary(conn: Connection) -> dict:
    return conn.execute(QUERIES["outcome_summary"]).fetchone()


def debit_summary(conn: Connection) -> dict:
    """{debits, settled_by_event, settled_by_poll}: payments that waited for
    the processor, and who learned how each settled."""
    return conn.execute(QUERIES["debit_summary"]).fetchone()


def open_payments(conn: Connection, *, until: datetime) -> int:
    """Payments not yet terminal among those due before ``until``."""
    return conn.execute(QUERIES["open_payments"], {"until": until}).fetchone()["n"]


def settled_counts(conn: Connection, *, until: datetime) -> dict:
    """{completed, lease_expired} among payments due before ``until``."""
    return conn.execute(QUERIES["settled_counts"], {"until": until}).fetchone()
