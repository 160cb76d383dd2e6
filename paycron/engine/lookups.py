"""Asking the processor about one payment by reference (docs/design.md's lookups).

One function for every caller (a worker before parking, a re-drive, a
refund, reconciliation): it lists what the processor holds for the payment
id under any key generation, and :func:`paycron.domain.policy.judge_lookup` gives
the answer. *None* is conclusive only once the payment's in-flight bound
(``calls_land_by``) has passed, or when no call of it was ever in doubt.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from paycron.domain.policy import Lookup, judge_lookup
from paycron.domain.processing import LookupRequest
from paycron.errors import OtherProcessor
from paycron.processors.base import Processor

#: Listed from the payment's due time less this (clock skew between us and
#: the processor): no call of a payment is made before it is due.
CLOCK_SKEW = timedelta(hours=1)


def conclusive_at(payment: Mapping) -> datetime | None:
    """When a lookup that finds nothing becomes conclusive: the in-flight
    bound; None when it already is (never in doubt) or when it is not known
    (in doubt with no recorded bound: :func:`is_conclusive` says never)."""
    if not payment["in_doubt"]:
        return None
    return payment.get("calls_land_by")


def is_conclusive(payment: Mapping, now: datetime) -> bool:
    """A *none* is conclusive when the payment is not in doubt, or once its
    in-flight bound has passed at ``now`` — the database's clock
    (paycron/store/clock.py), which wrote the bound: never an app host's. In
    doubt with no bound recorded (a row from before the bound was kept, until
    the migration that backfills it ran) is never conclusive: an old call may
    still land."""
    if not payment["in_doubt"]:
        return True
    at = payment.get("calls_land_by")
    return at is not None and now >= at


def check_processor(gateway: Processor, payment: Mapping) -> None:
    """Only the processor that saw a payment's calls can say what it holds:
    another processor's "nothing" is no answer, and taking it for one would
    move the key on and charge again. Raises
    :class:`~paycron.errors.OtherProcessor` when ``payment`` was called at
    another processor than ``gateway`` (a payment never called has none)."""
    own = payment.get("processor")
    if own is not None and own != gateway.name:
        raise OtherProcessor(own, gateway.name)


def ask_processor(gateway: Processor, payment: Mapping, *, now: datetime) -> Lookup:
    """What the processor holds for ``payment`` (a row of ``payments``: id,
    amount_minor, currency, customer, due_at, in_doubt, calls_land_by,
    processor), with ``now`` the database's clock read before asking (a
    *none* is judged as of then: erring on the side of inconclusive). Raises
    :class:`~paycron.errors.GatewayError` when it cannot be asked,
    :class:`~paycron.errors.OtherProcessor` (one) when ``gateway`` is not the
    payment's own processor."""
    check_processor(gateway, payment)
    payment_id = str(payment["id"])
    found = gateway.find_charges(
        LookupRequest(
            reference=payment_id,
            customer=payment.get("customer"),
            since=payment["due_at"] - CLOCK_SKEW,
        )
    )
    return judge_lookup(
        found,
        payment_id=payment_id,
        amount=payment["amount_minor"],
        currency=payment["currency"].strip(),
        customer=payment.get("customer"),
        conclusive=is_conclusive(payment, now),
    )
