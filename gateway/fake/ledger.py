"""The ledger: every charge ever made, and its refund; the truth tests check against.

Charges keep their reference forever (keys do not), so a client can always
find out whether a payment was charged.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from gateway.fake.errors import AlreadyRefunded, ChargeMissing, RefundExceedsCharge

#: The fields of a charge in `entries()` (the `/_ledger` shape).
LEDGER_FIELDS = (
    "id",
    "idempotency_key",
    "reference",
    "amount",
    "currency",
    "status",
    "created_at",
)

Charge = dict[str, Any]


class Ledger:
    """Charges indexed by id, by reference and by UTC day."""

    def __init__(self) -> None:
        self._charges: dict[str, Charge] = {}
        self._by_reference: defaultdict[str, list[Charge]] = defaultdict(list)
        self._by_day: defaultdict[str, list[Charge]] = defaultdict(list)

    def record_charge(self, *, key: str, amount: int, currency: str, reference: str) -> Charge:
        """Make a succeeded charge and return it."""
        created_at = datetime.now(UTC).isoformat()
        charge = {
            "id": "ch_" + secrets.token_hex(12),
            "status": "succeeded",
            "amount": amount,
            "currency": currency,
            "reference": reference,
            "idempotency_key": key,
            "created_at": created_at,
            "refunded_at": None,
            "amount_refunded": 0,
        }
        self._charges[charge["id"]] = charge
        self._by_reference[reference].append(charge)
        self._by_day[created_at[:10]].append(charge)  # the UTC day, YYYY-MM-DD
        return charge

    def refund(self, charge_id: str, amount: int | None) -> dict[str, Any]:
        """Refund a charge by `amount` (None: all of it) and return the refund.

        A charge is refunded at most once; raises `ChargeMissing`,
        `AlreadyRefunded` or `RefundExceedsCharge` and changes nothing.
        """
        charge = self.get(charge_id)
        if charge is None:
            raise ChargeMissing("no such charge")
        if charge["status"] == "refunded":
            raise AlreadyRefunded("the charge is already refunded")
        if amount is None:
            amount = charge["amount"]
        elif amount > charge["amount"]:
            raise RefundExceedsCharge("amount exceeds the charge")
        now = datetime.now(UTC).isoformat()
        charge["status"] = "refunded"
        charge["refunded_at"] = now
        charge["amount_refunded"] = amount
        return {
            "id": "re_" + secrets.token_hex(12),
            "charge": charge["id"],
            "amount": amount,
            "currency": charge["currency"],
            "status": "succeeded",
            "created_at": now,
        }

    def get(self, charge_id: str) -> Charge | None:
        """The charge with this id, if any."""
        return self._charges.get(charge_id)

    def with_reference(self, reference: str) -> list[Charge]:
        """Charges carrying this reference, oldest first."""
        return self._by_reference.get(reference, [])

    def created_on(self, day: str) -> list[Charge]:
        """Charges created on this UTC day (`YYYY-MM-DD`), oldest first."""
        return self._by_day.get(day, [])

    def entries(self) -> list[dict[str, Any]]:
        """Every charge in the `/_ledger` shape, oldest first."""
        return [{name: charge[name] for name in LEDGER_FIELDS} for charge in self._charges.values()]
