"""The next-state policy: every rule that says where a payment goes next.

After a gateway call (:func:`decide`), after its lease expired
(:func:`after_lease_expiry`), and after a lookup by reference before parking
(:func:`after_lookup`). Pure functions of the payment's counters and what
happened, so every rule is table-tested without a database or a gateway
(tests/test_retry_policy.py); the transitions module only writes what these
decide, each write one guarded UPDATE.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from paycron.config import Config
from paycron.enums import FailureReason, Outcome, Status
from paycron.gateway_client import CallResult, Charge

#: A 429 without Retry-After waits this long (seconds) before the next claim.
DEFAULT_RATE_LIMIT_DELAY = 1.0
#: A 409 "key in use" is asked again after this, doubling per 409 in a row, capped.
KEY_IN_USE_DELAY = 1.0
KEY_IN_USE_MAX_DELAY = 60.0
#: After this many 409s in a row the payment is looked up by reference (SPEC §3).
KEY_IN_USE_LOOKUP_AFTER = 10


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


def backoff(failures: int, config: Config, rng: random.Random | None = None) -> float:
    """Delay after the ``failures``-th retryable failure: ``RETRY_DELAYS`` with
    ±``retry_jitter`` multiplicative jitter (so a burst of failures does not
    come back as a burst)."""
    rng = rng or random.Random()
    base = config.retry_delays[min(failures, len(config.retry_delays)) - 1]
    return base * rng.uniform(1 - config.retry_jitter, 1 + config.retry_jitter)


def decide(result: CallResult, *, failures: int, in_doubt: bool, config: Config,
           key_in_use: int = 0, rng: random.Random | None = None) -> Decision:
    """Where one call's result sends the payment (``failures``, ``in_doubt``
    and ``key_in_use`` as they were before the call)."""
    rng = rng or random.Random()
    if result.outcome is Outcome.KEY_IN_USE:
        # An earlier call with this key is still running at the processor:
        # not a failure (no budget), but a charge may be under way (in doubt).
        streak = key_in_use + 1
        # (the exponent is capped: a long streak must not overflow a float)
        delay = min(KEY_IN_USE_DELAY * 2 ** min(streak - 1, 16), KEY_IN_USE_MAX_DELAY)
        return Decision(Status.PENDING, delay=delay * rng.uniform(1, 1.5), failures=failures,
                        in_doubt=True, key_in_use=streak,
                        needs_lookup=streak >= KEY_IN_USE_LOOKUP_AFTER)
    if result.outcome is Outcome.NOT_SENT:
        # Nothing left us: no budget, doubt unchanged, claim again at once.
        return Decision(Status.PENDING, failures=failures, in_doubt=in_doubt)
    if result.outcome is Outcome.SUCCEEDED:
        return Decision(Status.COMPLETED, failures=failures)
    if result.outcome is Outcome.DECLINED:
        # A decline is a definitive answer: nothing is in doubt any more.
        return Decision(Status.FAILED, failures=failures,
                        failure_reason=FailureReason.DECLINED)
    if result.outcome is Outcome.RATE_LIMITED:
        # Definitive non-charge: no budget used, doubt unchanged.
        delay = result.retry_after or DEFAULT_RATE_LIMIT_DELAY
        return Decision(Status.PENDING, delay=delay * rng.uniform(1, 1.5),
                        failures=failures, in_doubt=in_doubt)
    failures += 1
    in_doubt = in_doubt or result.in_doubt
    if failures >= config.max_gateway_calls:
        return Decision(Status.FAILED, failures=failures, in_doubt=in_doubt,
                        failure_reason=FailureReason.RETRIES_EXHAUSTED, needs_lookup=in_doubt)
    return Decision(Status.PENDING, delay=backoff(failures, config, rng), failures=failures,
                    in_doubt=in_doubt)


def after_lease_expiry(*, lease_expiries: int, failures: int, in_doubt: bool,
                       call_in_flight: bool, config: Config) -> Decision:
    """A PROCESSING payment whose lease ran out (its worker died or hung).

    Back to PENDING at once (``run_at`` is kept: it is overdue), in doubt if
    its call was in flight (the call may have landed; the next attempt asks
    again under the same key). The ``MAX_LEASE_EXPIRIES``-th expiry parks it:
    a payment that kills its worker every time must not loop forever.
    Expiries cost no budget: the call may never have been made.
    """
    in_doubt = in_doubt or call_in_flight
    if lease_expiries + 1 >= config.max_lease_expiries:
        return Decision(Status.FAILED, failures=failures, in_doubt=in_doubt,
                        failure_reason=FailureReason.LEASE_EXPIRED_REPEATEDLY)
    return Decision(Status.PENDING, failures=failures, in_doubt=in_doubt)


#: Charge statuses that mean the money moved: a refund is recorded, never
#: taken as "not charged" (SPEC §3).
CHARGED_STATUSES = frozenset({"succeeded", "refunded"})


def proves_charge(charge: Charge | None, *, payment_id: str, amount: int,
                  currency: str) -> bool:
    """Whether a charge found by reference is this payment's, charged: its
    reference, amount and currency must match and its status say the money
    moved. Anything else (none, another amount, a failed or pending charge)
    proves nothing, and the payment stays in doubt."""
    return (charge is not None and charge.reference == payment_id
            and charge.status in CHARGED_STATUSES and charge.amount == amount
            and charge.currency.upper() == currency.upper())


def after_lookup(decision: Decision, *, charged: bool) -> Decision:
    """A payment in doubt was asked about by reference (before parking, or
    after 10 "key in use" answers): a charge found completes it (doubt
    settled); none found leaves the decision as it was, still in doubt (a call
    may still land)."""
    if charged:
        return Decision(Status.COMPLETED, failures=decision.failures)
    return replace(decision, needs_lookup=False)
