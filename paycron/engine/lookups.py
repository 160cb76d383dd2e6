"""Asking the processor about one payment by reference (SPEC §3's lookups).

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
from paycron.processors.base import Gateway

#: Listed from the payment's due time less this (clock skew between us and
#: the processor): no call of a payment is made before it is due.
CLOCK_SKEW = timedelta(hours=1)


def conclusive_at(payment: Mapping) -> datetime | None:
    """When a lookup that finds nothing becomes conclusive: the in-flight
    bound; None when it already is (never in doubt, or no call ever made)."""
    if not payment["in_doubt"]:
        return None
    return payment.get("calls_land_by")


def is_conclusive(payment: Mapping, now: datetime) -> bool:
    """Whether a *none* is conclusive at ``now`` — the database's clock
    (paycron/store/clock.py), which wrote the bound: never an app host's."""
    at = conclusive_at(payment)
    return at is None or now >= at


def look_up(gateway: Gateway, payment: Mapping, *, now: datetime) -> Lookup:
    """What the processor holds for ``payment`` (a row of ``payments``: id,
    amount_minor, currency, customer, due_at, in_doubt, calls_land_by), with
    ``now`` the database's clock read before asking (a *none* is judged as
    of then: erring on the side of inconclusive).
    Raises :class:`~paycron.errors.GatewayError` when it cannot be asked."""
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
