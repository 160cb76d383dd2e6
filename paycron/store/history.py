"""The per-minute history (``history_minutes``) the console's charts read,
rolled up from attempts and dead letters (docs/console.md, "History").

A minute's row is recomputed whole from its sources and written with an
upsert that replaces the row, so rolling a minute again never double
counts, and a roller that dies mid-batch leaves either the old rows or the
new ones (one transaction per batch). A minute is rolled when it has ended
and once more when it has *settled* (its calls' outcomes written: see
:data:`DEFAULT_SETTLE`); rows older than the retention are deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.types.json import Jsonb

from paycron.sql import q
from paycron.store.db import Connection, one_row

#: Lateness bucket edges in seconds: the ``paycron_trigger_lateness_seconds``
#: histogram's up to 15 minutes (and the overview's picture's).
LATENESS_EDGES = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900)
#: Rows kept: the console's longest range (7 days) and a day to spare.
DEFAULT_RETENTION = timedelta(days=8)
#: A minute is final once this long past its end: a call outlives its
#: lease by no more (the default lease is 2 minutes, the reaper marks an
#: expired one within the next sweep), so its outcome is written by then.
DEFAULT_SETTLE = timedelta(minutes=5)
#: Minutes recomputed in one transaction: a backfill of the whole
#: retention is 192 short transactions, none holding a lock for long.
DEFAULT_BATCH_MINUTES = 60
MINUTE = timedelta(minutes=1)


def floor_minute(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


@dataclass
class RollupCounts:
    batches: int = 0
    minutes: int = 0
    pruned: int = 0
    skipped: bool = False  # another roller held the lock


def clock(conn: Connection) -> datetime:
    return one_row(conn.execute(q("history_clock")))["now"]


def first_pending(
    conn: Connection, *, since: datetime, until: datetime, settle: timedelta
) -> datetime | None:
    """The oldest minute in [since, until) with no row, or rolled before it settled."""
    row = conn.execute(
        q("history_first_pending"),
        {"since": since, "until": until, "settle_seconds": settle.total_seconds()},
    ).fetchone()
    return None if row is None else row["minute"]


def compute(conn: Connection, *, since: datetime, until: datetime) -> list[dict]:
    """Every minute of [since, until) (``since`` and ``until`` on minute
    boundaries) as its ``history_minutes`` row, zeros included: a minute
    with nothing in it is known to have had nothing."""
    rows: dict[datetime, dict] = {}
    minute = since
    while minute < until:
        rows[minute] = {
            "minute": minute.isoformat(),
            "attempts": 0,
            "first_attempts": 0,
            "finished": 0,
            "completed": 0,
            "processor_errors": 0,
            "buckets": [0] * (len(LATENESS_EDGES) + 1),
            "lateness_sum_seconds": 0.0,
            "dead_letters": 0,
        }
        minute += MINUTE
    params = {"since": since, "until": until}
    for part in conn.execute(
        q("history_attempts_by_minute"), {**params, "edges": [float(e) for e in LATENESS_EDGES]}
    ):
        row = rows[part["minute"]]
        for name in ("attempts", "finished", "completed", "processor_errors"):
            row[name] += part[name]
        row["lateness_sum_seconds"] += part["lateness_sum_seconds"]
        if part["bucket"] is not None:
            row["first_attempts"] += part["attempts"]
            row["buckets"][part["bucket"]] += part["attempts"]
    for part in conn.execute(q("history_dead_letters_by_minute"), params):
        rows[part["minute"]]["dead_letters"] += part["n"]
    return list(rows.values())


def roll_up(conn: Connection, *, since: datetime, until: datetime) -> int | None:
    """Recompute and replace the rows of [since, until) in one transaction;
    None (nothing done) when another roller holds the lock."""
    with conn.transaction():
        if not one_row(conn.execute(q("history_try_lock")))["held"]:
            return None
        rows = compute(conn, since=since, until=until)
        conn.execute(q("history_upsert"), {"rows": Jsonb(rows)})
    return len(rows)


def prune(conn: Connection, *, before: datetime) -> int:
    return conn.execute(q("history_prune"), {"before": before}).rowcount


def roll_up_pending(
    conn: Connection,
    *,
    retention: timedelta = DEFAULT_RETENTION,
    settle: timedelta = DEFAULT_SETTLE,
    batch_minutes: int = DEFAULT_BATCH_MINUTES,
    now: datetime | None = None,
) -> RollupCounts:
    """Roll up every minute of the retention that has ended and needs it,
    oldest first, a batch a transaction, then delete what the retention
    no longer keeps. ``now`` defaults to the database's clock."""
    counts = RollupCounts()
    until = floor_minute(now or clock(conn))  # the minute running now is not over
    since = until - retention
    # Each search starts where the last batch ended, so a run ends even when
    # a minute it rolled still counts as unsettled (it is redone next run).
    start = since
    while (first := first_pending(conn, since=start, until=until, settle=settle)) is not None:
        start = min(first + batch_minutes * MINUTE, until)
        done = roll_up(conn, since=first, until=start)
        if done is None:
            counts.skipped = True
            break
        counts.batches += 1
        counts.minutes += done
    counts.pruned = prune(conn, before=since)
    return counts
