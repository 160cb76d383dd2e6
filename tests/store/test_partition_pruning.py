"""Hot statements touch only the partitions they need.

A statement the planner cannot prune at plan time plans and locks every day
partition (1,878 locks with 375 of them on PostgreSQL 15); a handful of
those at once exhaust the shared lock table and fail every other query.
These tests count the locks each hot statement takes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from paycron.config import Config
from paycron.domain.ids import due_range
from paycron.sql import q
from paycron.store import payments, transitions
from paycron.store.db import connection_kwargs
from scheduler.reaper import reap_batch
from tests.factories import insert_payment

ALL_TIME = datetime(1970, 1, 1, tzinfo=UTC)
#: Generous: a handful of partitions with their indexes, never hundreds.
MAX_LOCKS = 120


def locks_taken(conn, run) -> int:
    with conn.transaction(force_rollback=True):
        run()
        return conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE pid = pg_backend_pid()"
        ).fetchone()["n"]


@pytest.fixture
def row(conn):
    return insert_payment(conn, status="PROCESSING", attempt=1)


def claim_params(row):
    return {"ids": [row["id"]], "due_ats": [row["due_at"]], "attempts": [1]}


STATEMENTS = {
    "claim_due": lambda conn, row: transitions.claim_due(conn, limit=100, lease_seconds=30),
    "reap_expired": lambda conn, row: reap_batch(conn, limit=100, config=Config()),
    "reap_locked": lambda conn, row: conn.execute(
        q("reap_locked"),
        {
            **claim_params(row),
            "statuses": ["PENDING"],
            "failure_reasons": [None],
            "in_doubts": [True],
            "counteds": [True],
            "land_seconds": 730,
        },
    ),
    "count_queued": lambda conn, row: transitions.count_queued(conn),
    "start_attempts": lambda conn, row: conn.execute(
        q("start_attempts"),
        {**claim_params(row), "lease_seconds": 30, "worker": "w", "processor": "fake"},
    ),
    "lock_claims_to_release": lambda conn, row: conn.execute(
        q("lock_claims_to_release"), claim_params(row)
    ),
    "release_claims": lambda conn, row: conn.execute(
        q("release_claims"), {**claim_params(row), "reason": "circuit_open"}
    ),
    "get_payment": lambda conn, row: payments.get_payment(conn, row["id"], actor="alice"),
    "cancel": lambda conn, row: conn.execute(
        q("cancel"),
        {
            "id": row["id"],
            "due_from": due_range(row["id"])[0],
            "due_to": due_range(row["id"])[1],
            "actor": "alice",
        },
    ),
    "list_payments": lambda conn, row: payments.list_payments(
        conn, actor="alice", status=None, limit=20, after=None
    ),
    "list_payments_by_status": lambda conn, row: payments.list_payments(
        conn, actor="alice", status="FAILED", limit=20, after=None
    ),
}


@pytest.mark.parametrize("name", STATEMENTS)
def test_hot_statements_lock_only_a_few_partitions(conn, row, name):
    # rows spread over a few days, as a live system has
    for days in (0, 3, 40):
        insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=days, hours=1))
    taken = locks_taken(conn, lambda: STATEMENTS[name](conn, row))
    assert taken <= MAX_LOCKS, f"{name} took {taken} locks"


def test_a_statement_on_now_would_lock_everything(conn):
    """The control: the same sweep written with now() locks every partition."""
    sweep_on_now = q("lock_due_fairly").replace("%(now)s", "now()")
    taken = locks_taken(
        conn,
        lambda: conn.execute(
            sweep_on_now,
            {"limit": 100, "lease_seconds": 30, "processor": "fake", "live_from": ALL_TIME},
        ),
    )
    assert taken > 1000


def test_the_create_planned_once_locks_only_the_partitions_it_writes(database_url, conn):
    """The web's create runs on sessions that plan it once (generic plans,
    web.create_app's create pool): safe because the statement reads no
    partitioned table, so its plan locks the parents and routing locks the
    partitions written. The control: a read planned the same way locks
    every partition, which is why nothing else runs on those sessions."""
    new = payments.NewPayment(
        payee="acme",
        amount_minor=100,
        currency="USD",
        due_at=datetime.now(UTC) + timedelta(days=2),
    )
    row = insert_payment(conn)
    with psycopg.connect(
        database_url, **connection_kwargs(database_url=database_url, generic_plans=True)
    ) as planned_once:
        planned_once.prepare_threshold = 0  # each statement prepared at once, as a busy pool's are

        def create():
            params = payments.creation(
                actor="alice", key=uuid.uuid4().hex, body_hash=b"h" * 32, new=new, processor="fake"
            )
            return payments.insert_payment(planned_once, params)

        assert create() is not None
        plans = planned_once.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
        taken = locks_taken(planned_once, create)
        read = locks_taken(
            planned_once, lambda: payments.get_payment(planned_once, row["id"], actor="alice")
        )
    assert taken <= MAX_LOCKS, f"the create took {taken} locks"
    (create_plans,) = [p for p in plans if "INSERT INTO idempotency_keys" in p["statement"]]
    assert create_plans["generic_plans"] >= 1 and create_plans["custom_plans"] == 0
    assert read > 1000, f"a read planned once took only {read} locks"
