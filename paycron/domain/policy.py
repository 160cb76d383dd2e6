"""The next-state policy: every rule that says where a payment goes next.

After a gateway call (:func:`decide`), after its lease expired
(:func:`after_lease_expiry`), and after a lookup by reference
(:func:`judge_lookup` gives its four answers, :func:`after_lookup` where they
send the payment). Pure functions of the payment's counters and what
happened, so every rule is table-tested without a database or a gateway
(tests/domain/test_retry_policy.py); the transitions module only writes what these
decide, each write one guarded UPDATE.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from paycron.config import Config
from paycron.domain.enums import FailureReason, Outcome, Status
from paycron.domain.processing import FAILED, PROCESSING, REFUNDED, SUCCEEDED, CallResult, Charge

#: A 429 without Retry-After waits this long (seconds) before the next claim.
DEFAULT_RATE_LIMIT_DELAY = 1.0
#: A 409 "key in use" is asked again after this, doubling per 409 in a row, capped.
KEY_IN_USE_DELAY = 1.0
KEY_IN_USE_MAX_DELAY = 60.0
#: After this many 409s in a row the payment is looked up by reference (SPEC §3).
KEY_IN_USE_LOOKUP_AFTER = 10
#: An old doubt whose lookup is not yet conclusive is asked about again after at least this.
LOOKUP_RECHECK_DELAY = 300.0
#: A payment AWAITING_GATEWAY without its event is polled after
#: GATEWAY_POLL_SECONDS, then after these multiples of it, then every last
#: one: with the default 5 min, SPEC §12's 5 min, 30 min, 2 h, every 12 h.
POLL_BACKOFF = (6, 24, 144)
#: Still processing after this long pages (SEPA can take 14 business days).
AWAITING_PAGE_AFTER = 21 * 86400.0


def next_poll_delay(polls: int, config: Config) -> float:
    """Seconds until the next retrieve of a waiting payment polled ``polls`` times."""
    if polls <= 0:
        return config.gateway_poll_seconds
    return config.gateway_poll_seconds * POLL_BACKOFF[min(polls, len(POLL_BACKOFF)) - 1]


def poll_intervals(config: Config) -> list[float]:
    """The waits after the 1st, 2nd, ... poll (the last repeats)."""
    return [next_poll_delay(n, config) for n in range(1, len(POLL_BACKOFF) + 1)]


class Settlement(StrEnum):
    """What a retrieved processor-side payment says of a payment waiting on it."""

    COMPLETED = "completed"
    FAILED = "failed"
    WAITING = "waiting"


def settlement_of(charge: Charge) -> Settlement:
    """A waiting payment's processor-side payment, retrieved: charged (also
    since refunded) completes it, failed fails it (DECLINED, not retried: the
    payer decides), anything else waits."""
    if charge.status in CHARGED_STATUSES:
        return Settlement.COMPLETED
    if charge.status == FAILED:
        return Settlement.FAILED
    return Settlement.WAITING


#: Drawn from when a caller passes no rng (one generator, not one per call).
_RNG = random.Random()


@dataclass(frozen=True)
class Decision:
    """The payment's next state."""

    status: Status
    delay: float = 0.0  # seconds until run_at, when PENDING
    failures: int = 0
    in_doubt: bool = False
    failure_reason: FailureReason | None = None
    needs_lookup: bool = False  # ask the gateway by reference before writing this
    key_in_use: int = 0  # 409 "key in use" answers in a row
    next_key: bool = False  # move the idempotency key to its next generation
    confirm: str | None = None  # the processor-side payment the next call confirms again


def backoff(failures: int, config: Config, rng: random.Random | None = None) -> float:
    """Delay after the ``failures``-th retryable failure: ``RETRY_DELAYS`` with
    ±``retry_jitter`` multiplicative jitter (so a burst of failures does not
    come back as a burst)."""
    rng = rng or _RNG
    base = config.retry_delays[min(failures, len(config.retry_delays)) - 1]
    return base * rng.uniform(1 - config.retry_jitter, 1 + config.retry_jitter)


