"""The sweep: disjoint claims across sweepers, pacing, drain, the breaker."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from paycron.limits.breaker import BreakerState
from tests.aio_support import BREAKER_EXECUTORS
from tests.factories import bulk_insert, insert_payment
from tests.inprocess import Engine
from tests.rows import count
from tests.support import Clock


@pytest.fixture
def clock():
    """The breakers' clock, shared by every engine a test makes (their
    breaker state in Redis is one)."""
    return Clock()


@pytest.fixture
def make_engine(config, clock, executor_kind):
    """make(claim_ahead=None, **config overrides): an in-process engine; no
    worker runs, so claims stay queued: a test of the pace itself lifts
    the queue bound (``claim_ahead``)."""
    engines = []

    def make(claim_ahead: int | None = None, **overrides):
        eng = Engine(config.with_overrides(**overrides), clock=clock, executor_kind=executor_kind)
        if claim_ahead is not None:
            eng.sweeper.settings = dataclasses.replace(
                eng.sweeper.settings, claim_ahead=claim_ahead
            )
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


def test_concurrent_sweepers_never_claim_a_row_twice(make_engine, conn):
    bulk_insert(conn, 4000)
    sweepers = [make_engine(claim_batch=50, gateway_rate_limit=100_000) for _ in range(4)]
    barrier = threading.Barrier(len(sweepers))

    def sweep(engine):
        barrier.wait()
        while engine.sweeper.run_once().claimed:
            pass

    threads = [threading.Thread(target=sweep, args=(e,)) for e in sweepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [c.payment_id for e in sweepers for claims, _ in e.messages for c in claims]
    assert len(claimed) == 4000
    assert len(set(claimed)) == 4000
    assert all(len(e.messages) > 0 for e in sweepers), "every sweeper took part"
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'PROCESSING' AND attempt = 1) AS n FROM payments"
    ).fetchone()
    assert row["n"] == 4000


def test_a_full_batch_drains_and_messages_carry_small_groups(make_engine, conn):
    bulk_insert(conn, 250)
    engine = make_engine(
        claim_batch=100,
        message_group_size=10,
        gateway_rate_limit=100_000,
        gateway_timeout_seconds=1,
    )
    counts = engine.sweeper.run_once()
    # 100, 100, 50, then one that claims nothing: the drain ends there
    assert counts.claimed == 250 and counts.batches == 4
    assert counts.messages == 25
    assert all(len(claims) <= 10 for claims, _ in engine.messages)


def test_claims_are_oldest_due_first(make_engine, conn):
    old = insert_payment(conn, due_at=datetime.now(UTC) - timedelta(hours=2))
    insert_payment(conn, due_at=datetime.now(UTC) - timedelta(seconds=1))
    engine = make_engine(claim_batch=1, gateway_rate_limit=1)
    engine.sweeper.pacer.capacity = 1
    [(claims, _)] = engine.sweep()
    assert claims[0].payment_id == old["id"]


def test_pacing_is_shared_by_every_sweeper(make_engine, conn):
    """Two sweepers together claim no more than the one bucket allows
    (capacity 10/s * 30 s / 4 = 75, then 10/s); two buckets would allow 150."""
    bulk_insert(conn, 500)
    a = make_engine(gateway_rate_limit=10, lease_seconds=30, claim_ahead=10_000)
    b = make_engine(gateway_rate_limit=10, lease_seconds=30, claim_ahead=10_000)
    first_take = time.monotonic()  # the bucket fills from its first take, in this sweep
    a.sweeper.run_once()  # warm the connections (the first touch of 375 partitions is slow)
    claimed = conn.execute(
        "SELECT count(*) AS n FROM payments WHERE status = 'PROCESSING'"
    ).fetchone()["n"]
    started = time.monotonic()
    while time.monotonic() - started < 1.5:
        claimed += a.sweeper.run_once().claimed + b.sweeper.run_once().claimed
    elapsed = time.monotonic() - first_take  # the warm-up's refill included, however slow
    assert claimed >= 75
    assert claimed <= 75 + 10 * elapsed + 1


def test_unused_tokens_are_given_back(make_engine, conn):
    engine = make_engine(
        gateway_rate_limit=1,
        lease_seconds=300,  # capacity 75, 1/s refill
        claim_ahead=10_000,
    )
    insert_payment(conn)
    assert engine.sweeper.run_once().claimed == 1  # took 75 tokens, used 1
    bulk_insert(conn, 200)
    # Without the give-back only a second or two of refill would be left.
    assert engine.sweeper.run_once().claimed >= 70


def test_only_two_seconds_of_the_ceiling_are_queued_beyond_what_is_in_flight(make_engine, conn):
    """At 50/s the sweep keeps 100 claims queued. 70 claims are queued (no
    attempt row yet) and 30 in flight (their IN_FLIGHT rows): room for 30,
    however many are due; the in-flight ones do not count against it."""
    for _ in range(70):
        insert_payment(conn, status="PROCESSING", attempt=1)
    for _ in range(30):
        row = insert_payment(conn, status="PROCESSING", attempt=1)
        conn.execute(
            "INSERT INTO attempts (payment_id, attempt, gateway_key, outcome, due_at)"
            " VALUES (%s, 1, %s, 'IN_FLIGHT', %s)",
            (row["id"], str(row["id"]), row["due_at"]),
        )
    bulk_insert(conn, 200)
    engine = make_engine(gateway_rate_limit=50, lease_seconds=300)
    assert engine.sweeper.settings.claim_ahead == 100
    counts = engine.sweeper.run_once()
    assert counts.claimed == 30
    assert counts.paced  # stopped by the bound: it looks again soon, not after an interval
    assert engine.sweeper.wait_after(counts) < engine.sweeper.interval_seconds


def test_two_sweeps_at_once_fill_the_queue_bound_once(make_engine, conn):
    """Sweep B runs whole between sweep A's first look at the room and A's
    claim: A counts the room again under the lock every sweep takes, finds
    it filled, and claims nothing more (without the lock, both fill it)."""
    bulk_insert(conn, 60)
    a, b = (
        make_engine(claim_ahead=10, claim_batch=10, gateway_rate_limit=100_000) for _ in range(2)
    )
    pacer = a.sweeper.pacer

    class BSweepsFirst:
        ran = False

        def take(self, n):
            if not self.ran:
                self.ran = True
                assert b.sweeper.run_once().claimed == 10
            return pacer.take(n)

        def give_back(self, n):
            pacer.give_back(n)

    a.sweeper.pacer = BSweepsFirst()
    counts = a.sweeper.run_once()
    assert (counts.claimed, counts.paced) == (0, True)  # the room was gone: looks again soon
    queued = conn.execute("SELECT count(*) AS n FROM payments WHERE status = 'PROCESSING'")
    assert queued.fetchone()["n"] == 10


def test_a_drained_schedule_waits_the_whole_interval(make_engine, conn):
    insert_payment(conn)
    engine = make_engine()
    counts = engine.sweeper.run_once()
    assert counts.claimed == 1 and not counts.paced
    assert engine.sweeper.wait_after(counts) == engine.sweeper.interval_seconds


def test_claims_are_shared_across_payers_oldest_first_within_each(make_engine, conn):
    """One payer's 50 older payments beside another's 5 newer ones: a batch of
    10 takes 5 of each, alternating, each payer's oldest first, where a FIFO
    would have taken the first payer's 10 oldest."""
    base = datetime.now(UTC) - timedelta(minutes=10)
    big = [insert_payment(conn, payer="big", due_at=base + timedelta(seconds=i)) for i in range(50)]
    small = [
        insert_payment(conn, payer="small", due_at=base + timedelta(minutes=5, seconds=i))
        for i in range(5)
    ]
    engine = make_engine(claim_batch=10, message_group_size=10, gateway_timeout_seconds=1)
    engine.sweeper.settings = dataclasses.replace(engine.sweeper.settings, claim_ahead=10)
    [(claims, _)] = engine.sweep()
    order = [c.payment_id for c in claims]
    expected = [p["id"] for pair in zip(big[:5], small, strict=True) for p in pair]
    assert order == expected


