"""Executing claimed payments: the worker's unit of work, free of Dramatiq.

For a group of claims (one message): if the breaker is open, release them
without a call. Otherwise, in batches of as many claims as the shared
per-second window grants at once: in one statement, fence every claim,
renew its lease and write its ``IN_FLIGHT`` attempt row; commit; make the
batch's calls **concurrently** (no Postgres connection is held meanwhile),
each with the payment id as the idempotency key, each checking just before
it sends that its lease still covers its whole timeout; decide each
payment's next state (paycron/policy.py); in one statement, record every
outcome and CAS every payment fenced on its attempt. A crash anywhere
leaves rows that the reaper returns and the gateway's idempotency collapses
into the one charge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor as ThreadPool
from dataclasses import dataclass, field
from datetime import UTC, datetime

from psycopg_pool import ConnectionPool

from paycron import metrics, policy
from paycron.breaker import BreakerState, CircuitBreaker
from paycron.config import Config
from paycron.enums import FailureReason, Outcome, Status
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


#: A call is sent only while its lease has at least this long left (seconds);
#: its timeout is cut to the time left, so no call outlives its lease.
MIN_SEND_SECONDS = 1.0


def look_up(gateway: Gateway, done: Finished) -> Finished:
    """A payment whose calls may have charged (exhausted in doubt, or ten
    "key in use" answers in a row) is asked about by reference before its
    decision is written; :func:`policy.after_lookup` decides."""
    row = done.row
    try:
        charge = gateway.find_charge(str(row["id"]))
    except Exception as exc:  # unreachable or an absurd answer: proves nothing
        log.warning("lookup failed for %s: %s", row["id"], type(exc).__name__)
        charge = None
    charged = policy.proves_charge(charge, payment_id=str(row["id"]),
                                   amount=row["amount_minor"], currency=row["currency"].strip())
    if charge is not None and not charged:
        log.error("lookup for %s found a charge that is not its own or not charged "
                  "(status %s): left in doubt", row["id"], charge.status)
    decision = policy.after_lookup(done.decision, charged=charged)
    if not charged:
        return Finished(done.row, done.result, decision)
    return Finished(done.row, CallResult(Outcome.FOUND_BY_LOOKUP, gateway_ref=charge.id),
                    decision)


class Executor:
    """Runs groups of claims against the gateway. One per worker process.

    ``calls`` runs a batch's calls side by side (a thread pool as large as
    the process's in-flight bound); without it they run one after another.
    ``on_latency`` hears every call's duration (the in-flight sizing).
    """

    def __init__(self, *, config: Config, pool: ConnectionPool, gateway: Gateway,
                 breaker: CircuitBreaker, call_limiter: CallLimiter | None,
                 worker: str | None = None, calls: ThreadPool | None = None,
                 on_latency: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.pool = pool
        self.gateway = gateway
        self.breaker = breaker
        self.call_limiter = call_limiter
        self.worker = worker
        self.calls = calls
        self.on_latency = on_latency
        self.clock = clock

    def execute(self, claims: Sequence[Claim], *, probe: bool = False) -> GroupCounts:
        counts = GroupCounts(claims=len(claims))
        state = self.breaker.state()
        if state is BreakerState.OPEN or (state is BreakerState.HALF_OPEN and not probe):
            counts.released = release(self.pool, claims)
            metrics.BREAKER_RELEASES.inc(counts.released)
            return counts
        done: list[Finished] = []
        remaining = list(claims)
        while remaining:
            # Tokens first, then the lease: a claim waiting for the window
            # never eats into the lease its call needs.
            granted = (self.call_limiter.acquire_some(len(remaining))
                       if self.call_limiter is not None else len(remaining))
            batch, remaining = remaining[:granted], remaining[granted:]
            done += self._execute_batch(batch, counts)
        failures = sum(1 for d in done if d.result.breaker_failure)
        if probe and counts.calls:  # a probe that made no call proves nothing
            self.breaker.probe_finished(failed=failures > 0)
        self.breaker.record(calls=counts.calls, failures=failures)
        return counts

    def _execute_batch(self, batch: Sequence[Claim], counts: GroupCounts) -> list[Finished]:
        # Read before the lease is renewed, so the lease ends no earlier.
        lease_end = self.clock() + self.config.lease_seconds
        rows = start(self.pool, batch, lease_seconds=self.config.lease_seconds,
                     worker=self.worker)
        counts.stale += len(batch) - len(rows)
        done = self._call_all(rows, lease_end)
        counts.calls += sum(1 for d in done if d.result.outcome is not Outcome.NOT_SENT)
        for i, item in enumerate(done):
            if item.decision.needs_lookup:
                done[i] = look_up(self.gateway, item)
                counts.looked_up += 1
        recorded = finish(self.pool, done)
        counts.moved += sum(1 for r in recorded if r["moved"])
        parked = {r["id"] for r in recorded if r["moved"] and r["status"] == Status.FAILED}
        for item in done:
            reason = item.decision.failure_reason
            if item.row["id"] in parked and reason is FailureReason.RETRIES_EXHAUSTED:
                metrics.DEAD_LETTERS.labels(reason.value).inc()
            name = item.result.outcome.value
            counts.outcomes[name] = counts.outcomes.get(name, 0) + 1
            log.info("attempt payment=%s attempt=%d outcome=%s error=%s status=%s",
                     item.row["id"], item.row["attempt"], name, item.result.error_code,
                     item.decision.status.value)
        return done

    def _call_all(self, rows: list[dict], lease_end: float) -> list[Finished]:
        if self.calls is None or len(rows) < 2:
            return [self._call(row, lease_end) for row in rows]
        # This thread makes the first call itself: one hand-off fewer.
        futures = [self.calls.submit(self._call, row, lease_end) for row in rows[1:]]
        first = self._call(rows[0], lease_end)
        return [first, *(f.result() for f in futures)]

    def _call(self, row: dict, lease_end: float) -> Finished:
        try:
            result = self._send(row, lease_end)
        except Exception:  # a bug must not lose the group: in doubt, asked again
            log.exception("gateway call failed unexpectedly for %s", row["id"])
            result = CallResult(Outcome.AMBIGUOUS, error_code="client_error", in_doubt=True)
        decision = policy.decide(result, failures=row["failures"], in_doubt=row["in_doubt"],
                                 key_in_use=row["key_in_use"], config=self.config)
        return Finished(row, result, decision)

    def _send(self, row: dict, lease_end: float) -> CallResult:
        left = lease_end - self.clock()
        if left < MIN_SEND_SECONDS:
            return CallResult(Outcome.NOT_SENT, error_code="lease_too_short")
        if row["attempt"] == 1:
            lateness = (datetime.now(UTC) - row["due_at"]).total_seconds()
            metrics.TRIGGER_LATENESS.observe(max(0.0, lateness))
        started = time.monotonic()
        result = self.gateway.charge(
            idempotency_key=str(row["id"]), amount=row["amount_minor"],
            currency=row["currency"].strip(), reference=str(row["id"]),
            timeout=min(self.config.gateway_timeout_seconds, left),
        )
        elapsed = time.monotonic() - started
        metrics.GATEWAY_LATENCY.observe(elapsed)
        metrics.GATEWAY_CALLS.labels(result.outcome.value).inc()
        if self.on_latency is not None:
            self.on_latency(elapsed)
        return result
