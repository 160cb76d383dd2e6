"""The classification at the heart of a run: pure, no database, no gateway.

Both directions of SPEC §6. Each charge of the day is judged against its
payment (the reference is the payment id): COMPLETED matches; FAILED or
PENDING is our miss, to repair; PROCESSING is its worker's, deferred;
CANCELLED, unknown, a different amount or currency, or a second charge for
the key page. Each payment whose success was recorded that day must have a
charge for its key in the reports of the day before, the day, or the day
after. A refunded charge is settled: never a miss, never a page, but it
still proves its payment was charged.

Repairs are proposed only on clean evidence: a charge that also pages
(wrong amount, duplicated key) leaves its payment to a human.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import StrEnum

from paycron.domain.enums import Status
from paycron.domain.ids import parse_payment_id
from reconciliation.report import FAILED, PROCESSING, REFUNDED, SUCCEEDED, ReportCharge


class ItemKind(StrEnum):
    """What a run records about one charge or payment (mirrored by the
    CHECK on ``reconciliation_items.kind``)."""

    REPAIRED = "REPAIRED"  # our miss, completed from the gateway's truth
    DEFERRED = "DEFERRED"  # PROCESSING: its worker's; a later run re-checks it
    CHARGE_FOR_CANCELLED = "CHARGE_FOR_CANCELLED"
    UNKNOWN_REFERENCE = "UNKNOWN_REFERENCE"  # a charge whose reference is no payment of ours
    COMPLETED_WITHOUT_CHARGE = "COMPLETED_WITHOUT_CHARGE"
    AMOUNT_MISMATCH = "AMOUNT_MISMATCH"
    CURRENCY_MISMATCH = "CURRENCY_MISMATCH"
    DUPLICATE_CHARGE = "DUPLICATE_CHARGE"  # two succeeded charges for one key
    UNEXPECTED_CHARGE_STATUS = "UNEXPECTED_CHARGE_STATUS"  # neither succeeded nor refunded

    @property
    def pages(self) -> bool:
        """A mismatch: a human must look (Sentry error event, exit code 1)."""
        return self not in (ItemKind.REPAIRED, ItemKind.DEFERRED)


class Verdict(StrEnum):
    """What one charge of the day came to."""

    MATCHED = "matched"
    REFUNDED = "refunded"
    REPAIR = "repair"
    DEFERRED = "deferred"
    MISMATCH = "mismatch"
    IGNORED = "ignored"  # a failed charge (a decline): no money moved


@dataclass(frozen=True)
class PaymentView:
    """The columns of a payment that reconciliation compares."""

    id: uuid.UUID
    status: Status
    amount_minor: int
    currency: str


@dataclass(frozen=True)
class Completion:
    """A payment's success as recorded by one of its attempts."""

    payment_id: uuid.UUID
    outcome: str
    gateway_ref: str | None
    finished_at: datetime


@dataclass(frozen=True)
class Item:
    kind: ItemKind
    payment_id: uuid.UUID | None
    charge_id: str | None
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Repair:
    """A payment to move FAILED/PENDING -> COMPLETED because of ``charge``."""

    payment_id: uuid.UUID
    charge: ReportCharge


@dataclass(frozen=True)
class Await:
    """A payment to move FAILED/PENDING -> AWAITING_GATEWAY: the processor is
    still processing ``charge`` for it (a bank debit of a payment parked in
    doubt). Deferring it alone would never look again once its day passed;
    waiting, it is polled until the debit settles."""

    payment_id: uuid.UUID
    charge: ReportCharge


@dataclass
class Diff:
    repairs: list[Repair] = field(default_factory=list)
    awaits: list[Await] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    #: Charges of the day by :class:`Verdict`, plus ``completions`` checked.
    tally: Counter = field(default_factory=Counter)


def _payment_detail(payment: PaymentView) -> dict:
    return {
        "paymentStatus": payment.status.value,
        "paymentAmount": payment.amount_minor,
        "paymentCurrency": payment.currency,
    }


