"""Real processes, really killed: a Dramatiq worker SIGKILLed with calls in
flight and a scheduler killed between claim and enqueue still end with every
payment terminal and at most one charge per key."""

from __future__ import annotations

import signal
import time

import pytest

from devtools.procs import ProcessGroup, scheduler_args, stop, worker_args
from paycron.store import transitions
from tests.factories import bulk_insert

DRAIN_SECONDS = 90


@pytest.fixture
def env(config, gateway):
    return {
        "DATABASE_URL": config.database_url,
        "REDIS_URL": config.redis_url,
        "REDIS_NAMESPACE": config.redis_namespace,
        "GATEWAY_URL": gateway.url,
        # Short leases so a killed worker's rows come back within seconds.
        "LEASE_SECONDS": "6",
        "GATEWAY_TIMEOUT_SECONDS": "2",
        "RETRY_DELAYS": "1s,1s,1s,1s,1s",
        "SWEEP_INTERVAL_SECONDS": "0.2",
        "GATEWAY_RATE_LIMIT": "1000",
        "CLAIM_BATCH": "50",
        "MESSAGE_GROUP_SIZE": "5",
    }


@pytest.fixture
def procs(tmp_path, env):
    group = ProcessGroup(tmp_path, env)

    def start(kind: str):
        return group.start(kind, worker_args(1, 4) if kind == "worker" else scheduler_args())

    yield start
    group.stop()


def wait_terminal(conn, n: int) -> dict:
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        counts = {
            r["status"]: r["n"]
            for r in conn.execute("SELECT status, count(*) AS n FROM payments GROUP BY status")
        }
        if sum(counts.get(s, 0) for s in ("COMPLETED", "FAILED", "CANCELLED")) == n:
            return counts
        time.sleep(0.5)
    raise AssertionError(f"not all terminal after {DRAIN_SECONDS}s: {counts}")


def assert_exactly_once_effect(conn, gateway, n: int) -> None:
    per_key = gateway.charges_per_key()
    assert max(per_key.values()) == 1, "a payment was charged twice"
    completed = {
        str(r["id"]) for r in conn.execute("SELECT id FROM payments WHERE status = 'COMPLETED'")
    }
    assert set(per_key) == completed
    assert len(completed) == n
    # every gateway call has its attempt row
    calls = gateway.stats()["charge_requests"]
    rows = conn.execute("SELECT count(*) AS n FROM attempts").fetchone()["n"]
    assert rows >= calls


def test_a_worker_sigkilled_mid_call_loses_nothing(conn, gateway, procs):
    gateway.faults(latency_ms=100)  # calls are in flight when the kill lands
    bulk_insert(conn, 150)
    worker = procs("worker")
    procs("scheduler")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        in_flight = conn.execute(
            "SELECT count(*) AS n FROM attempts WHERE outcome = 'IN_FLIGHT'"
        ).fetchone()["n"]
        if in_flight:
            break
        time.sleep(0.05)
    assert in_flight, "the worker never started a call"
    stop(worker, sig=signal.SIGKILL)
    procs("worker")
    wait_terminal(conn, 150)
    assert_exactly_once_effect(conn, gateway, 150)
    expired = conn.execute(
        "SELECT count(*) AS n FROM payments WHERE lease_expiries > 0"
    ).fetchone()["n"]
    assert expired > 0, "the kill left no lease to reap: the test proved nothing"


def test_claims_whose_scheduler_died_before_enqueue_are_reaped_and_run(
    conn, gateway, procs, config
):
    bulk_insert(conn, 40)
    # A "scheduler" claims and commits, then dies before sending anything.
    claimed = transitions.claim_due(conn, limit=40, lease_seconds=3)
    assert len(claimed) == 40
    procs("worker")
    procs("scheduler")
    wait_terminal(conn, 40)
    assert_exactly_once_effect(conn, gateway, 40)
    rows = conn.execute("SELECT attempt, lease_expiries, in_doubt FROM payments").fetchall()
    # no call was ever in flight: the expiry of a claim never started neither
    # counts toward parking nor puts the payment in doubt
    assert all(r["attempt"] == 2 and r["lease_expiries"] == 0 for r in rows)
    assert not any(r["in_doubt"] for r in rows)


def test_schedulers_killed_repeatedly_still_drain(conn, gateway, procs):
    gateway.faults(latency_ms=20)
    bulk_insert(conn, 300)
    procs("worker")
    for _ in range(4):
        scheduler = procs("scheduler")
        time.sleep(1.0)
        stop(scheduler, sig=signal.SIGKILL)
    procs("scheduler")
    procs("scheduler")  # two at once, no leader
    wait_terminal(conn, 300)
    assert_exactly_once_effect(conn, gateway, 300)


@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_worker_stopped_mid_call_finishes_its_calls_first(conn, gateway, tmp_path, env, executor):
    """SIGTERM (a deploy, a scale-down) is not a crash: the worker's calls in
    flight are answered and their outcomes written before it exits, with
    either executor. (Under asyncio Dramatiq closes the event loop on
    shutdown: without tasks.broker.DrainCalls every call in flight was left
    IN_FLIGHT for its lease to expire.)"""
    gateway.faults(latency_ms=1500)  # calls are in flight when the signal lands
    bulk_insert(conn, 20)
    group = ProcessGroup(tmp_path, {**env, "EXECUTOR": executor})
    try:
        worker = group.start("worker", worker_args(1, 4))
        group.start("scheduler", scheduler_args())
        deadline = time.monotonic() + 30
        in_flight = 0
        while time.monotonic() < deadline and not in_flight:
            in_flight = conn.execute(
                "SELECT count(*) AS n FROM attempts WHERE outcome = 'IN_FLIGHT'"
            ).fetchone()["n"]
            time.sleep(0.05)
        assert in_flight, "the worker never started a call"
        # To Dramatiq's main process only, which passes it to its worker
        # processes once (a second SIGTERM tells a stopping worker to die).
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        rows = conn.execute(
            "SELECT outcome, count(*) AS n FROM attempts GROUP BY outcome"
        ).fetchall()
        outcomes = {r["outcome"]: r["n"] for r in rows}
        # Checked at once: the leases (6 s) have not expired, nothing was reaped.
        assert outcomes.get("IN_FLIGHT", 0) == 0, outcomes
        assert outcomes.get("SUCCEEDED", 0) >= in_flight, outcomes
        expired = conn.execute(
            "SELECT count(*) AS n FROM payments WHERE lease_expiries > 0 OR in_doubt"
        ).fetchone()["n"]
        assert expired == 0
    finally:
        group.stop()
