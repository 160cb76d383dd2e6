"""Reconciliation's reads and writes; the SQL is in ``reconciliation.sql``."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import date, timedelta
from pathlib import Path

from psycopg import Connection

from paycron.domain.enums import Status
from paycron.domain.ids import due_range
from paycron.sql import parse_blocks
from paycron.store.partitions import day_start
from reconciliation.diff import Completion, Item, PaymentView

QUERIES = parse_blocks((Path(__file__).parent / "reconciliation.sql").read_text())
#: Ids per statement: bounds the statement's size, whatever the day's volume.
CHUNK = 1000


def load_payments(conn: Connection, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, PaymentView]:
    """The payments with these ids (missing ones are simply absent).

    Ids are grouped by the due day their time bits name, one statement per
    day bounded by that day: each touches one partition, pruned at plan time.
    """
    by_day: defaultdict[date, list[uuid.UUID]] = defaultdict(list)
    for pid in sorted(set(ids)):
        try:
            by_day[due_range(pid)[0].date()].append(pid)
        except OverflowError:  # time bits past year 9999: no payment of ours
            continue
    found: dict[uuid.UUID, PaymentView] = {}
    for day, day_ids in sorted(by_day.items()):
        bounds = {"due_from": day_start(day), "due_to": day_start(day + timedelta(days=1))}
        for i in range(0, len(day_ids), CHUNK):
            for row in conn.execute(
                QUERIES["payments_due_within"], {"ids": day_ids[i : i + CHUNK], **bounds}
            ):
                found[row["id"]] = PaymentView(
                    row["id"], Status(row["status"]), row["amount_minor"], row["currency"].strip()
                )
    return found


def completions_on(conn: Connection, day: date) -> list[Completion]:
    """Every payment success recorded by an attempt finished on ``day`` (UTC)."""
    rows = conn.execute(
        QUERIES["completions_finished_within"],
        {
            "day_from": day_start(day),
            "day_to": day_start(day + timedelta(days=1)),
            "started_from": day_start(day - timedelta(days=1)),
        },
    ).fetchall()
    return [
        Completion(r["payment_id"], r["outcome"], r["gateway_ref"], r["finished_at"]) for r in rows
    ]


def start_run(conn: Connection, day: date, *, source: str) -> dict:
    return conn.execute(QUERIES["start_run"], {"day": day, "source": source}).fetchone()


def record_items(conn: Connection, run_id: int, items: Sequence[Item]) -> None:
    if not items:
        return
    conn.execute(
        QUERIES["record_items"],
        {
            "run_id": run_id,
            "kinds": [i.kind.value for i in items],
            "payment_ids": [i.payment_id for i in items],
            "charge_ids": [i.charge_id for i in items],
            "details": [json.dumps(i.detail, sort_keys=True) for i in items],
        },
    )


def finish_run(
    conn: Connection,
    run_id: int,
    *,
    charges_seen: int,
    repaired: int,
    deferred: int,
    mismatches: int,
) -> dict:
    return conn.execute(
        QUERIES["finish_run"],
        {
            "run_id": run_id,
            "charges_seen": charges_seen,
            "repaired": repaired,
            "deferred": deferred,
            "mismatches": mismatches,
        },
    ).fetchone()