@pytest.mark.parametrize("executor_kind", BREAKER_EXECUTORS)
def test_an_open_breaker_claims_nothing_and_workers_release(make_engine, conn, gateway):
    engine = make_engine()
    rows = [insert_payment(conn) for _ in range(3)]
    [(claims, _)] = engine.sweep()
    engine.breaker.open()
    counts = engine.executor.execute(claims)
    assert counts.released == 3 and counts.calls == 0
    after = {
        r["id"]: (r["status"], r["failures"], r["lease_until"])
        for r in conn.execute("SELECT id, status, failures, lease_until FROM payments")
    }
    assert after == {r["id"]: ("PENDING", 0, None) for r in rows}
    assert engine.sweep() == []  # no claims while open: no attempts churned
    assert count(conn, "attempts") == 0
    assert gateway.stats()["charge_requests"] == 0


@pytest.mark.parametrize("executor_kind", BREAKER_EXECUTORS)
def test_half_open_probes_with_exactly_one_claim(make_engine, conn, gateway, clock):
    engines = [make_engine(circuit_open_seconds=30) for _ in range(3)]
    for _ in range(5):
        insert_payment(conn)
    engines[0].breaker.open()
    clock.advance(29.9)
    assert {e.breaker.state() for e in engines} == {BreakerState.OPEN}
    assert [m for e in engines for m in e.sweep()] == []
    clock.advance(0.2)
    assert {e.breaker.state() for e in engines} == {BreakerState.HALF_OPEN}
    sent = [m for e in engines for m in e.sweep()]
    assert len(sent) == 1
    [(claims, probe)] = sent
    assert probe and len(claims) == 1
    engines[0].work(sent)  # the probe succeeds: the breaker closes
    assert engines[0].breaker.state() is BreakerState.CLOSED
    assert engines[1].sweeper.run_once().claimed == 4


