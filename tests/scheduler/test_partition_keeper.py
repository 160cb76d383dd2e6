"""Partition upkeep: the horizon is covered; only settled old days detach."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from paycron.store import partitions
from paycron.store.db import make_pool
from scheduler.partition_keeper import PartitionKeeper
from tests.factories import insert_payment, park


@pytest.fixture
def old_days(conn):
    """Three day partitions 100-102 days old; dropped again after the test."""
    today = datetime.now(UTC).date()
    days = [today - timedelta(days=n) for n in (100, 101, 102)]
    for day in days:
        conn.execute(partitions._formatted("create_partition", day))
    yield days
    for day in days:
        conn.execute(f"DROP TABLE IF EXISTS {partitions.partition_name(day)}")


def at_noon(day):
    return datetime(day.year, day.month, day.day, 12, tzinfo=UTC)


def test_only_fully_settled_old_partitions_are_detached(conn, config, old_days):
    settled, pending, processing = old_days
    insert_payment(conn, due_at=at_noon(settled), status="COMPLETED")
    insert_payment(conn, due_at=at_noon(settled), status="CANCELLED")
    insert_payment(conn, due_at=at_noon(pending), status="COMPLETED")
    insert_payment(conn, due_at=at_noon(pending), status="PENDING")
    insert_payment(conn, due_at=at_noon(processing), status="PROCESSING")
    pool = make_pool(config, name="keeper-test")
    try:
        counts = PartitionKeeper(config=config, pool=pool).run_once()
    finally:
        pool.close()
    have = {partitions.partition_name(d) for d in partitions.existing_days(conn)}
    assert partitions.partition_name(settled) not in have
    assert partitions.partition_name(pending) in have
    assert partitions.partition_name(processing) in have
    assert counts.detached == 1
    assert counts.days_ahead >= config.horizon_days


def test_detached_days_forget_their_idempotency_keys_and_only_theirs(conn, config, old_days):
    settled, pending, _ = old_days
    live_old = insert_payment(conn, due_at=at_noon(pending), status="PENDING")
    recent = insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=1))
    gone = [
        insert_payment(conn, due_at=at_noon(settled), status="COMPLETED"),
        insert_payment(conn, due_at=at_noon(settled) + timedelta(hours=11), status="COMPLETED"),
    ]
    keys = [(r["id"], r["due_at"]) for r in (live_old, recent, *gone)]
    # a day detached by an earlier run whose cleanup was cut short
    keys.append((uuid.uuid4(), at_noon(settled - timedelta(days=50))))
    for payment_id, due_at in keys:
        conn.execute(
            "INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, "
            "due_at) VALUES ('alice', %s, '\\x00', %s, %s)",
            (str(payment_id), payment_id, due_at),
        )
    assert partitions.partition_name(settled) in partitions.detach_settled(conn, config)
    left = {r["payment_id"] for r in conn.execute("SELECT payment_id FROM idempotency_keys")}
    assert left == {live_old["id"], recent["id"]}


def test_an_open_dead_letter_keeps_its_partition(conn, config, old_days):
    day = old_days[0]
    park(conn, due_at=at_noon(day))
    assert partitions.detach_settled(conn, config) == [
        partitions.partition_name(d) for d in sorted(old_days[1:])
    ]
    assert day in partitions.existing_days(conn)


def test_ensure_creates_missing_days_and_reports_days_ahead(conn, config):
    last = max(partitions.existing_days(conn))
    conn.execute(f"DROP TABLE {partitions.partition_name(last)}")
    assert partitions.ensure_partitions(conn, config) == [partitions.partition_name(last)]
    assert partitions.days_ahead(conn) == config.horizon_days + config.partition_margin_days
