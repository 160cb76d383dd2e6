"""Executing claimed payments: the worker's unit of work, free of Dramatiq.

For a group of claims (one message): if the breaker is open, release them
without a call. Otherwise, in batches of as many claims as the shared
per-second window grants at once: in one statement, fence every claim,
renew its lease and write its ``IN_FLIGHT`` attempt row; commit; make the
batch's calls **concurrently** (no Postgres connection is held meanwhile),
each with the payment id as the idempotency key, each checking just before
it sends that its lease still covers its whole timeout; decide each
payment's next state (paycron/domain/policy.py); in one statement, record every
outcome and CAS every payment fenced on its attempt. A crash anywhere
leaves rows that the reaper returns and the gateway's idempotency collapses
into the one charge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor as ThreadPool
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from paycron.config import Config
from paycron.domain import policy
from paycron.domain.enums import FailureReason, Outcome, Status
from paycron.domain.keys import gateway_key
from paycron.domain.policy import Answer, Decision
from paycron.domain.processing import CallResult, ChargeRequest
from paycron.engine import lookups
from paycron.limits.breaker import BreakerState, CircuitBreaker
from paycron.limits.pacing import CallLimiter
from paycron.observability import metrics
from paycron.processors.base import Processor
from paycron.store.clock import DatabaseClock
from paycron.store.db import Pool
from paycron.store.transitions import Claim, Finished, finish, release, start

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


#: Parked with a dead letter for a human (the metric counts each).
PARKED_REASONS = frozenset(
    {
        FailureReason.RETRIES_EXHAUSTED,
        FailureReason.LOOKUP_MISMATCH,
        FailureReason.GATEWAY_REJECTED,
        FailureReason.LEASE_EXPIRED_REPEATEDLY,
    }
)

#: A call is sent only while its lease has at least this long left (seconds);
#: its timeout is cut to the time left, so no call outlives its lease.
MIN_SEND_SECONDS = 1.0


def decide_by_lookup(gateway: Processor, done: Finished, *, now: datetime) -> Finished:
    """A payment whose calls may have charged (exhausted in doubt, ten "key in
    use" answers in a row, a rejected request in doubt) is asked about by
    reference before its decision is written; :func:`policy.after_lookup`
    decides. A lookup that fails proves nothing: the decision stands, in doubt.
    ``now``: the database's clock (paycron/store/clock.py)."""
    row = done.row
    lookup = _ask(gateway, row, in_doubt=done.decision.in_doubt, now=now)
    if lookup.answer is Answer.NONE and done.result.may_land:
        # The call just made may still land (its bound, written by this
        # finish, is ahead whatever the row's older one says), or a 409 said
        # a call with the key runs right now: a *none* is not conclusive.
        lookup = replace(lookup, conclusive=False)
    decision = policy.after_lookup(done.decision, lookup)
    return Finished(done.row, _found(lookup) or done.result, decision)


def _found(lookup: policy.Lookup) -> CallResult | None:
    """What a lookup found, as the attempt's outcome: the charge, or the
    processor-side payment still processing (the one the payment waits on)."""
    if lookup.answer is Answer.CHARGED:
        return CallResult(Outcome.FOUND_BY_LOOKUP, gateway_ref=lookup.found.id)
    if lookup.answer is Answer.PROCESSING:
        return CallResult(Outcome.SUBMITTED, gateway_ref=lookup.found.id)
    return None


def _ask(gateway: Processor, row: dict, *, in_doubt: bool, now: datetime) -> policy.Lookup:
    """The lookup of one payment row (conclusive as the row's in-flight bound
    says, on the database's clock), logging what must be paged; an error is
    an inconclusive *none*."""
    try:
        lookup = lookups.ask_processor(gateway, {**row, "in_doubt": in_doubt}, now=now)
    except Exception as exc:  # unreachable or an absurd answer: proves nothing
        log.warning("lookup failed for %s: %s", row["id"], type(exc).__name__)
        return policy.Lookup(Answer.NONE, conclusive=False)
    if lookup.answer is Answer.MISMATCHED:
        log.error(
            "lookup for payment %s found processor payment %s with another amount, "
            "currency or customer: parked LOOKUP_MISMATCH",
            row["id"],
            lookup.found.id,
        )
    if lookup.extra:
        log.error(
            "lookup for payment %s found %d charged processor payments: a double charge to refund",
            row["id"],
            1 + len(lookup.extra),
        )
    return lookup


class Executor:
    """Runs groups of claims against the gateway. One per worker process.

    ``calls`` runs a batch's calls side by side (a thread pool as large as
    the process's in-flight limit); without it they run one after another.
    ``on_latency`` hears every call's duration (the in-flight sizing).
    """

    def __init__(
        self,
        *,
        config: Config,
        pool: Pool,
        gateway: Processor,
        breaker: CircuitBreaker,
        call_limiter: CallLimiter | None,
        worker: str | None = None,
        calls: ThreadPool | None = None,
        on_latency: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        db_clock: DatabaseClock | None = None,
    ):
        self.config = config
        self.pool = pool
        self.gateway = gateway
        self.breaker = breaker
        self.call_limiter = call_limiter
        self.worker = worker
        self.calls = calls
        self.on_latency = on_latency
        self.clock = clock
        # Times the database wrote (bounds, doubt's start) are compared on its clock.
        self.db_clock = db_clock or DatabaseClock(pool)

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
            granted = (
                self.call_limiter.acquire_some(len(remaining))
                if self.call_limiter is not None
                else len(remaining)
            )
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
        rows = start(
            self.pool,
            batch,
            lease_seconds=self.config.lease_seconds,
            processor=self.gateway.name,
            worker=self.worker,
        )
        counts.stale += len(batch) - len(rows)
        done = self._call_all(rows, lease_end)
        counts.calls += sum(1 for d in done if d.result.outcome is not Outcome.NOT_SENT)
        for i, item in enumerate(done):
            if item.decision.needs_lookup:
                done[i] = decide_by_lookup(self.gateway, item, now=self.db_clock.now())
                counts.looked_up += 1
        recorded = finish(
            self.pool,
            done,
            land_seconds=self.config.in_flight_bound_seconds,
            poll_seconds=self.config.gateway_poll_seconds,
        )
        self._report(done, recorded, counts)
        return done

    def _report(self, done: list[Finished], recorded: list[dict], counts: GroupCounts) -> None:
        """Count, log and page what a batch's finish recorded."""
        counts.moved += sum(1 for r in recorded if r["moved"])
        parked = {r["id"] for r in recorded if r["moved"] and r["status"] == Status.FAILED}
        for item in done:
            reason = item.decision.failure_reason
            if item.row["id"] in parked and reason in PARKED_REASONS:
                metrics.DEAD_LETTERS.labels(reason.value).inc()
                # A parked payment waits for a person: never an INFO line.
                # In doubt (it may have been charged) is an ERROR.
                log.log(
                    logging.ERROR if item.decision.in_doubt else logging.WARNING,
                    "payment %s parked %s%s after attempt %d (last error %s): "
                    "see `paycron dlq show %s`",
                    item.row["id"],
                    reason.value,
                    " in doubt" if item.decision.in_doubt else "",
                    item.row["attempt"],
                    item.result.error_code,
                    item.row["id"],
                )
            if item.row["id"] in parked and reason is FailureReason.GATEWAY_REJECTED:
                # Our parameters changed under a live key: a bug or an API
                # version change while in doubt; a human must look.
                log.error(
                    "the processor refused payment %s's parameters under its key "
                    "(%s): parked GATEWAY_REJECTED",
                    item.row["id"],
                    item.result.error_code,
                )
            name = item.result.outcome.value
            counts.outcomes[name] = counts.outcomes.get(name, 0) + 1
        if done and log.isEnabledFor(logging.INFO):
            # One line per batch, a logfmt segment per attempt: 2.5 us of CPU
            # per attempt where a line each took 11.6, besides the relay of
            # every line through Dramatiq's main process; grep `payment=<id>`
            # finds it as before.
            log.info(
                "attempts %s",
                "; ".join(
                    f"payment={item.row['id']} attempt={item.row['attempt']} "
                    f"outcome={item.result.outcome.value} error={item.result.error_code} "
                    f"status={item.decision.status.value}"
                    for item in done
                ),
            )

    def _call_all(self, rows: list[dict], lease_end: float) -> list[Finished]:
        if self.calls is None or len(rows) < 2:
            return [self._call(row, lease_end) for row in rows]
        # This thread makes the first call itself: one hand-off fewer.
        futures = [self.calls.submit(self._call, row, lease_end) for row in rows[1:]]
        first = self._call(rows[0], lease_end)
        return [first, *(f.result() for f in futures)]

    def looks_up_first(self, row: dict) -> bool:
        """Whether this row may be asked about by reference instead of called
        (leases kept expiring, or an old doubt): the rare, blocking path."""
        return row["in_doubt"] or policy.at_lease_expiry_limit(row["lease_expiries"], self.config)

    def _call(self, row: dict, lease_end: float) -> Finished:
        try:
            if policy.at_lease_expiry_limit(row["lease_expiries"], self.config):
                return self._look_up_before_parking(row)
            if self._key_may_be_forgotten(row):
                return self._look_up_instead(row)
        except Exception:  # a bug must not lose the group: nothing sent, asked again later
            log.exception("lookup instead of a call failed unexpectedly for %s", row["id"])
            return Finished(
                row,
                CallResult(Outcome.NOT_SENT, error_code="client_error"),
                Decision(
                    Status.PENDING,
                    delay=policy.LOOKUP_RECHECK_DELAY,
                    failures=row["failures"],
                    in_doubt=row["in_doubt"],
                    key_in_use=row["key_in_use"],
                ),
            )
        try:
            result = self._send(row, lease_end)
        except Exception:  # a bug must not lose the group: in doubt, asked again
            log.exception("gateway call failed unexpectedly for %s", row["id"])
            result = CallResult(Outcome.AMBIGUOUS, error_code="client_error", in_doubt=True)
        return self.decided(row, result)

    def decided(self, row: dict, result: CallResult) -> Finished:
        decision = policy.decide(
            result,
            failures=row["failures"],
            in_doubt=row["in_doubt"],
            key_in_use=row["key_in_use"],
            config=self.config,
        )
        return Finished(row, result, decision)

    def _key_may_be_forgotten(self, row: dict) -> bool:
        """Key retention (docs/design.md): a payment in doubt whose oldest unresolved
        call is so old that the processor may forget its key before this call
        lands must be looked up, not called (a forgotten key charges again)."""
        since = row.get("in_doubt_since")
        if not row["in_doubt"] or since is None:
            return False
        keep = self.config.gateway_key_retention_seconds - self.config.in_flight_bound_seconds
        return (self.db_clock.now() - since).total_seconds() > keep

    def _look_up_before_parking(self, row: dict) -> Finished:
        """A payment whose leases kept expiring with its call in flight: asked
        about by reference, never called again; parked unless the lookup
        finds its charge or the processor still processing it."""
        lookup = _ask(self.gateway, row, in_doubt=row["in_doubt"], now=self.db_clock.now())
        decision = policy.after_lease_expiry_limit(
            lookup, failures=row["failures"], in_doubt=row["in_doubt"]
        )
        return Finished(
            row,
            _found(lookup) or CallResult(Outcome.NOT_SENT, error_code="lease_expired_repeatedly"),
            decision,
        )

    def _look_up_instead(self, row: dict) -> Finished:
        """Decide an old doubt by lookup: charged completes; a conclusive none
        clears the doubt and moves the key to its next generation, to be
        called at once; an inconclusive one waits for the in-flight bound."""
        base = Decision(
            Status.PENDING, failures=row["failures"], in_doubt=True, key_in_use=row["key_in_use"]
        )
        now = self.db_clock.now()
        lookup = _ask(self.gateway, row, in_doubt=True, now=now)
        decision = policy.after_lookup(base, lookup)
        if lookup.answer is Answer.NONE and not lookup.conclusive:
            # asked again once the bound has passed (no bound recorded: later)
            bound = row["calls_land_by"]
            wait = 0.0 if bound is None else (bound - now).total_seconds()
            decision = replace(decision, delay=max(wait, policy.LOOKUP_RECHECK_DELAY))
        return Finished(
            row,
            _found(lookup) or CallResult(Outcome.NOT_SENT, error_code="key_retention_lookup"),
            decision,
        )

    def _send(self, row: dict, lease_end: float) -> CallResult:
        left = lease_end - self.clock()
        if left < MIN_SEND_SECONDS:
            return CallResult(Outcome.NOT_SENT, error_code="lease_too_short")
        self.late_by(row)
        started = time.monotonic()
        result = self.gateway.charge(
            charge_request(row), timeout=min(self.config.gateway_timeout_seconds, left)
        )
        self.called(result, time.monotonic() - started)
        return result

    def called(self, result: CallResult, elapsed: float) -> None:
        """A call's answer heard: paged, measured, its latency told."""
        if result.outcome is Outcome.AUTH_FAILED:
            # Our configuration is broken, not the payment: an operator is paged.
            log.error(
                "the processor refused our credentials (%s): check the API key", result.error_code
            )
        metrics.GATEWAY_LATENCY.observe(elapsed)
        metrics.GATEWAY_CALLS.labels(result.outcome.value).inc()
        if self.on_latency is not None:
            self.on_latency(elapsed)

    def late_by(self, row: dict) -> None:
        """A first attempt's lateness (due to sent), measured."""
        if row["attempt"] == 1:
            lateness = (datetime.now(UTC) - row["due_at"]).total_seconds()
            metrics.TRIGGER_LATENESS.observe(max(0.0, lateness))


def charge_request(row: dict) -> ChargeRequest:
    """The charge a started payment row asks for, under its key."""
    return ChargeRequest(
        reference=str(row["id"]),
        idempotency_key=gateway_key(row["id"], row["key_generation"]),
        amount=row["amount_minor"],
        currency=row["currency"].strip(),
        customer=row["customer"],
        payment_method=row["payment_method"],
        confirm=row["gateway_intent_id"],
    )
