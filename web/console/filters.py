"""The list pages' filters: read from the query string (so a filtered page's
URL can be shared), checked, and written back as one. Bad input is a
ConsoleRefused(400) with what was wrong, before anything is read."""

from __future__ import annotations

import urllib.parse
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta

from werkzeug.datastructures import MultiDict

from paycron.config import PROCESSORS
from web.console.session import ConsoleRefused

#: The reasons a payment is parked with (the dead_letters table's own check).
LETTER_REASONS = ("RETRIES_EXHAUSTED", "LEASE_EXPIRED_REPEATEDLY")
#: The reasons a payment fails with.
FAILURE_REASONS = ("DECLINED", "RETRIES_EXHAUSTED", "LEASE_EXPIRED_REPEATEDLY")
#: A due-range filter spans at most this many days (each is a partition to plan).
MAX_DUE_DAYS = 31
#: A payer is an API key's actor: at most this long.
MAX_PAYER = 200


def _bad(message: str):
    raise ConsoleRefused(400, message)


def _choice(args: MultiDict, name: str, allowed: tuple[str, ...], label: str) -> str | None:
    value = args.get(name, "").strip()
    if not value or value == "any":
        return None
    if value not in allowed:
        _bad(f"{label}: {value[:40]!r} is not one of {', '.join(allowed)}.")
    return value


def _payer(args: MultiDict) -> str | None:
    value = args.get("payer", "").strip()
    if len(value) > MAX_PAYER:
        _bad(f"Payer: at most {MAX_PAYER} characters.")
    return value or None


def parse_time(text: str, label: str, *, end_of_day: bool = False) -> datetime | None:
    """``2026-12-03`` (the day's start, or the next day's with
    ``end_of_day``) or ``2026-12-03T10:30`` (UTC unless an offset is given)."""
    text = text.strip()
    if not text:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            value = datetime(day.year, day.month, day.day, tzinfo=UTC)
        else:
            value = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        _bad(f"{label}: use a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM, UTC).")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # A date or a time alike, so a day's arithmetic (a whole day, a range's
    # other end) never leaves the calendar.
    if not 2000 <= value.astimezone(UTC).year <= 9000:
        _bad(f"{label}: out of range.")
    value = value.astimezone(UTC)
    return value + timedelta(days=1) if len(text) == 10 and end_of_day else value


def _query(values: dict) -> str:
    shown = {k: v for k, v in values.items() if v not in (None, "")}
    return urllib.parse.urlencode(shown)


@dataclass(frozen=True)
class LetterFilter:
    """Open dead letters by reason, payer, parked before, processor."""

    reason: str | None = None
    payer: str | None = None
    parked_before: str = ""  # as typed (kept for the form and the URL)
    processor: str | None = None

    @classmethod
    def from_args(cls, args: MultiDict) -> LetterFilter:
        before = args.get("parked_before", "").strip()
        parse_time(before, "Parked before")
        return cls(
            reason=_choice(args, "reason", LETTER_REASONS, "Reason"),
            payer=_payer(args),
            parked_before=before,
            processor=_choice(args, "processor", PROCESSORS, "Processor"),
        )

    @property
    def before(self) -> datetime | None:
        return parse_time(self.parked_before, "Parked before")

    @property
    def active(self) -> bool:
        return any(asdict(self).values())

    def query(self) -> str:
        return _query(asdict(self))

    def describe(self) -> str:
        """The filter as the audit log writes it: ``payer=acme status=FAILED``."""
        return " ".join(f"{k}={v}" for k, v in self.args().items())

    def args(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v}


@dataclass(frozen=True)
class PaymentFilter:
    """Payments by payer, status, due range, processor, failure reason, in doubt."""

    payer: str | None = None
    status: str | None = None
    due_from: str = ""
    due_to: str = ""
    processor: str | None = None
    failure_reason: str | None = None
    in_doubt: str | None = None  # "yes", "no" or None

    @classmethod
    def from_args(cls, args: MultiDict, *, statuses: list[str]) -> PaymentFilter:
        due_from, due_to = args.get("due_from", "").strip(), args.get("due_to", "").strip()
        day = args.get("day", "").strip()  # a day alone: that day (older links)
        if day and not (due_from or due_to):
            try:
                date.fromisoformat(day)
            except ValueError:
                _bad("A bad day (use YYYY-MM-DD).")
            due_from = due_to = day
        made = cls(
            payer=_payer(args),
            status=_choice(args, "status", tuple(statuses), "Status"),
            due_from=due_from,
            due_to=due_to,
            processor=_choice(args, "processor", PROCESSORS, "Processor"),
            failure_reason=_choice(args, "failure_reason", FAILURE_REASONS, "Failure reason"),
            in_doubt=_choice(args, "in_doubt", ("yes", "no"), "In doubt"),
        )
        start, end = made.due_range()
        if start is not None and end is not None:
            if end <= start:
                _bad("Due to must be after Due from.")
            if end - start > timedelta(days=MAX_DUE_DAYS):
                _bad(f"A due range spans at most {MAX_DUE_DAYS} days.")
        return made

    def due_range(self) -> tuple[datetime | None, datetime | None]:
        """[from, to): a day given as ``Due to`` includes that whole day."""
        return (
            parse_time(self.due_from, "Due from"),
            parse_time(self.due_to, "Due to", end_of_day=True),
        )

    def window(self, today: date) -> tuple[datetime, datetime]:
        """The due stretch a search without a payer reads: the range given,
        a day from one bound when only one is given, ``today`` when none."""
        due_from, due_to = self.due_range()
        if due_from is None and due_to is None:
            due_from = datetime(today.year, today.month, today.day, tzinfo=UTC)
        if due_from is None:
            assert due_to is not None
            due_from = due_to - timedelta(days=1)
        if due_to is None:
            due_to = due_from + timedelta(days=1)
        return due_from, due_to

    @property
    def active(self) -> bool:
        return any(asdict(self).values())

    @property
    def doubt(self) -> bool | None:
        return None if self.in_doubt is None else self.in_doubt == "yes"

    def query(self) -> str:
        return _query(asdict(self))

    def describe(self) -> str:
        """The filter as the audit log writes it: ``payer=acme status=FAILED``."""
        return " ".join(f"{k}={v}" for k, v in self.args().items())

    def args(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v}


@dataclass(frozen=True)
class RunFilter:
    """Reconciliation runs by day (before) and mismatches."""

    day_before: str = ""
    mismatches: str | None = None  # "only" or None

    @classmethod
    def from_args(cls, args: MultiDict) -> RunFilter:
        day = args.get("day_before", "").strip()
        if day:
            try:
                date.fromisoformat(day)
            except ValueError:
                _bad("Day before: use a date (YYYY-MM-DD).")
        return cls(day_before=day, mismatches=_choice(args, "mismatches", ("only",), "Mismatches"))

    @property
    def day(self) -> date | None:
        return date.fromisoformat(self.day_before) if self.day_before else None

    def args(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v}


#: The Webhooks page's "Only" choices: endpoints with events waiting, or
#: whose oldest waiting event was tried and not delivered.
WEBHOOK_ONLY = ("backlog", "failing")


@dataclass(frozen=True)
class WebhookFilter:
    """Live webhook endpoints by payer, and only those with a backlog or failing."""

    payer: str | None = None
    only: str | None = None  # "backlog", "failing" or None

    @classmethod
    def from_args(cls, args: MultiDict) -> WebhookFilter:
        return cls(payer=_payer(args), only=_choice(args, "only", WEBHOOK_ONLY, "Only"))

    @property
    def active(self) -> bool:
        return any(asdict(self).values())

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.args().items())

    def args(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v}