def judge_charge(
    charge: ReportCharge, payment: PaymentView | None, *, duplicated: bool = False
) -> tuple[Verdict, list[Item]]:
    """One charge against its payment (None: no payment of ours has its
    reference). ``duplicated``: its key holds another succeeded charge (that
    page is raised once per key by :func:`classify`, not here)."""
    if charge.status == REFUNDED:
        return Verdict.REFUNDED, []
    if charge.status == FAILED:  # a decline: no money moved (Stripe lists every one)
        return Verdict.IGNORED, []
    detail = {"charge": charge.as_detail()}
    pid = parse_payment_id(charge.reference)
    if charge.status == PROCESSING and payment is not None:
        # accepted, settled later (a bank debit): a later run judges it
        detail.update(_payment_detail(payment))
        return Verdict.DEFERRED, [Item(ItemKind.DEFERRED, payment.id, charge.id, detail)]
    if charge.status != SUCCEEDED:
        return Verdict.MISMATCH, [Item(ItemKind.UNEXPECTED_CHARGE_STATUS, pid, charge.id, detail)]
    if payment is None:
        return Verdict.MISMATCH, [Item(ItemKind.UNKNOWN_REFERENCE, pid, charge.id, detail)]
    detail.update(_payment_detail(payment))
    pages = []
    if charge.amount != payment.amount_minor:
        pages.append(ItemKind.AMOUNT_MISMATCH)
    if charge.currency != payment.currency:
        pages.append(ItemKind.CURRENCY_MISMATCH)
    if payment.status is Status.CANCELLED:
        pages.append(ItemKind.CHARGE_FOR_CANCELLED)
    if pages or duplicated:
        return Verdict.MISMATCH, [Item(k, payment.id, charge.id, detail) for k in pages]
    if payment.status is Status.COMPLETED:
        return Verdict.MATCHED, []
    if payment.status in (Status.PROCESSING, Status.AWAITING_GATEWAY):
        # its worker's, or the gateway-event service's (a debit settling)
        return Verdict.DEFERRED, [Item(ItemKind.DEFERRED, payment.id, charge.id, detail)]
    return Verdict.REPAIR, []  # FAILED or PENDING: our miss


def unique_charges(charges: Iterable[ReportCharge]) -> list[ReportCharge]:
    """Each charge once (by id), oldest first: reports of neighbouring days,
    or a file, may repeat a row."""
    seen: dict[str, ReportCharge] = {}
    for charge in charges:
        seen.setdefault(charge.id, charge)
    return sorted(seen.values(), key=lambda c: (c.created_at, c.id))


def _duplicates(day: date, charges: Sequence[ReportCharge]) -> tuple[set[str], list[Item]]:
    """Payment ids (references) holding two or more succeeded charges, under
    one key or across key generations, and one page per such payment that
    has a charge on ``day`` (a duplicate across midnight pages in the runs of
    both days)."""
    by_key: defaultdict[str, list[ReportCharge]] = defaultdict(list)
    for charge in charges:
        if charge.status == SUCCEEDED:
            by_key[charge.reference].append(charge)
    keys, items = set(), []
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        keys.add(key)
        on_day = [c for c in group[1:] if c.day == day] or [c for c in group if c.day == day]
        if on_day:
            items.append(
                Item(
                    ItemKind.DUPLICATE_CHARGE,
                    parse_payment_id(group[0].reference),
                    on_day[0].id,
                    {"reference": key, "charges": [c.as_detail() for c in group]},
                )
            )
    return keys, items


def classify(
    day: date,
    charges: Iterable[ReportCharge],
    payments: Mapping[uuid.UUID, PaymentView],
    completions: Iterable[Completion],
) -> Diff:
    """Both directions for ``day``.

    ``charges``: every charge read (the day's report and its neighbours, or
    the one file); only those created on ``day`` are judged, the rest help
    matching. ``payments``: the payments their references and the
    completions name, by id. ``completions``: successes recorded on ``day``.
    """
    charges = unique_charges(charges)
    diff = Diff()
    duplicated, diff.items = _duplicates(day, charges)
    for charge in (c for c in charges if c.day == day):
        pid = parse_payment_id(charge.reference)
        verdict, items = judge_charge(
            charge, payments.get(pid) if pid else None, duplicated=charge.reference in duplicated
        )
        diff.tally[verdict.value] += 1
        diff.items.extend(items)
        if verdict is Verdict.REPAIR:
            diff.repairs.append(Repair(pid, charge))
        payment = payments.get(pid) if pid else None
        if (
            verdict is Verdict.DEFERRED
            and charge.status == PROCESSING
            and payment is not None
            and payment.status in (Status.FAILED, Status.PENDING)
        ):
            diff.awaits.append(Await(pid, charge))
    moved = [c for c in charges if c.status in (SUCCEEDED, REFUNDED)]  # not a decline
    charged = {c.idempotency_key for c in moved} | {c.reference for c in moved}
    for done in completions:
        diff.tally["completions"] += 1
        if str(done.payment_id) in charged:
            continue
        payment = payments.get(done.payment_id)
        detail = {
            "outcome": done.outcome,
            "gatewayRef": done.gateway_ref,
            "finishedAt": done.finished_at.isoformat(),
            **(_payment_detail(payment) if payment else {}),
        }
        diff.items.append(Item(ItemKind.COMPLETED_WITHOUT_CHARGE, done.payment_id, None, detail))
    return diff
