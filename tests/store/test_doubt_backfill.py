"""The migration for rows already in doubt (docs/money-safety.md, "A doubt
without a bound is never conclusive"): payments parked or waiting in doubt
from before the in-flight bound was recorded get a bound, the time their
doubt began, and the processor that saw their calls. Applied to a database
migrated to the step before it, on real Postgres."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta

import pytest

from paycron.config import Config
from paycron.domain.ids import new_payment_id
from paycron.store import partitions
from paycron.store.db import connect
from paycron.store.migrate import migrate, migration_files
from tests.conftest import RUN_ID, create_database, drop_database

BACKFILL = "012_doubt_backfill.sql"


@pytest.fixture
def before_backfill(tmp_path):
    name = f"paycron_test_{RUN_ID}_backfill"
    url = create_database(name)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for path in migration_files():
        if path.name < BACKFILL:
            shutil.copy(path, earlier / path.name)
    config = Config(database_url=url)
    try:
        with connect(config) as conn:
            migrate(conn, earlier)
            partitions.ensure_partitions(conn, config)
            yield conn
    finally:
        drop_database(name)


def old_row(conn, *, in_doubt: bool, started: list[datetime], status="FAILED") -> dict:
    due_at = datetime.now(UTC) - timedelta(seconds=1)  # in a partition ensure_partitions made
    pid = new_payment_id(due_at)
    conn.execute(
        "INSERT INTO payments (id, due_at, payer, payee, amount_minor, currency, run_at, status, "
        "failure_reason, in_doubt, attempt) VALUES (%s, %s, 'alice', 'shop', 2500, 'USD', %s, "
        "%s, %s, %s, %s)",
        (
            pid,
            due_at,
            due_at,
            status,
            "RETRIES_EXHAUSTED" if status == "FAILED" else None,
            in_doubt,
            len(started),
        ),
    )
    for n, at in enumerate(started, start=1):
        conn.execute(
            "INSERT INTO attempts (payment_id, attempt, gateway_key, started_at, outcome, "
            "worker, due_at) VALUES (%s, %s, %s, %s, 'AMBIGUOUS', 'w', %s)",
            (pid, n, str(pid), at, due_at),
        )
    return {"id": pid, "due_at": due_at}


def test_rows_in_doubt_get_their_bound_their_start_and_their_processor(before_backfill):
    conn = before_backfill
    first, last = datetime.now(UTC) - timedelta(hours=30), datetime.now(UTC) - timedelta(hours=29)
    doubt = old_row(conn, in_doubt=True, started=[first, last])
    settled = old_row(conn, in_doubt=False, started=[first])
    never_called = old_row(conn, in_doubt=False, started=[], status="PENDING")
    assert migrate(conn) == [p.name for p in migration_files() if p.name >= BACKFILL]
    rows = {
        r["id"]: r
        for r in conn.execute(
            "SELECT id, calls_land_by, in_doubt_since, processor FROM payments"
        ).fetchall()
    }
    after = rows[doubt["id"]]
    # the bound: the last call's start + the longest in-flight bound the
    # settings allow by default, and more (a row of unknown settings)
    assert after["calls_land_by"] >= last + timedelta(hours=1)
    assert after["in_doubt_since"] == first
    assert after["processor"] == "fake"
    assert rows[settled["id"]]["processor"] == "fake"
    assert rows[settled["id"]]["calls_land_by"] is None  # not in doubt: nothing to bound
    assert rows[never_called["id"]]["processor"] is None  # never called anywhere
    attempts = conn.execute("SELECT DISTINCT processor FROM attempts").fetchall()
    assert [a["processor"] for a in attempts] == ["fake"]
