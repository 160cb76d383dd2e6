"""The retry policy: which failure leads where, and when the next try is.

Pure functions of the payment's counters and the call's result, so the
decision is testable without a database or a gateway.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from paycron.config import Config
from paycron.enums import FailureReason, Outcome, Status
from paycron.gateway_client import CallResult

#: A 429 without Retry-After waits this long (seconds) before the next claim.
DEFAULT_RATE_LIMIT_DELAY = 1.0


@dataclass(frozen=True)
class Decision:
    """The payment's next state after one call."""

    status: Status
    delay: float = 0.0  # seconds until run_at, when PENDING
    failures: int = 0
    in_doubt: bool = False
    failure_reason: FailureReason | None = None
    needs_lookup: bool = False  # exhausted while in doubt: ask the gateway first


def backoff(failures: int, config: Config, rng: random.Random | None = None) -> float:
    """Delay after the ``failures``-th retryable failure: ``RETRY_DELAYS`` with
    ±``retry_jitter`` multiplicative jitter (so a burst of failures does not
    come back as a burst)."""
    rng = rng or random.Random()
    base = config.retry_delays[min(failures, len(config.retry_delays)) - 1]
    return base * rng.uniform(1 - config.retry_jitter, 1 + config.retry_jitter)


def decide(result: CallResult, *, failures: int, in_doubt: bool, config: Config) -> Decision:
    """Where one call's result sends the payment (``failures``/``in_doubt`` as
    they were before the call)."""
    if result.outcome is Outcome.SUCCEEDED:
        return Decision(Status.COMPLETED, failures=failures)
    if result.outcome is Outcome.DECLINED:
        # A decline is a definitive answer: nothing is in doubt any more.
        return Decision(Status.FAILED, failures=failures,
                        failure_reason=FailureReason.DECLINED)
    if result.outcome is Outcome.RATE_LIMITED:
        # Definitive non-charge: no budget used, doubt unchanged.
        delay = result.retry_after or DEFAULT_RATE_LIMIT_DELAY
        return Decision(Status.PENDING, delay=delay * random.uniform(1, 1.5),
                        failures=failures, in_doubt=in_doubt)
    failures += 1
    in_doubt = in_doubt or result.in_doubt
    if failures >= config.max_gateway_calls:
        return Decision(Status.FAILED, failures=failures, in_doubt=in_doubt,
                        failure_reason=FailureReason.RETRIES_EXHAUSTED, needs_lookup=in_doubt)
    return Decision(Status.PENDING, delay=backoff(failures, config), failures=failures,
                    in_doubt=in_doubt)
