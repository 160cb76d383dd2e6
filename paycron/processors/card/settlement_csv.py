"""The settlement report as CSV: the fake gateway's report format, and the
file an operator hands ``paycron reconcile --report-file``.

One row per charge with the columns of :data:`COLUMNS`; a half-read report
proves nothing, so the first malformed row refuses the whole file.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

from paycron.domain.processing import Charge
from paycron.errors import GatewayError

COLUMNS = (
    "charge_id",
    "idempotency_key",
    "reference",
    "amount",
    "currency",
    "status",
    "created_at",
)


class MalformedReport(GatewayError):
    """A settlement report that cannot be read whole."""


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


def parse_report(text: str, *, source: str = "report") -> list[Charge]:
    """Every charge of a settlement report CSV; raises :class:`MalformedReport`
    naming the line at the first malformed row."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise MalformedReport(
            f"{source}: not a settlement report (missing columns: {', '.join(missing)})"
        )
    charges = []
    for row in reader:
        try:
            if any(not row[c] for c in COLUMNS):
                raise ValueError("empty field")
            charges.append(
                Charge(
                    id=row["charge_id"],
                    idempotency_key=row["idempotency_key"],
                    reference=row["reference"],
                    amount=_amount(row["amount"]),
                    currency=row["currency"],
                    status=row["status"],
                    created_at=_created_at(row["created_at"]),
                )
            )
        except (ValueError, TypeError) as exc:
            raise MalformedReport(f"{source} line {reader.line_num}: {exc}") from exc
    return charges