def decide(
    result: CallResult,
    *,
    failures: int,
    in_doubt: bool,
    config: Config,
    key_in_use: int = 0,
    rng: random.Random | None = None,
) -> Decision:
    """Where one call's result sends the payment (``failures``, ``in_doubt``
    and ``key_in_use`` as they were before the call)."""
    rng = rng or _RNG
    outcome = result.outcome
    if outcome is Outcome.KEY_IN_USE:
        # An earlier call with this key is still running at the processor:
        # not a failure (no budget), but a charge may be under way (in doubt).
        streak = key_in_use + 1
        # (the exponent is capped: a long streak must not overflow a float)
        delay = min(KEY_IN_USE_DELAY * 2 ** min(streak - 1, 16), KEY_IN_USE_MAX_DELAY)
        return Decision(
            Status.PENDING,
            delay=delay * rng.uniform(1, 1.5),
            failures=failures,
            in_doubt=True,
            key_in_use=streak,
            needs_lookup=streak >= KEY_IN_USE_LOOKUP_AFTER,
        )
    if outcome is Outcome.NOT_SENT:
        # Nothing left us: no budget, doubt and the 409 streak unchanged, claim again at once.
        return Decision(Status.PENDING, failures=failures, in_doubt=in_doubt, key_in_use=key_in_use)
    if outcome is Outcome.RATE_LIMITED:
        # Definitive non-charge: no budget used, doubt unchanged.
        delay = result.retry_after or DEFAULT_RATE_LIMIT_DELAY
        return Decision(
            Status.PENDING,
            delay=delay * rng.uniform(1, 1.5),
            failures=failures,
            in_doubt=in_doubt,
            key_in_use=key_in_use,
        )
    if outcome is Outcome.AUTH_FAILED:
        # Our credentials, not the payment: no budget, nothing parked; wait as
        # long as the breaker stays open (the operator fixes the key).
        delay = config.circuit_open_seconds * rng.uniform(1, 1.5)
        return Decision(
            Status.PENDING, delay=delay, failures=failures, in_doubt=in_doubt, key_in_use=key_in_use
        )
    if outcome is Outcome.SUCCEEDED:
        return Decision(Status.COMPLETED, failures=failures)
    if outcome is Outcome.SUBMITTED:
        # Accepted; the processor settles it later (a bank debit): it waits,
        # fenced on that processor-side payment, for the event or the poller.
        return Decision(Status.AWAITING_GATEWAY, failures=failures)
    if outcome is Outcome.DECLINED:
        # A decline is a definitive answer under this key: nothing is in doubt.
        if result.retry_decline and failures + 1 < config.max_gateway_calls:
            # The processor advises trying again later: within the budget, the
            # same processor-side payment confirmed again under the next key
            # (the processor replays the decline for this one).
            return Decision(
                Status.PENDING,
                delay=backoff(failures + 1, config, rng),
                failures=failures + 1,
                next_key=True,
                confirm=result.gateway_ref,
            )
        return Decision(
            Status.FAILED,
            failures=failures,
            failure_reason=result.failure_reason or FailureReason.DECLINED,
        )
    if outcome is Outcome.REJECTED:
        # Refused before executing: no charge under this request. Our
        # parameters changed under a live key (GATEWAY_REJECTED) may have
        # charged under the first ones, and every path from doubt to FAILED
        # goes through a lookup.
        reason = result.failure_reason or FailureReason.INVALID_REQUEST
        return Decision(
            Status.FAILED,
            failures=failures,
            in_doubt=in_doubt,
            failure_reason=reason,
            needs_lookup=in_doubt or reason is FailureReason.GATEWAY_REJECTED,
        )
    failures += 1
    in_doubt = in_doubt or result.in_doubt
    if failures >= config.max_gateway_calls:
        return Decision(
            Status.FAILED,
            failures=failures,
            in_doubt=in_doubt,
            failure_reason=FailureReason.RETRIES_EXHAUSTED,
            needs_lookup=in_doubt,
        )
    # A stored 5xx replayed for the key (Stripe) says nothing new: resending
    # gets it again, so it is resolved by lookup.
    return Decision(
        Status.PENDING,
        delay=backoff(failures, config, rng),
        failures=failures,
        in_doubt=in_doubt,
        needs_lookup=result.look_up,
    )


def after_lease_expiry(
    *, lease_expiries: int, failures: int, in_doubt: bool, call_in_flight: bool, config: Config
) -> Decision:
    """A PROCESSING payment whose lease ran out (its worker died or hung).

    Back to PENDING at once (``run_at`` is kept: it is overdue), in doubt if
    its call was in flight (the call may have landed; the next attempt asks
    again under the same key). Only an expiry whose call was in flight
    counts toward ``MAX_LEASE_EXPIRIES`` (:func:`counts_expiry`): a claim that
    never got its attempt row made no call (a lost message, workers that
    crash before they start), and parking those would park every due
    payment after a bad deploy. Expiries cost no budget.

    The ``MAX_LEASE_EXPIRIES``-th counted expiry parks nothing by itself: its
    call may have charged, and every path from doubt to FAILED goes through
    a lookup. The payment goes back to PENDING and its next claim looks it
    up instead of calling (:func:`after_lease_expiry_limit`). Only if that
    claim's lease expires too (the lookup itself hung) is it parked here,
    in doubt, its event saying the outcome is unknown: a payment that kills
    its worker every time must not loop forever.
    """
    in_doubt = in_doubt or call_in_flight
    if counts_expiry(call_in_flight) and lease_expiries + 1 > config.max_lease_expiries:
        return Decision(
            Status.FAILED,
            failures=failures,
            in_doubt=in_doubt,
            failure_reason=FailureReason.LEASE_EXPIRED_REPEATEDLY,
        )
    return Decision(Status.PENDING, failures=failures, in_doubt=in_doubt)


def at_lease_expiry_limit(lease_expiries: int, config: Config) -> bool:
    """A claim of a payment whose counted lease expiries reached the limit
    is looked up, never called (:func:`after_lease_expiry_limit`)."""
    return lease_expiries >= config.max_lease_expiries


