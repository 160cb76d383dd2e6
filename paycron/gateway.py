"""The processor interface the engine sees, with typed requests and answers.

Execution, dead letters and reconciliation speak only this; each processor
is one adapter module (:mod:`paycron.gateway_client` for the fake gateway,
:mod:`paycron.stripe_gateway` for Stripe) built by :func:`build_gateway` in
a process's composition root. Every answer of a processor maps to one
:class:`CallResult`, so the worker never interprets HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Protocol

import redis

from paycron.config import Config
from paycron.enums import FailureReason, Outcome
from paycron.pacing import CallLimiter

log = logging.getLogger("paycron.gateway")


def gateway_key(payment_id: object, generation: int) -> str:
    """The idempotency key of a payment's key generation (SPEC §3): the
    payment id for the first, ``<id>:<n>`` after."""
    return str(payment_id) if generation <= 1 else f"{payment_id}:{generation}"


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
    (paycron/policy.py), not the call's.
    """

    outcome: Outcome
    gateway_ref: str | None = None
    error_code: str | None = None
    in_doubt: bool = False
    retry_after: float | None = None
    retry_decline: bool = False
    failure_reason: FailureReason | None = None
    replayed: bool = False  # the processor's stored answer to an earlier call with the key
    look_up: bool = False  # resolve by lookup before calling again (a stored 5xx)

    @property
    def may_land(self) -> bool:
        """A call of this payment may still charge after we stopped waiting:
        this one (sent, no definitive answer, not the replay of an earlier
        answer), or the one a 409 says is running under the key right now
        (it lands within the same bound of this call's start). It moves the
        payment's in-flight bound."""
        return (self.in_doubt and not self.replayed and self.outcome in (
            Outcome.RETRYABLE_ERROR, Outcome.AMBIGUOUS, Outcome.KEY_IN_USE))

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
        return {"chargeId": self.id, "idempotencyKey": self.idempotency_key,
                "reference": self.reference, "amount": self.amount, "currency": self.currency,
                "status": self.status,
                "createdAt": self.created_at.isoformat() if self.created_at else None}


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


class Gateway(Protocol):
    #: The processor's name, recorded on every payment it is called for.
    name: str

    def charge(self, request: ChargeRequest, *, timeout: float | None = None) -> CallResult:
        """One charge call; ``timeout`` (seconds, total) shortens the
        configured one, so a call never outlives its lease."""

    def find_charges(self, request: LookupRequest) -> list[Charge]:
        """Every payment the processor holds for the reference (raises
        :class:`~paycron.errors.GatewayError` when it cannot tell)."""

    def retrieve(self, charge_id: str) -> Charge:
        """One processor-side payment as the processor holds it now (a
        strongly consistent read; raises GatewayError when it cannot tell)."""

    def refund(self, charge: Charge) -> Refund:
        """Refund a charge, keyed from what it refunds (so a retry refunds once)."""

    def settlement_report(self, day: date) -> list[Charge]:
        """Every charge the processor created on ``day`` (UTC), any status."""

    def close(self) -> None: ...


def build_gateway(config: Config, *, max_connections: int = 64,
                  call_limiter: CallLimiter | None = None) -> Gateway:
    """The processor adapter this configuration names, for a composition root.
    ``call_limiter``: the shared per-second window every request that is not
    a charge (lookups, refunds, report pages) takes a token from."""
    if config.gateway == "stripe":
        from paycron.stripe_gateway import StripeGateway

        return StripeGateway.from_config(config, max_connections=max_connections,
                                         take_token=_token_taker(call_limiter))
    from paycron.gateway_client import HttpGateway

    return HttpGateway(config.gateway_url, timeout=config.gateway_timeout_seconds,
                       max_connections=max_connections)


def _token_taker(limiter: CallLimiter | None) -> Callable[[], None] | None:
    if limiter is None:
        return None

    def take() -> None:
        try:
            limiter.acquire_some(1)
        except redis.RedisError as exc:  # an operator's lookup must not wait on Redis
            log.warning("call window unavailable (%s): request sent unpaced",
                        type(exc).__name__)

    return take
