"""paycron.store.batches: a batch is a handful of set-based statements
whatever its size, and all or nothing of its writes commit."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from paycron.config import Config
from paycron.errors import IdempotencyKeyReused
from paycron.sql import q
from paycron.store import batches
from paycron.store.batches import BatchItem
from paycron.store.db import connect
from paycron.store.payments import Created, NewPayment, request_hash

DUE = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)


class Counting:
    """The connection, counting the statements sent through it (a COPY is one)."""

    def __init__(self, conn):
        self.conn, self.statements = conn, 0

    def execute(self, query, params=None, **kwargs):
        self.statements += 1
        return self.conn.execute(query, params, **kwargs)

    def transaction(self):
        return self.conn.transaction()

    def cursor(self):
        return _CountingCursor(self)


class _CountingCursor:
    def __init__(self, counting: Counting):
        self.counting, self.cursor = counting, counting.conn.cursor()

    def copy(self, statement):
        self.counting.statements += 1
        return self.cursor.copy(statement)


def items(n: int, *, amount: int = 100, customer: str | None = None) -> list[BatchItem]:
    made = []
    for i in range(n):
        body = {"payee": f"p{i}", "amount": amount + i, "dueAt": DUE.isoformat()}
        new = NewPayment(f"p{i}", amount + i, "USD", DUE, customer=customer)
        made.append(BatchItem(f"key-{i:04d}", request_hash(body), new=new))
    return made


def count(conn, table) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def create(conn, batch, actor="alice", processor="fake"):
    return batches.create_batch(conn, actor=actor, items=batch, processor=processor)


def test_a_batch_of_new_keys_is_three_statements_whatever_its_size(conn):
    counting = Counting(conn)
    outcomes = create(counting, items(500))
    assert counting.statements == 3  # the staging table, the COPY into it, the insert
    assert all(isinstance(o, Created) and not o.replayed for o in outcomes)
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 500
    assert count(conn, "payment_events") == 500


def test_a_replayed_batch_is_a_few_statements_whatever_its_size(conn):
    create(conn, items(500))
    counting = Counting(conn)
    outcomes = create(counting, items(500))
    # the staging, the insert, the keys, the payments, their attempts, the replays' write
    assert counting.statements == 7
    assert all(isinstance(o, Created) and o.replayed for o in outcomes)
    assert count(conn, "payments") == 500


def test_customers_cost_three_statements_not_one_per_item(conn):
    counting = Counting(conn)
    create(counting, items(300, customer="cus_1"), processor="stripe")
    assert counting.statements == 5  # owners, binding, the staging, the insert
    assert count(conn, "payments") == 300 and count(conn, "customers") == 1


def test_one_row_the_database_refuses_writes_nothing_of_the_batch(conn):
    """Keys, payments and events go in one statement: a payment the schema's
    CHECK refuses (amount 0, which the API never sends) undoes them all."""
    batch = items(10)
    batch[7] = BatchItem("bad", b"h", new=NewPayment("p", 0, "USD", DUE))
    with pytest.raises(psycopg.errors.CheckViolation):
        create(conn, batch)
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 0
    assert count(conn, "payment_events") == 0


def test_a_key_used_by_another_actor_is_not_this_ones(conn):
    create(conn, items(3), actor="bob")
    outcomes = create(conn, items(3), actor="alice")
    assert all(isinstance(o, Created) and not o.replayed for o in outcomes)
    assert count(conn, "payments") == 6


def test_a_reused_key_answers_409_per_item(conn):
    create(conn, items(2))
    outcomes = create(conn, items(2, amount=900))
    assert all(isinstance(o, IdempotencyKeyReused) for o in outcomes)


def test_days_without_a_partition_are_named(conn):
    today = datetime.now(UTC).date()
    far = today + timedelta(days=5000)
    assert batches.days_without_partition(conn, [today, today, far]) == {far}
    assert batches.days_without_partition(conn, []) == set()


def test_replays_lock_their_keys_in_key_order(conn, database_url):
    """Two batches replaying the same keys lock them in one order (key
    order), whatever order the rows lie in: the UPDATE alone locked them in
    its plan's order, and two batches whose plans differed deadlocked (a
    503 for a client, seen under the 16-client race). Here the rows lie in
    reverse key order; a session holding the first key makes the touch wait
    on it, and the touch must not have locked the second key meanwhile."""
    create(conn, [items(2)[1]])  # key-0001 first in the heap
    create(conn, [items(2)[0]])
    touch = q("touch_idempotency_keys")
    keys = {"actor": "alice", "keys": ["key-0000", "key-0001"]}
    config = Config(database_url=database_url)
    with connect(config) as holder, connect(config) as toucher, connect(config) as prober:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM idempotency_keys WHERE key = 'key-0000' FOR UPDATE")
        toucher.execute("BEGIN")
        thread = threading.Thread(target=toucher.execute, args=(touch, keys))
        thread.start()
        try:
            waiting = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
            pid = toucher.info.backend_pid
            deadline = time.monotonic() + 10
            while prober.execute(waiting, (pid,)).fetchone()["wait_event_type"] != "Lock":
                assert time.monotonic() < deadline, "the touch never waited"
                time.sleep(0.01)
            prober.execute("BEGIN")
            free = prober.execute(
                "SELECT key FROM idempotency_keys WHERE key = 'key-0001' FOR UPDATE SKIP LOCKED"
            ).fetchall()
            prober.execute("ROLLBACK")
            assert free, "the touch locked key-0001 before key-0000"
        finally:
            holder.execute("ROLLBACK")
            thread.join(10)
            toucher.execute("ROLLBACK")
