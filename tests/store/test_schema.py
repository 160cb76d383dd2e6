"""The schema of record: migrations, partitions, plans, constraints."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from paycron.config import Config
from paycron.domain.enums import FailureReason, Outcome, Status
from paycron.domain.ids import due_range
from paycron.sql import q
from paycron.store import partitions
from paycron.store.db import connect
from paycron.store.migrate import migrate, migration_files
from tests.conftest import create_database, drop_database
from tests.factories import insert_payment


def plan_lines(conn, sql, params=None):
    return [r["QUERY PLAN"] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)]


def scanned_partitions(lines) -> set[str]:
    return {m.group(1) for line in lines if (m := re.search(r" on (payments_p\d+)", line))}


def test_a_lookup_by_id_touches_one_partition(conn):
    row = insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=3))
    due_from, due_to = due_range(row["id"])
    lines = plan_lines(
        conn,
        q("get_payment"),
        {"id": row["id"], "due_from": due_from, "due_to": due_to, "actor": "alice"},
    )
    assert scanned_partitions(lines) == {partitions.partition_name(row["due_at"].date())}


LOWEST = datetime(1, 1, 1, tzinfo=UTC)


def test_the_sweep_is_an_index_scan_that_prunes_future_partitions_at_plan_time(conn):
    """The real claim statement, with its real parameters: ``due_at <= %(now)s``
    lets the planner drop every future partition before it plans or locks
    them, so they never appear in the plan at all."""
    for days in (0, 1, 30, 200):
        insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=days, seconds=-5))
    with conn.transaction(force_rollback=True):  # EXPLAIN ANALYZE really locks the rows
        lines = plan_lines(
            conn,
            q("lock_due_fairly"),
            # the live bound at its lowest: every past day is planned (the bound's
            # own pruning of settled days: tests/store/test_live_bound.py)
            {"limit": 100, "now": datetime.now(UTC), "processor": "fake", "live_from": LOWEST},
        )
    text = "\n".join(lines)
    assert "Seq Scan" not in text, text
    # the fair sweep walks payers by the (payer, run_at) partial index
    assert re.search(r"Index (Only )?Scan using payments_p\d+_payer_run_at_idx", text), text
    today = partitions.partition_name(datetime.now(UTC).date())
    past_and_today = {
        partitions.partition_name(d)
        for d in partitions.existing_days(conn)
        if partitions.partition_name(d) <= today
    }
    # every day up to today is planned, no future day is, not even to be pruned late
    assert scanned_partitions(lines) == past_and_today, text
    assert "Subplans Removed" not in text, text


def test_migrations_are_idempotent_and_concurrent_safe():
    name = f"paycron_migrate_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        config = Config(database_url=url, horizon_days=5)
        results, errors = [], []

        def run():
            try:
                with connect(config) as c:
                    results.append(migrate(c))
                    partitions.ensure_partitions(c, config)
            except Exception as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        files = [p.name for p in migration_files()]
        assert sorted(results, key=len) == [[], [], [], files]
        with connect(config) as c:
            assert migrate(c) == []
            recorded = [r["name"] for r in c.execute("SELECT name FROM schema_migrations")]
            assert recorded == files
    finally:
        drop_database(name)


def test_partitions_cover_the_horizon_and_a_payment_at_the_horizon_inserts(conn, config):
    today = datetime.now(UTC).date()
    assert partitions.days_ahead(conn) >= config.horizon_days + config.partition_margin_days
    assert partitions.ensure_partitions(conn, config) == []  # idempotent
    edge = datetime.now(UTC) + timedelta(days=config.horizon_days)
    row = insert_payment(conn, due_at=edge)
    assert row["due_at"] == edge
    assert partitions.partition_name(today) in {
        partitions.partition_name(d) for d in partitions.existing_days(conn)
    }


def test_due_at_is_immutable(conn):
    row = insert_payment(conn)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE payments SET due_at = due_at + interval '1 hour' WHERE id = %s", (row["id"],)
        )


@pytest.mark.parametrize("amount", [0, -5])
def test_the_schema_refuses_non_positive_amounts(conn, amount):
    with pytest.raises(psycopg.errors.CheckViolation):
        insert_payment(conn, amount_minor=amount)


def test_processing_requires_a_lease_and_failed_a_reason(conn):
    with pytest.raises(psycopg.errors.CheckViolation):
        insert_payment(conn, status="PROCESSING", lease_until=None)
    with pytest.raises(psycopg.errors.CheckViolation):
        insert_payment(conn, status="FAILED", failure_reason=None)


def _check_values(conn, table, column):
    rows = conn.execute(
        "SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c "
        "JOIN pg_class t ON t.oid = c.conrelid WHERE t.relname = %s AND c.contype = 'c'",
        (table,),
    ).fetchall()
    for row in rows:
        if f"({column} = ANY" in row["def"] or f"({column})::text = ANY" in row["def"]:
            return set(re.findall(r"'(\w+)'::text", row["def"]))
    raise AssertionError(f"no CHECK on {table}.{column}")


def test_check_constraints_mirror_the_enums(conn):
    assert _check_values(conn, "payments", "status") == {s.value for s in Status}
    assert _check_values(conn, "payments", "failure_reason") == {r.value for r in FailureReason}
    assert _check_values(conn, "attempts", "outcome") == {o.value for o in Outcome}
