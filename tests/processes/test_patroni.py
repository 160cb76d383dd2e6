"""No split brain reaches money under Patroni.

A worker holds a claim it started on the leader; the leader is cut off from
etcd (alive, its clients still able to reach it); Patroni elects the other
member. The worker's outcome, written through its connection to the old
leader, must not commit there: the write fails or waits (the deposed leader
is demoted, or its synchronous commit waits for a standby that follows
someone else), and on the new leader the payment stays fenced: PROCESSING
with its attempt IN_FLIGHT, for the reaper and a lookup to settle.

Needs the system's ``patroni`` and ``etcd`` (Debian's packages); skipped
without them.
"""

from __future__ import annotations

import shutil
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from bench.patroni import TUNED, PatroniCluster
from devtools.factories import insert_payment
from paycron.config import Config
from paycron.domain.enums import Outcome
from paycron.domain.policy import decide
from paycron.domain.processing import CallResult
from paycron.store.db import connect, make_pool
from paycron.store.migrate import migrate
from paycron.store.partitions import ensure_partitions
from paycron.store.transitions import Finished, claim_due, finish, start

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (shutil.which("patroni") and shutil.which("etcd")),
        reason="needs Debian's patroni and etcd-server (apt-get install patroni etcd-server)",
    ),
]

#: How long the outcome's write may wait before the test calls it "waiting".
WRITE_WAIT = 15.0


@pytest.fixture(scope="module")
def cluster():
    patroni = PatroniCluster(members=2, timing=TUNED)
    try:
        patroni.start(timeout=300)
        yield patroni
    finally:
        patroni.destroy()


def _write_outcome(pool, done: list[Finished], land_seconds: float) -> dict:
    """Run ``finish`` on a thread: what it did within WRITE_WAIT seconds."""
    result: dict = {}

    def run() -> None:
        try:
            result["rows"] = finish(pool, done, land_seconds=land_seconds)
        except Exception as exc:  # noqa: BLE001 - the failure is the observation
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WRITE_WAIT)
    result["waiting"] = thread.is_alive()
    return result


def _outcome_after_a_takeover(cluster, fault) -> tuple[dict, str, list[str]]:
    """A worker starts a claim on the leader; ``fault(old_leader)``; once
    another member leads, the worker records a success through its
    connection to the old leader. What the write did, and the payment's
    status and attempts on the new leader."""
    config = Config(database_url=cluster.url, lease_seconds=30, gateway_timeout_seconds=2)
    cluster.wait_synchronous(timeout=300)
    with connect(config) as conn:
        migrate(conn)
        ensure_partitions(conn, config)
        payment = insert_payment(conn, due_at=datetime.now(UTC) - timedelta(seconds=1))
        [claim] = claim_due(conn, limit=10, lease_seconds=config.lease_seconds)
    old = cluster.leader()
    # The worker's pool names only the leader it found: what a pool that
    # connected before the fault holds.
    worker = make_pool(
        config.with_overrides(database_url=old.dsn(cluster.dbname)),
        max_size=2,
        name="old-leader-worker",
    )
    try:
        [row] = start(worker, [claim], lease_seconds=config.lease_seconds)
        answer = CallResult(Outcome.SUCCEEDED, gateway_ref="ch_split_brain")
        decision = decide(answer, failures=0, in_doubt=False, config=config)
        fault(old)
        new = cluster.wait_leader(timeout=120, not_=old)
        outcome = _write_outcome(
            worker, [Finished(row, answer, decision)], config.in_flight_bound_seconds
        )
        with psycopg.connect(new.dsn(cluster.dbname)) as conn:
            status = conn.execute(
                "SELECT status FROM payments WHERE id = %s", (payment["id"],)
            ).fetchone()[0]
            attempts = conn.execute(
                "SELECT outcome FROM attempts WHERE payment_id = %s", (payment["id"],)
            ).fetchall()
        return outcome, status, [a[0] for a in attempts]
    finally:
        worker.close(timeout=1)


def test_a_worker_on_the_partitioned_leader_cannot_record_an_outcome(cluster):
    """Patroni demotes a leader that cannot reach etcd."""
    try:
        outcome, status, attempts = _outcome_after_a_takeover(cluster, lambda old: old.partition())
    finally:
        for member in cluster.members:
            member.heal()
    assert outcome["waiting"] or "error" in outcome, outcome
    assert (status, attempts) == ("PROCESSING", ["IN_FLIGHT"])


def test_a_worker_on_an_unmanaged_old_leader_cannot_record_an_outcome(cluster):
    """The old leader's agent died: nothing demotes its PostgreSQL, which
    still accepts the worker's write; synchronous replication holds the
    commit (its standby now follows another leader), so it never lands."""
    killed = []

    def kill_agent(old) -> None:
        killed.append(old)
        old.kill_agent()

    try:
        outcome, status, attempts = _outcome_after_a_takeover(cluster, kill_agent)
    finally:
        for member in killed:
            member.start_agent()
    assert outcome["waiting"] or "error" in outcome, outcome
    assert (status, attempts) == ("PROCESSING", ["IN_FLIGHT"])