def after_lease_expiry_limit(lookup: Lookup, *, failures: int, in_doubt: bool) -> Decision:
    """A payment at the lease-expiry limit, looked up by reference: charged
    completes it, processing waits for the processor, a mismatch parks it
    for a human; *none* parks it ``LEASE_EXPIRED_REPEATEDLY``, in doubt
    unless the lookup was conclusive (its event then says the outcome is
    unknown: a charge may exist)."""
    parked = Decision(
        Status.FAILED,
        failures=failures,
        in_doubt=in_doubt,
        failure_reason=FailureReason.LEASE_EXPIRED_REPEATEDLY,
    )
    return after_lookup(parked, lookup)


def counts_expiry(call_in_flight: bool) -> bool:
    """Whether a lease expiry counts in ``lease_expiries``: only when its
    attempt's call was in flight (the worker started it and never finished)."""
    return call_in_flight


#: Charge statuses that mean the money moved: a refund is recorded, never
#: taken as "not charged" (SPEC §3).
CHARGED_STATUSES = frozenset({SUCCEEDED, REFUNDED})


class Answer(StrEnum):
    """A lookup's four answers (SPEC §3)."""

    CHARGED = "charged"  # the processor holds this payment, charged (also since refunded)
    PROCESSING = "processing"  # accepted there, outcome later
    MISMATCHED = "mismatched"  # a payment for this id with another amount/currency/customer
    NONE = "none"


@dataclass(frozen=True)
class Lookup:
    """What a lookup found. ``conclusive``: for NONE, every call of the
    payment is past its in-flight bound, so nothing can still land.
    ``charge``: the processor-side payment that decided it. ``extra``:
    further charged ones for the same payment id (two charges: page)."""

    answer: Answer
    conclusive: bool = True
    charge: Charge | None = None
    extra: tuple[Charge, ...] = ()

    @property
    def found(self) -> Charge:
        """The charge that decided a CHARGED, MISMATCHED or PROCESSING answer
        (each carries one; only NONE has none)."""
        if self.charge is None:
            raise ValueError(f"a lookup answering {self.answer.value!r} holds no charge")
        return self.charge


def _matches(charge: Charge, *, amount: int, currency: str, customer: str | None) -> bool:
    return (
        charge.amount == amount
        and charge.currency.upper() == currency.upper()
        and (customer is None or charge.customer is None or charge.customer == customer)
    )


def judge_lookup(
    found: Sequence[Charge],
    *,
    payment_id: str,
    amount: int,
    currency: str,
    customer: str | None = None,
    conclusive: bool,
) -> Lookup:
    """The answer of everything the processor holds for ``payment_id`` (every
    key generation): charged (amount, currency and customer match) beats
    mismatched beats processing beats none. A charge for another reference,
    a failed or cancelled one prove nothing; *none* counts as an absence only
    when ``conclusive``."""
    own = [c for c in found if c.reference == payment_id]
    fits = [c for c in own if _matches(c, amount=amount, currency=currency, customer=customer)]
    live = [c for c in own if c.status in CHARGED_STATUSES or c.status == PROCESSING]
    charged = [c for c in fits if c.status in CHARGED_STATUSES]
    if charged:
        extra = tuple(c for c in own if c.status in CHARGED_STATUSES and c is not charged[0])
        return Lookup(Answer.CHARGED, charge=charged[0], extra=extra)
    wrong = [c for c in live if c not in fits]
    if wrong:
        return Lookup(Answer.MISMATCHED, charge=wrong[0])
    processing = [c for c in fits if c.status == PROCESSING]
    if processing:
        return Lookup(Answer.PROCESSING, charge=processing[0])
    return Lookup(Answer.NONE, conclusive=conclusive)


def after_lookup(decision: Decision, lookup: Lookup) -> Decision:
    """A payment was asked about by reference before ``decision`` is written
    (parking in doubt, ten "key in use" answers, a rejected request, an old
    key): *charged* completes it; *mismatched* parks it for a human and never
    moves its key; *processing* makes it wait for the processor
    (AWAITING_GATEWAY, on the payment found); *none*
    leaves the decision as it was (in doubt kept: a call may still land)
    unless conclusive, which settles the doubt and moves a key that is to be
    used again to its next generation."""
    if lookup.answer is Answer.CHARGED:
        return Decision(Status.COMPLETED, failures=decision.failures)
    if lookup.answer is Answer.MISMATCHED:
        return Decision(
            Status.FAILED,
            failures=decision.failures,
            in_doubt=decision.in_doubt,
            failure_reason=FailureReason.LOOKUP_MISMATCH,
        )
    if lookup.answer is Answer.PROCESSING:
        return Decision(Status.AWAITING_GATEWAY, failures=decision.failures)
    if not lookup.conclusive:
        return replace(decision, needs_lookup=False)
    if decision.status is Status.PENDING:
        # Nothing can land any more: asked again at once, under a new key.
        return replace(
            decision, needs_lookup=False, in_doubt=False, key_in_use=0, next_key=True, delay=0.0
        )
    return replace(decision, needs_lookup=False, in_doubt=False, key_in_use=0)
