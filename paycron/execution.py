"""Executing claimed payments: the worker's unit of work, free of Dramatiq.

For a group of claims (one message): if the breaker is open, release them
without a call. Otherwise, in one statement, fence every claim, renew its
lease and write its ``IN_FLIGHT`` attempt row; commit; call the gateway once
per started claim with the payment id as the idempotency key (each call
takes a rate token first); decide each payment's next state; in one
statement, record every outcome and CAS every payment fenced on its attempt.
A crash anywhere leaves rows that the reaper returns and the gateway's
idempotency collapses into the one charge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from psycopg_pool import ConnectionPool

from paycron import metrics, policy
from paycron.breaker import BreakerState, CircuitBreaker
from paycron.config import Config
from paycron.enums import FailureReason, Outcome, Status
from paycron.errors import GatewayError
from paycron.gateway_client import CallResult, Gateway
from paycron.pacing import CallLimiter
from paycron.transitions import Claim, Finished, finish, release, start

log = logging.getLogger("paycron.execution")


@dataclass
class GroupCounts:
    """What one group's execution did (for logs, metrics and tests)."""

    claims: int = 0
    stale: int = 0
    released: int = 0
    calls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    moved: int = 0
    looked_up: int = 0


def look_up_before_parking(gateway: Gateway, done: Finished) -> Finished:
    """An exhausted payment whose calls may have charged is asked about by
    reference before it is parked; :func:`policy.after_lookup` decides."""
    try:
        charge = gateway.find_charge(str(done.row["id"]))
    except GatewayError as exc:
        log.warning("lookup before parking failed for %s: %s", done.row["id"], exc)
        return done
    decision = policy.after_lookup(done.decision, charged=charge is not None)
    if charge is None:
        return Finished(done.row, done.result, decision)
    return Finished(done.row, CallResult(Outcome.FOUND_BY_LOOKUP, gateway_ref=charge.id),
                    decision)


class Executor:
    """Runs groups of claims against the gateway. One per worker process."""

    def __init__(self, *, config: Config, pool: ConnectionPool, gateway: Gateway,
                 breaker: CircuitBreaker, call_limiter: CallLimiter | None,
                 worker: str | None = None):
        self.config = config
        self.pool = pool
        self.gateway = gateway
        self.breaker = breaker
        self.call_limiter = call_limiter
        self.worker = worker

    def execute(self, claims: Sequence[Claim], *, probe: bool = False) -> GroupCounts:
        counts = GroupCounts(claims=len(claims))
        state = self.breaker.state()
        if state is BreakerState.OPEN or (state is BreakerState.HALF_OPEN and not probe):
            counts.released = release(self.pool, claims)
            metrics.BREAKER_RELEASES.inc(counts.released)
            return counts
        rows = start(self.pool, claims, lease_seconds=self.config.lease_seconds,
                     worker=self.worker)
        counts.stale = len(claims) - len(rows)
        done = [self._call(row) for row in rows]
        counts.calls = len(done)
        for i, item in enumerate(done):
            if item.decision.needs_lookup:
                done[i] = look_up_before_parking(self.gateway, item)
                counts.looked_up += 1
        recorded = finish(self.pool, done)
        counts.moved = sum(1 for r in recorded if r["moved"])
        parked = {r["id"] for r in recorded if r["moved"] and r["status"] == Status.FAILED}
        for item in done:
            reason = item.decision.failure_reason
            if item.row["id"] in parked and reason is FailureReason.RETRIES_EXHAUSTED:
                metrics.DEAD_LETTERS.labels(reason.value).inc()
        failures = sum(1 for d in done if d.result.breaker_failure)
        if probe:
            self.breaker.probe_finished(failed=failures > 0)
        self.breaker.record(calls=len(done), failures=failures)
        for item in done:
            name = item.result.outcome.value
            counts.outcomes[name] = counts.outcomes.get(name, 0) + 1
            log.info("attempt payment=%s attempt=%d outcome=%s error=%s status=%s",
                     item.row["id"], item.row["attempt"], name, item.result.error_code,
                     item.decision.status.value)
        return counts

    def _call(self, row: dict) -> Finished:
        if self.call_limiter is not None:
            self.call_limiter.acquire(1)
        started = time.monotonic()
        if row["attempt"] == 1:
            lateness = (datetime.now(UTC) - row["due_at"]).total_seconds()
            metrics.TRIGGER_LATENESS.observe(max(0.0, lateness))
        result = self.gateway.charge(
            idempotency_key=str(row["id"]), amount=row["amount_minor"],
            currency=row["currency"].strip(), reference=str(row["id"]),
        )
        metrics.GATEWAY_LATENCY.observe(time.monotonic() - started)
        metrics.GATEWAY_CALLS.labels(result.outcome.value).inc()
        decision = policy.decide(result, failures=row["failures"], in_doubt=row["in_doubt"],
                                 config=self.config)
        return Finished(row, result, decision)
