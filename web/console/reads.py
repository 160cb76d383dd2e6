"""What the console's pages read: bounded, indexed queries (``console.sql``)
and the domain's own reads where one fits (``paycron.store.stats``,
``paycron.store.payments``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

from psycopg import Connection

from paycron.domain.ids import due_range
from paycron.sql import parse_blocks, q
from paycron.store import partitions, payments, stats
from paycron.store.partitions import day_start

QUERIES = parse_blocks((Path(__file__).parent / "console.sql").read_text())

#: Rows on one page of every list.
PAGE = 50
#: A status search over one due day reads at most this many rows a page (a
#: few ms from the day's primary key) and shows the matches among them, so
#: a rare status costs what a common one does; the page may then be short.
DAY_SCAN = 2000
#: The lateness picture's bucket edges, in seconds (those of the
#: paycron_trigger_lateness_seconds histogram, up to 15 minutes).
LATENESS_EDGES = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900)
#: A webhook endpoint's backlog is counted up to this many events ("1000+").
BACKLOG_CAP = 1000
#: The overview's pictures cover this much time, minute by minute.
WINDOW = timedelta(hours=1)
#: Sorts before every real (created_at, id): the keyset start of page one.
_START_ID = uuid.UUID(int=0)
_EPOCH_MS = timedelta(milliseconds=1)


def id_floor(when: datetime) -> uuid.UUID:
    """The smallest payment id due at ``when``'s millisecond or later: ids
    carry their due time in their leading 48 bits (``paycron.domain.ids``)."""
    millis = (when - datetime(1970, 1, 1, tzinfo=when.tzinfo)) // _EPOCH_MS
    return uuid.UUID(int=max(0, millis) << 80)


# -- overview -----------------------------------------------------------------


@dataclass(frozen=True)
class Overview:
    read_at: datetime
    health: dict
    partitions_ahead: int
    circuit: str
    lateness_buckets: list[int]  # one count per bucket, len(LATENESS_EDGES) + 1
    claims: list[int]  # per minute of the window, oldest first
    due: list[int]


def _per_minute(rows, minutes: int) -> list[int]:
    counts = [0] * minutes
    for row in rows:
        if 0 <= row["minute"] < minutes:
            counts[row["minute"]] += row["n"]
    return counts


def read_overview(
    conn: Connection, *, now: datetime, circuit: Callable[[], str], processor: str = "fake"
) -> Overview:
    """The health numbers of ``paycron stats``, the circuit's state and the
    pictures' series over the last hour."""
    since, minutes = now - WINDOW, int(WINDOW.total_seconds() // 60)
    buckets = [0] * (len(LATENESS_EDGES) + 1)
    for row in conn.execute(
        QUERIES["lateness_histogram"],
        {"edges": [float(e) for e in LATENESS_EDGES], "since": since, "until": now},
    ):
        buckets[row["bucket"]] += row["n"]
    claims = conn.execute(QUERIES["claims_per_minute"], {"since": since, "until": now})
    due = conn.execute(
        QUERIES["due_per_minute"],
        {"since": since, "until": now, "id_from": id_floor(since), "id_to": id_floor(now)},
    )
    try:
        state = circuit()
    except Exception:  # Redis down: the page still shows what Postgres says
        state = "unknown"
    return Overview(
        read_at=now,
        health=stats.health(conn, window=WINDOW, processor=processor),
        partitions_ahead=partitions.days_ahead(conn, now.date()),
        circuit=state,
        lateness_buckets=buckets,
        claims=_per_minute(claims, minutes),
        due=_per_minute(due, minutes),
    )


class Cached:
    """One read answers every caller for ``ttl`` seconds (concurrent callers
    wait for it): operators refreshing the overview cost one read per
    interval, whatever their number."""

    def __init__(
        self,
        read: Callable[[], object],
        *,
        ttl: float,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._read, self._ttl, self._monotonic = read, ttl, monotonic
        self._lock = threading.Lock()
        self._value: tuple[float, object] | None = None

    def get(self):
        with self._lock:
            now = self._monotonic()
            if self._value is None or not 0 <= now - self._value[0] < self._ttl:
                self._value = (now, self._read())
            return self._value[1]


# -- payments -------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    rows: list[dict]
    next_cursor: str | None
    scanned: int | None = None  # rows read to find them, when that differs


def payments_of_payer(
    conn: Connection,
    *,
    payer: str,
    status: str | None,
    cursor: str | None,
    limit: int | None = None,
) -> Page:
    """A payer's payments, newest first, ``limit`` (a :data:`PAGE`) at most:
    the API's own list (it rides ``idempotency_keys_list_idx``, a status
    filter reads a bounded stretch)."""
    limit = limit or PAGE
    after = None
    if cursor:
        created_at, _, payment_id = cursor.partition("_")
        after = (_aware(created_at), uuid.UUID(payment_id))
    rows, next_key = payments.list_payments(
        conn, actor=payer, status=status, limit=limit, after=after
    )
    return Page(rows, None if next_key is None else f"{next_key[0].isoformat()}_{next_key[1]}")


def payments_of_day(conn: Connection, *, day: date, status: str | None, cursor: str | None) -> Page:
    """One due day's payments in due order (see :func:`payments_due`)."""
    return payments_due(
        conn,
        due_from=day_start(day),
        due_to=day_start(day + timedelta(days=1)),
        status=status,
        cursor=cursor,
    )


def payments_due(
    conn: Connection,
    *,
    due_from: datetime,
    due_to: datetime,
    status: str | None = None,
    failure_reason: str | None = None,
    in_doubt: bool | None = None,
    processor: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> Page:
    """Payments due in [due_from, due_to) in due order, at most ``limit`` (a
    :data:`PAGE`): the matches among at most ``DAY_SCAN`` rows read
    (``limit`` rows, when that is more; all rows read, without a filter)."""
    limit = limit or PAGE
    after = uuid.UUID(cursor) if cursor else _START_ID
    filtered = any(v is not None for v in (status, failure_reason, in_doubt, processor))
    scan = max(DAY_SCAN, limit) if filtered else limit
    rows = conn.execute(
        QUERIES["payments_due"],
        {
            "due_from": due_from,
            "due_to": due_to,
            "after": after,
            "scan": scan,
            "limit": limit,
            "status": status,
            "failure_reason": failure_reason,
            "in_doubt": in_doubt,
            "processor": processor,
        },
    ).fetchall()
    scanned, last_read = rows[0]["scanned"], rows[0]["last_id"]
    found = [row for row in rows if row["id"] is not None]
    if len(found) == limit and found[-1]["id"] != last_read:
        next_cursor = str(found[-1]["id"])  # more matched than fit: go on from the last shown
    elif scanned == scan:
        next_cursor = str(last_read)  # the range goes on past what was read
    else:
        next_cursor = None
    return Page(found, next_cursor, scanned if filtered else None)


def payment_detail(conn: Connection, payment_id: uuid.UUID) -> dict | None:
    """One payment with its attempts, events, dead letters and refund."""
    payment = payments.get_payment(conn, payment_id, actor=None)
    if payment is None:
        return None
    return {
        "payment": payment,
        "events": conn.execute(QUERIES["events_of"], {"id": payment_id, "limit": 200}).fetchall(),
        "letters": conn.execute(q("dead_letters_of"), {"id": payment_id}).fetchall(),
        "refund": conn.execute(QUERIES["refund_of"], {"id": payment_id}).fetchone(),
    }


# -- dead letters and waiting payments ----------------------------------------------


_BIGINT_MAX = 2**63 - 1


def _id(text: str) -> int:
    """A row id from a cursor: a bigint, or ValueError (never Postgres's error)."""
    value = int(text)
    if not 0 <= value <= _BIGINT_MAX:
        raise ValueError("not a row id")
    return value


def _aware(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("a cursor's time has its offset")
    return value


def _letters_query(*, payer: str | None, reason: str | None) -> str:
    """The open-letter query that rides the index of the filter given."""
    if payer is not None:
        return "open_letters_of_payer"
    if reason is not None:
        return "open_letters_of_reason"
    return "open_letters_page"


def open_letters(
    conn: Connection,
    *,
    cursor: str | None,
    limit: int = PAGE,
    reason: str | None = None,
    payer: str | None = None,
    before: datetime | None = None,
    processor: str | None = None,
) -> Page:
    """A page of open dead letters, oldest first, each with its payment.
    By ``reason``, ``payer`` and parked ``before`` in the query (each rides
    an index: docs/console.md); by ``processor`` (the payment's) among the
    page read, so a page so filtered may be short: follow its cursor."""
    after_created_at, after_id = "-infinity", 0
    if cursor:
        created_at, _, letter_id = cursor.partition("_")
        after_created_at, after_id = _aware(created_at), _id(letter_id)
    letters = conn.execute(
        QUERIES[_letters_query(payer=payer, reason=reason)],
        {
            "after_created_at": after_created_at,
            "after_id": after_id,
            "limit": limit + 1,
            "payer": payer,
            "reason": reason,
            "before": before or "infinity",
        },
    ).fetchall()
    more, letters = len(letters) > limit, letters[:limit]
    found = (
        {
            row["id"]: row
            for row in conn.execute(
                QUERIES["payments_by_keys"],
                {
                    "ids": [d["payment_id"] for d in letters],
                    "due_ats": [d["due_at"] for d in letters],
                },
            )
        }
        if letters
        else {}
    )
    rows = [{**letter, "payment": found.get(letter["payment_id"])} for letter in letters]
    if processor is not None:
        rows = [r for r in rows if r["payment"] and r["payment"]["processor"] == processor]
    last = letters[-1] if letters else None
    return Page(rows, f"{last['created_at'].isoformat()}_{last['id']}" if more else None)


def waiting(conn: Connection, name: str, *, now: datetime, limit: int = PAGE) -> list[dict]:
    """``awaiting_gateway`` or ``parked_in_doubt``: oldest due first."""
    return conn.execute(QUERIES[name], {"now": now, "limit": limit}).fetchall()


# -- reconciliation and webhooks ------------------------------------------------


def reconciliation_runs(
    conn: Connection,
    *,
    cursor: str | None,
    day_before: date | None = None,
    mismatches_only: bool = False,
) -> Page:
    before = _id(cursor) if cursor else _BIGINT_MAX
    rows = conn.execute(
        QUERIES["reconciliation_runs_page"],
        {
            "before_id": before,
            "limit": PAGE + 1,
            "day_before": day_before,
            "mismatches_only": mismatches_only,
        },
    ).fetchall()
    more, rows = len(rows) > PAGE, rows[:PAGE]
    return Page(rows, str(rows[-1]["id"]) if more else None)


def reconciliation_run(
    conn: Connection, run_id: int, *, cursor: str | None
) -> tuple[dict | None, Page]:
    run = conn.execute(QUERIES["reconciliation_run"], {"id": run_id}).fetchone()
    if run is None:
        return None, Page([], None)
    items = conn.execute(
        QUERIES["reconciliation_items_page"],
        {"run_id": run_id, "after_id": _id(cursor) if cursor else 0, "limit": PAGE + 1},
    ).fetchall()
    more, items = len(items) > PAGE, items[:PAGE]
    return run, Page(items, str(items[-1]["id"]) if more else None)


def webhook_backlog(
    conn: Connection, *, cursor: str | None, payer: str | None = None, only: str | None = None
) -> Page:
    """Live endpoints by payer, each with its delivery backlog. ``payer``
    rides the list's index; ``only`` ("backlog": events waiting; "failing":
    the oldest waiting event was tried and not delivered) keeps the matches
    among the page read, so a page so filtered may be short: follow its
    cursor."""
    after = ("", "-infinity", _START_ID)
    if cursor:
        actor, created_at, endpoint_id = cursor.rsplit("_", 2)
        after = (actor, _aware(created_at), uuid.UUID(endpoint_id))
    rows = conn.execute(
        QUERIES["webhook_backlog_page"],
        {
            "after_actor": after[0],
            "after_created_at": after[1],
            "after_id": after[2],
            "count_cap": BACKLOG_CAP + 1,
            "limit": PAGE + 1,
            "payer": payer,
        },
    ).fetchall()
    more, rows = len(rows) > PAGE, rows[:PAGE]
    last = rows[-1] if rows else None
    read = len(rows)
    if only == "backlog":
        rows = [r for r in rows if r["backlog"] > 0]
    elif only == "failing":
        rows = [r for r in rows if (r["head_attempts"] or 0) > 0]
    return Page(
        rows,
        f"{last['actor']}_{last['created_at'].isoformat()}_{last['id']}" if more else None,
        read if only else None,
    )


def due_day_of(payment_id: uuid.UUID) -> date:
    return due_range(payment_id)[0].date()