@pytest.mark.parametrize("executor_kind", BREAKER_EXECUTORS)
def test_half_open_a_group_that_is_not_the_probe_is_released(make_engine, conn, gateway, clock):
    """Half-open, only the probe calls: a group claimed before the breaker
    opened (its message late) is released uncalled; the probe's is called."""
    engine = make_engine(circuit_open_seconds=30)
    for _ in range(3):
        insert_payment(conn)
    [(claims, _)] = engine.sweep()
    engine.breaker.open()
    clock.advance(31)
    assert engine.breaker.state() is BreakerState.HALF_OPEN
    counts = engine.executor.execute(claims, probe=False)
    assert counts.released == 3 and counts.calls == 0
    assert gateway.stats()["charge_requests"] == 0
    counts = engine.executor.execute(engine.sweep()[0][0], probe=True)
    assert counts.calls == 1 and engine.breaker.state() is BreakerState.CLOSED
    statuses = [r["status"] for r in conn.execute("SELECT status FROM payments")]
    assert sorted(statuses) == ["COMPLETED", "PENDING", "PENDING"]


@pytest.mark.parametrize("executor_kind", BREAKER_EXECUTORS)
def test_a_failed_probe_reopens(make_engine, conn, gateway, clock):
    engine = make_engine(circuit_open_seconds=30)
    insert_payment(conn, amount_minor=50003)
    engine.breaker.open()
    clock.advance(31)
    [(claims, probe)] = engine.sweep()
    assert probe and len(claims) == 1
    engine.work([(claims, probe)])
    assert engine.breaker.state() is BreakerState.OPEN
    clock.advance(29)  # open for another full period from the probe's failure
    assert engine.breaker.state() is BreakerState.OPEN


@pytest.mark.parametrize("executor_kind", BREAKER_EXECUTORS)
def test_the_breaker_trips_on_retryable_failures_not_on_declines(make_engine, conn, gateway):
    engine = make_engine(circuit_min_calls=4, circuit_failure_ratio=0.5)
    for _ in range(6):
        insert_payment(conn, amount_minor=40002)
    engine.work()
    assert engine.breaker.state() is BreakerState.CLOSED
    for _ in range(4):
        insert_payment(conn, amount_minor=50003)
    engine.work()
    assert engine.breaker.state() is BreakerState.CLOSED  # 4 of 10 calls failed: < 0.5
    for _ in range(4):
        insert_payment(conn, amount_minor=50003)
    conn.execute(
        "UPDATE payments SET run_at = due_at + interval '1 hour' "
        "WHERE status = 'PENDING' AND attempt > 0"
    )  # only the new ones are due
    engine.work()
    assert engine.breaker.state() is BreakerState.OPEN  # 8 of 14


def test_claims_the_broker_refused_are_handed_back(make_engine, conn):
    """The broker fails on the second message: its claims and the rest go
    back to PENDING at once (no lease to wait out), the first stay claimed."""
    bulk_insert(conn, 30)
    engine = make_engine(claim_batch=30, message_group_size=10, gateway_timeout_seconds=1)
    sent = []

    def flaky(claims, probe):
        if sent:
            raise ConnectionError("broker down")
        sent.append(list(claims))

    engine.sweeper.enqueue = flaky
    with pytest.raises(ConnectionError):
        engine.sweeper.run_once()
    rows = conn.execute("SELECT status, count(*) AS n FROM payments GROUP BY status").fetchall()
    assert {r["status"]: r["n"] for r in rows} == {"PROCESSING": 10, "PENDING": 20}
