"""The processor interface the engine sees.

Execution, dead letters and reconciliation speak only this; each processor
is one sub-package implementing it (:mod:`paycron.processors.card`,
:mod:`paycron.processors.stripe`), built by
:func:`paycron.processors.factory.build_processor` in a process's composition
root. The requests and answers it carries are the domain's values
(:mod:`paycron.domain.processing`).
"""

from __future__ import annotations

from datetime import date
from typing import Protocol, runtime_checkable

from paycron.domain.processing import CallResult, Charge, ChargeRequest, LookupRequest, Refund


class Processor(Protocol):
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


class TakeToken(Protocol):
    """Take a token from the shared per-second window of processor calls,
    waiting for one; with ``within`` (seconds), no longer than that: past it,
    :class:`~paycron.errors.GatewayError` (nothing was sent)."""

    def __call__(self, within: float | None = None) -> None: ...


@runtime_checkable
class PaymentMethodOwners(Protocol):
    """A processor that can say which customer a payment method belongs to
    (Stripe: a PaymentMethod's ``customer``). Processors without customers
    (the fake card processor) do not implement it, and nothing is checked."""

    def payment_method_customer(self, payment_method: str, *, timeout: float) -> str | None:
        """The customer the method is attached to, or None while it is
        attached to none. Raises :class:`~paycron.errors.ProcessorPaymentMissing`
        when the processor holds no such method, and
        :class:`~paycron.errors.GatewayError` when it cannot tell within
        ``timeout`` seconds: the wait for a call token and the call together
        end by then."""
