"""The gateway's settlement report: fetched or read, parsed into charges.

One CSV per UTC day with the columns of :data:`COLUMNS`; a charge belongs to
the day of its ``created_at``. To match a completion and its charge on
either side of midnight, a run fetches the day before and the day after too.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from paycron.errors import GatewayError
from paycron.gateway_client import Gateway
from reconciliation.errors import ReconciliationError

COLUMNS = ("charge_id", "idempotency_key", "reference", "amount", "currency", "status",
           "created_at")
SUCCEEDED = "succeeded"
REFUNDED = "refunded"


@dataclass(frozen=True)
class ReportCharge:
    """One row of a settlement report. ``amount`` is in minor units."""

    charge_id: str
    idempotency_key: str
    reference: str
    amount: int
    currency: str
    status: str
    created_at: datetime

    @property
    def day(self) -> date:
        """The settlement day the charge belongs to (its UTC created date)."""
        return self.created_at.date()

    def as_detail(self) -> dict:
        """The charge as evidence in an item's ``detail``."""
        return {"chargeId": self.charge_id, "idempotencyKey": self.idempotency_key,
                "reference": self.reference, "amount": self.amount, "currency": self.currency,
                "status": self.status, "createdAt": self.created_at.isoformat()}


def _amount(text: str) -> int:
    # Money is exact: "25.0", "+25" or "2.5e3" are a broken report, not 25.
    if not text.isascii() or not text.isdigit() or int(text) <= 0:
        raise ValueError(f"amount must be a positive integer of minor units, got {text!r}")
    return int(text)


def _created_at(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError(f"created_at needs an explicit offset, got {text!r}")
    return value.astimezone(UTC)


def parse_report(text: str, *, source: str = "report") -> list[ReportCharge]:
    """Every charge of a settlement report CSV; raises :class:`ReconciliationError`
    naming the line at the first malformed row (a half-read report proves nothing)."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ReconciliationError(f"{source}: not a settlement report "
                                  f"(missing columns: {', '.join(missing)})")
    charges = []
    for row in reader:
        try:
            if any(not row[c] for c in COLUMNS):
                raise ValueError("empty field")
            charges.append(ReportCharge(
                charge_id=row["charge_id"], idempotency_key=row["idempotency_key"],
                reference=row["reference"], amount=_amount(row["amount"]),
                currency=row["currency"], status=row["status"],
                created_at=_created_at(row["created_at"]),
            ))
        except (ValueError, TypeError) as exc:
            raise ReconciliationError(f"{source} line {reader.line_num}: {exc}") from exc
    return charges


def window(day: date) -> list[date]:
    """The reports a run over ``day`` reads: the day before, the day, the day after."""
    return [day - timedelta(days=1), day, day + timedelta(days=1)]


def fetch_window(gateway: Gateway, day: date) -> list[ReportCharge]:
    """The charges of the reports around ``day``, from the gateway."""
    charges: list[ReportCharge] = []
    for each in window(day):
        try:
            text = gateway.settlement_report(each.isoformat())
        except GatewayError as exc:
            raise ReconciliationError(f"settlement report for {each}: {exc}") from exc
        charges.extend(parse_report(text, source=f"settlement report {each}"))
    return charges


def read_file(path: str | Path) -> list[ReportCharge]:
    """The charges of one report file (and nothing around it)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReconciliationError(f"{path}: {exc}") from exc
    return parse_report(text, source=str(path))
