"""One reconciliation run over one UTC day: classify, repair, store, page.

A repair is :func:`paycron.store.transitions.complete_from_gateway` (a CAS from
FAILED or PENDING only) committed together with its ``REPAIRED`` item, so a
run that dies midway leaves no unrecorded repair and a second run repairs
nothing twice: the CAS finds the payment COMPLETED. A repair that loses its
CAS is judged again on a fresh read of the payment.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from psycopg import Connection

from paycron.config import Config
from paycron.domain.enums import Outcome, Status
from paycron.domain.ids import parse_payment_id
from paycron.domain.policy import Answer
from paycron.engine import lookups
from paycron.errors import GatewayError
from paycron.processors.base import Processor
from paycron.store import transitions
from paycron.store.clock import database_now
from paycron.store.payments import get_payment
from reconciliation import store
from reconciliation.diff import (
    Await,
    Item,
    ItemKind,
    PaymentView,
    Repair,
    Verdict,
    classify,
    judge_charge,
    unique_charges,
)
from reconciliation.page import page
from reconciliation.report import ReportCharge

#: Recorded as the attempt's worker, the event's ``by`` and the letter's resolver.
ACTOR = "reconciliation"
log = logging.getLogger("reconciliation.run")


@dataclass(frozen=True)
class RunResult:
    run: dict  # the reconciliation_runs row, finished
    items: list[Item]
    #: Per class: charges, matched, refunded, completions, matched_by_lookup.
    tally: Counter

    @property
    def mismatches(self) -> list[Item]:
        return [i for i in self.items if i.kind.pages]

    @property
    def exit_code(self) -> int:
        """0 when the day is clean, 1 when anything paged."""
        return 1 if self.mismatches else 0

    def counts(self) -> dict[str, int]:
        """Every class, in a fixed order (zeros included): the summary."""
        kinds = Counter(i.kind for i in self.items)
        figures = {
            name: self.tally[name]
            for name in ("charges", "matched", "refunded", "completions", "matched_by_lookup")
        }
        figures.update({kind.value.lower(): kinds[kind] for kind in ItemKind})
        figures["mismatches"] = len(self.mismatches)
        return figures


def _repair(
    conn: Connection, run_id: int, repair: Repair, before: PaymentView, tally: Counter
) -> list[Item]:
    """Complete the payment from the charge, or say why not after a fresh read."""
    charge = repair.charge
    detail = {"charge": charge.as_detail(), "paymentStatus": before.status.value}
    with conn.transaction():
        if transitions.complete_from_gateway(
            conn, repair.payment_id, outcome=Outcome.RECONCILED, gateway_ref=charge.id, actor=ACTOR
        ):
            item = Item(ItemKind.REPAIRED, repair.payment_id, charge.id, detail)
            store.record_items(conn, run_id, [item])
            log.info(
                "reconciliation repaired payment=%s charge=%s from=%s",
                repair.payment_id,
                charge.id,
                before.status.value,
            )
            return [item]
    # Lost: a worker, a human or a cancel moved it since it was read.
    now = store.load_payments(conn, [repair.payment_id]).get(repair.payment_id)
    verdict, items = judge_charge(charge, now)
    if verdict is Verdict.REPAIR:  # moved and came back: a later run tries again
        return [
            Item(
                ItemKind.DEFERRED,
                repair.payment_id,
                charge.id,
                {**detail, "reason": "repair lost its compare-and-swap"},
            )
        ]
    if verdict is Verdict.MATCHED:
        tally["matched"] += 1
    return items


def _confirm_missing(
    conn: Connection, gateway: Processor, items: list[Item], tally: Counter
) -> list[Item]:
    """Ask the gateway by reference about each COMPLETED_WITHOUT_CHARGE before
    paging: a charge made outside the three days (a re-drive's lookup days
    later) is still a charge. A failed lookup pages: nothing was proven."""
    kept = []
    for item in items:
        if item.kind is not ItemKind.COMPLETED_WITHOUT_CHARGE:
            kept.append(item)
            continue
        payment = get_payment(conn, item.payment_id, actor=None, with_attempts=False)
        try:
            lookup = lookups.ask_processor(gateway, payment, now=database_now(conn))
        except GatewayError as exc:
            kept.append(
                Item(item.kind, item.payment_id, None, {**item.detail, "lookupError": str(exc)})
            )
            continue
        if lookup.answer is Answer.CHARGED:
            tally["matched_by_lookup"] += 1
        else:
            kept.append(item)
    return kept


def _await(
    conn: Connection,
    gateway: Processor | None,
    awaits: list[Await],
    items: list[Item],
    poll_seconds: float,
) -> list[Item]:
    """Each FAILED or PENDING payment whose processor is still processing a
    charge for it is looked up at its own processor: still processing, it
    waits for that processor-side payment (AWAITING_GATEWAY, polled until it
    settles); charged by now, it is completed. Its DEFERRED item says what
    was done. Without the gateway (a report file) nothing is asked."""
    done: dict[tuple, str] = {}
    for each in awaits if gateway is not None else ():
        payment = get_payment(conn, each.payment_id, actor=None, with_attempts=False)
        if payment is None:
            continue
        try:
            lookup = lookups.ask_processor(gateway, payment, now=database_now(conn))
        except GatewayError as exc:  # unreachable, or another processor's payment
            log.warning("reconciliation: lookup of payment=%s failed: %s", each.payment_id, exc)
            continue
        key = (each.payment_id, each.charge.id)
        if lookup.answer is Answer.PROCESSING and transitions.await_from_lookup(
            conn, each.payment_id, intent=lookup.found.id, actor=ACTOR, poll_seconds=poll_seconds
        ):
            done[key] = (
                f"the processor is processing {lookup.found.id}: the payment now waits "
                "for its outcome (AWAITING_GATEWAY)"
            )
        elif lookup.answer is Answer.CHARGED and transitions.complete_from_gateway(
            conn,
            each.payment_id,
            outcome=Outcome.RECONCILED,
            gateway_ref=lookup.found.id,
            actor=ACTOR,
        ):
            done[key] = f"charged by now ({lookup.found.id}): the payment is completed"
        if key in done:
            log.info("reconciliation: payment=%s %s", each.payment_id, done[key])
    return [
        Item(i.kind, i.payment_id, i.charge_id, {**i.detail, "reason": done[key]})
        if i.kind is ItemKind.DEFERRED and (key := (i.payment_id, i.charge_id)) in done
        else i
        for i in items
    ]


def referenced_ids(charges: Iterable[ReportCharge]) -> set[uuid.UUID]:
    return {pid for c in charges if (pid := parse_payment_id(c.reference)) is not None}


def reconcile_day(
    conn: Connection,
    day: date,
    charges: Iterable[ReportCharge],
    *,
    source: str,
    gateway: Processor | None = None,
    poll_seconds: float = Config.gateway_poll_seconds,
) -> RunResult:
    """Reconcile ``day`` against ``charges`` (the reports of the day and its
    neighbours, or one file); ``gateway`` set: confirm missing charges by
    reference before paging. Stores the run, pages each mismatch."""
    run_id = store.start_run(conn, day, source=source)["id"]
    charges = unique_charges(charges)
    of_day = [c for c in charges if c.day == day]
    if source == "file" and charges and not of_day:
        log.warning("reconciliation: the report holds no charge created on %s", day)
    completions = store.completions_on(conn, day)
    payments = store.load_payments(
        conn, referenced_ids(of_day) | {c.payment_id for c in completions}
    )
    completed = [
        c for c in completions if (p := payments.get(c.payment_id)) and p.status is Status.COMPLETED
    ]
    diff = classify(day, charges, payments, completed)
    tally = Counter(diff.tally)
    tally["charges"] = len(of_day)
    found = diff.items
    if gateway is not None:
        found = _confirm_missing(conn, gateway, found, tally)
    found = _await(conn, gateway, diff.awaits, found, poll_seconds)
    repaired, found = [], list(found)
    for repair in diff.repairs:
        for item in _repair(conn, run_id, repair, payments[repair.payment_id], tally):
            # A REPAIRED item is committed with its repair; the rest are stored below.
            (repaired if item.kind is ItemKind.REPAIRED else found).append(item)
    items = repaired + found
    with conn.transaction():
        store.record_items(conn, run_id, found)
        run = store.finish_run(
            conn,
            run_id,
            charges_seen=len(of_day),
            repaired=len(repaired),
            deferred=sum(i.kind is ItemKind.DEFERRED for i in items),
            mismatches=sum(i.kind.pages for i in items),
        )
    result = RunResult(run, items, tally)
    for item in result.mismatches:
        page(item, day=day, run_id=run_id)
    log.info(
        "reconciliation day=%s run=%d %s",
        day,
        run_id,
        " ".join(f"{k}={v}" for k, v in result.counts().items() if v),
    )
    return result
