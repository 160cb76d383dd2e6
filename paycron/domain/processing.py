"""What a processor is asked and what it answers, as plain values: the
request of a charge or a lookup, the result of a call, a processor-side
payment and a refund. Every processor adapter maps its wire answers to
these, so the policy and the engine never interpret HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from paycron.domain.enums import FailureReason, Outcome


@dataclass(frozen=True)
class ChargeRequest:
    """One charge call. ``reference`` is the payment id, carried by every key
    generation as the processor-side reference; ``confirm`` names a
    processor-side payment to confirm again (a retried decline) instead of
    making a new one."""

    reference: str
    idempotency_key: str
    amount: int
    currency: str
    customer: str | None = None
    payment_method: str | None = None
    confirm: str | None = None


@dataclass(frozen=True)
class CallResult:
    """What one charge call ended as.

    ``in_doubt``: the call may have charged without telling us (timeout,
    dropped connection, 5xx, 409). ``gateway_ref``: the processor-side
    payment the call made or used (also on a decline, so a retry can confirm
    it again). ``retry_decline``: the processor advises trying the decline
    again later. ``failure_reason``: a definitive refusal's reason where it
    is not a plain decline. Whether it uses budget is the policy's rule
    (paycron/domain/policy.py), not the call's.
    """

    outcome: Outcome
    gateway_ref: str | None = None
    error_code: str | None = None
    in_doubt: bool = False
    retry_after: float | None = None
    retry_decline: bool = False
    failure_reason: FailureReason | None = None
    replayed: bool = False  # the processor's stored answer to an earlier call with the key
    lookup_first: bool = False  # resolve by lookup before calling again (a stored 5xx)

    @property
    def may_land(self) -> bool:
        """A call of this payment may still charge after we stopped waiting:
        this one (sent, no definitive answer, not the replay of an earlier
        answer), or the one a 409 says is running under the key right now
        (it lands within the same bound of this call's start). It moves the
        payment's in-flight bound."""
        return (
            self.in_doubt
            and not self.replayed
            and self.outcome in (Outcome.RETRYABLE_ERROR, Outcome.AMBIGUOUS, Outcome.KEY_IN_USE)
        )

    @property
    def breaker_failure(self) -> bool:
        """It counts against the processor's health (429s and declines do not;
        a refused API key does: nothing can succeed until it is fixed)."""
        return self.outcome in (Outcome.RETRYABLE_ERROR, Outcome.AMBIGUOUS, Outcome.AUTH_FAILED)


#: Processor-side statuses, as every adapter reports them.
SUCCEEDED, REFUNDED, PROCESSING, FAILED = "succeeded", "refunded", "processing", "failed"


@dataclass(frozen=True)
class Charge:
    """A processor-side payment carrying a payment id as its reference.

    ``status`` is one of SUCCEEDED, REFUNDED (charged, since refunded or
    disputed), PROCESSING (accepted, outcome later) or FAILED (no money moved:
    declined, cancelled, abandoned), whatever the processor calls them."""

    id: str
    reference: str
    amount: int
    currency: str
    status: str
    customer: str | None = None
    idempotency_key: str | None = None
    created_at: datetime | None = None

    @property
    def day(self) -> date:
        """The settlement day the charge belongs to (its UTC created date)."""
        assert self.created_at is not None
        return self.created_at.date()

    def as_detail(self) -> dict:
        """The charge as evidence in a reconciliation item's ``detail``."""
        return {
            "chargeId": self.id,
            "idempotencyKey": self.idempotency_key,
            "reference": self.reference,
            "amount": self.amount,
            "currency": self.currency,
            "status": self.status,
            "createdAt": self.created_at.isoformat() if self.created_at else None,
        }


@dataclass(frozen=True)
class LookupRequest:
    """Ask the processor for every payment it holds for ``reference``, under
    any key generation: a strongly consistent read. ``customer`` and
    ``since`` (the payment's first call, or its creation) narrow it where the
    processor lists by customer (Stripe)."""

    reference: str
    customer: str | None = None
    since: datetime | None = None


@dataclass(frozen=True)
class Refund:
    id: str
    amount: int
    idempotency_key: str
