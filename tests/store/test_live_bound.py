"""The live bound (migration 012): claims prune settled past days at plan
time, and no payment that is not terminal is ever below the bound, however
it became live (created due long ago, re-driven, awaiting the processor)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from paycron.config import Config
from paycron.store import partitions, transitions
from paycron.store.db import connect
from tests.factories import insert_payment, park

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


@pytest.fixture
def old_days(conn):
    """Five day partitions 60-64 days old (oldest first), with a settled
    payment in each; dropped again after the test, the bound reset to its
    always-safe value (the lowest there is)."""
    today = datetime.now(UTC).date()
    days = [today - timedelta(days=n) for n in (64, 63, 62, 61, 60)]
    for day in days:
        conn.execute(partitions._formatted("create_partition", day))
        insert_payment(conn, due_at=at_noon(day), status="COMPLETED")
    conn.execute("UPDATE live_bound SET due_from = '0001-01-01 00:00:00+00'")
    yield days
    for day in days:
        conn.execute(f"DROP TABLE IF EXISTS {partitions.partition_name(day)}")
    conn.execute("UPDATE live_bound SET due_from = '0001-01-01 00:00:00+00'")


def at_noon(day):
    return datetime(day.year, day.month, day.day, 12, tzinfo=UTC)


def below_bound(conn) -> int:
    """Payments not terminal and due before the bound: always 0."""
    return conn.execute(
        "SELECT count(*) AS n FROM payments WHERE status <> ALL(%s)"
        " AND due_at < (SELECT due_from FROM live_bound)",
        (list(TERMINAL),),
    ).fetchone()["n"]


def partitions_locked(conn, run, days) -> set[str]:
    """The given days' partitions that ``run`` locks (so plans)."""
    names = [partitions.partition_name(d) for d in days]
    with conn.transaction(force_rollback=True):
        run()
        rows = conn.execute(
            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE l.pid = pg_backend_pid() AND c.relname = ANY(%s)",
            (names,),
        ).fetchall()
    return {r["relname"] for r in rows}


def claim(conn):
    return transitions.claim_due(conn, limit=100, lease_seconds=30)


def test_the_claim_skips_settled_days_once_the_bound_passes_them(conn, old_days):
    assert partitions_locked(conn, lambda: claim(conn), old_days)  # the control: -infinity
    bound = partitions.raise_live_bound(conn)
    assert bound >= partitions.day_start(old_days[-1] + timedelta(days=1))
    assert partitions_locked(conn, lambda: claim(conn), old_days) == set()
    assert partitions_locked(conn, lambda: transitions.count_queued(conn), old_days) == set()


def test_the_bound_stops_at_the_first_day_with_a_live_payment(conn, old_days):
    insert_payment(conn, due_at=at_noon(old_days[2]), status="PROCESSING", attempt=1)
    insert_payment(
        conn,
        due_at=at_noon(old_days[4]),
        status="AWAITING_GATEWAY",
        attempt=1,
        gateway_intent_id="pi_1",
        awaiting_since=datetime.now(UTC),
        next_poll_at=datetime.now(UTC),
    )
    assert partitions.raise_live_bound(conn) == partitions.day_start(old_days[2])
    assert below_bound(conn) == 0


def test_the_bound_stays_two_days_behind_today(conn, old_days):
    bound = partitions.raise_live_bound(conn)
    today = datetime.now(UTC).date()
    assert bound <= partitions.day_start(today - timedelta(days=2))
    # yesterday's and today's payments, PENDING or not, never needed the triggers
    insert_payment(conn, due_at=datetime.now(UTC) - timedelta(hours=20))
    assert partitions.live_bound(conn) == bound
    assert below_bound(conn) == 0


def test_a_payment_created_due_below_the_bound_lowers_it_and_is_claimed(conn, old_days):
    partitions.raise_live_bound(conn)
    row = insert_payment(conn, due_at=at_noon(old_days[1]))
    assert partitions.live_bound(conn) == partitions.day_start(old_days[1])
    assert below_bound(conn) == 0
    assert [c.payment_id for c in claim(conn)] == [row["id"]]


def test_a_redriven_payment_below_the_bound_lowers_it_and_is_claimed(conn, old_days):
    parked = park(conn, due_at=at_noon(old_days[0]))
    partitions.raise_live_bound(conn)
    assert partitions.live_bound(conn) > parked["due_at"]
    assert transitions.redrive(conn, parked["id"], actor="ops")
    assert partitions.live_bound(conn) == partitions.day_start(old_days[0])
    assert below_bound(conn) == 0
    assert [c.payment_id for c in claim(conn)] == [parked["id"]]


def test_the_keeper_does_not_pass_a_day_a_writer_is_making_live(conn, database_url, old_days):
    """A write in flight in a settled day holds the keeper back (its SHARE
    lock waits for the writer); a write after the raise lowers the bound."""
    writer = psycopg.connect(database_url, autocommit=False)
    try:
        writer.execute(
            "UPDATE payments SET status = 'PENDING' WHERE due_at >= %s AND due_at < %s",
            (
                partitions.day_start(old_days[0]),
                partitions.day_start(old_days[0] + timedelta(days=1)),
            ),
        )
        raised = {}
        keeper = threading.Thread(
            target=lambda: raised.setdefault("bound", raise_with_own_connection(database_url))
        )
        keeper.start()
        keeper.join(timeout=0.5)
        writer.commit()
        keeper.join(timeout=10)
    finally:
        writer.close()
    assert raised["bound"] <= partitions.day_start(old_days[0])
    assert below_bound(conn) == 0


def raise_with_own_connection(database_url):
    with connect(Config(database_url=database_url)) as conn:
        return partitions.raise_live_bound(conn)
