"""The gateway's settlement report: the day's charges, fetched or read.

A charge belongs to the UTC day of its ``created_at``. To match a completion
and its charge on either side of midnight, a run fetches the day before and
the day after too. The processor adapter fetches (a CSV at the fake, the
charges list at Stripe); a file given by hand is the CSV of
:mod:`paycron.processors.card.settlement_csv`.
"""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

from paycron.domain.processing import FAILED, PROCESSING, REFUNDED, SUCCEEDED, Charge
from paycron.errors import GatewayError
from paycron.processors.base import Processor
from paycron.processors.card.settlement_csv import COLUMNS, MalformedReport
from paycron.processors.card.settlement_csv import parse_report as parse_csv
from reconciliation.errors import ReconciliationError

#: One charge of a settlement report (``amount`` in minor units).
ReportCharge = Charge

__all__ = [
    "COLUMNS",
    "FAILED",
    "PROCESSING",
    "REFUNDED",
    "SUCCEEDED",
    "ReportCharge",
    "fetch_window",
    "parse_report",
    "read_file",
    "window",
]


def parse_report(text: str, *, source: str = "report") -> list[Charge]:
    """Every charge of a settlement report CSV; :class:`ReconciliationError`
    naming the line at the first malformed row."""
    try:
        return parse_csv(text, source=source)
    except MalformedReport as exc:
        raise ReconciliationError(str(exc)) from exc


def window(day: date) -> list[date]:
    """The reports a run over ``day`` reads: the day before, the day, the day after."""
    return [day - timedelta(days=1), day, day + timedelta(days=1)]


def fetch_window(gateway: Processor, day: date) -> list[Charge]:
    """The charges of the reports around ``day``, from the gateway."""
    charges: list[Charge] = []
    for each in window(day):
        try:
            charges.extend(gateway.settlement_report(each))
        except GatewayError as exc:
            raise ReconciliationError(f"settlement report for {each}: {exc}") from exc
    return charges


def read_file(path: str | Path) -> list[Charge]:
    """The charges of one report file (and nothing around it)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReconciliationError(f"{path}: {exc}") from exc
    return parse_report(text, source=str(path))
