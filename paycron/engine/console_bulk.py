"""Bulk actions from the console (over dead letters, and cancelling PENDING
payments), their four-eyes approvals and
the console's audit rows (docs/console.md).

A bulk action is a row of ``console_bulk_requests`` with its payments fixed
in ``console_bulk_items`` when it is asked for: the exact payments the
operator previewed, never the filter evaluated again. It runs at once
(RUNNING) or waits for a second operator (AWAITING_APPROVAL) until it is
approved, rejected or expires.

The scheduler's ``ConsoleBulkRunner`` works through the running ones in
chunks (:func:`run_once`). Each payment is acted on in a transaction of its
own that also records its outcome: its item row is locked (SKIP LOCKED, so
two runners never take the same payment), the action is done, and the
outcome written, all committed together. A crash before that commit leaves
the payment untouched in the database and its item still to do; the action
is then done again, and a refund at the processor is keyed from what it
refunds (``refund:<payment id>``), so it is never made twice. A crash after
the commit leaves the item done: it is never taken again.

Each payment goes through :func:`attempt` (a dead letter's action) or
:func:`cancel` (a PENDING payment's), the very code (and refusals) of the
console's single action.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from paycron.engine import dead_letters
from paycron.errors import DeadLetterActionRefused, GatewayError, GatewayRequestRefused, NotFound
from paycron.observability.audit import record
from paycron.processors.base import Processor
from paycron.sql import q
from paycron.store import transitions
from paycron.store.db import Connection, Pool
from paycron.store.payments import get_payment
from paycron.store.transitions import CancelOutcome

#: What each action is called on its button.
LABELS = {"redrive": "Re-drive", "refund": "Refund", "dismiss": "Dismiss", "cancel": "Cancel"}
#: The actions over dead letters (the others act on payments).
LETTER_ACTIONS = ("redrive", "refund", "dismiss")
#: A request's states.
AWAITING, RUNNING, FINISHED = "AWAITING_APPROVAL", "RUNNING", "FINISHED"
REJECTED, EXPIRED = "REJECTED", "EXPIRED"
#: Payments one runner acts on per request before looking at the next request.
CHUNK = 50


class BulkRefused(Exception):
    """A request that cannot be made or decided, with the reason to show."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# -- one payment: the single action's code --------------------------------------


def perform(
    conn: Connection,
    gateway: Processor,
    name: str,
    payment_id: uuid.UUID,
    *,
    actor: str,
    note: str | None = None,
) -> dead_letters.ActionResult:
    if name == "redrive":
        return dead_letters.redrive(conn, gateway, payment_id, actor=actor)
    if name == "refund":
        return dead_letters.refund(conn, gateway, payment_id, actor=actor)
    if name == "dismiss":
        return dead_letters.dismiss(conn, payment_id, actor=actor, note=note)
    raise ValueError(f"no such action: {name!r}")


def attempt(
    conn: Connection,
    gateway: Processor,
    name: str,
    payment_id: uuid.UUID,
    *,
    actor: str,
    note: str | None = None,
    audited: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[bool, str]:
    """Do ``name`` to one dead letter: (done, what to tell the operator).
    The console's single action and every payment of a bulk action go
    through here, so they are refused alike (in doubt, already resolved,
    nothing to refund, the processor unreachable)."""
    try:
        with audited():
            result = perform(conn, gateway, name, payment_id, actor=actor, note=note)
    except (DeadLetterActionRefused, NotFound) as refused:
        return False, f"{payment_id}: refused: {refused}"
    except GatewayRequestRefused as refused:
        return False, (
            f"{payment_id}: the processor refused the request ({refused}); this is not an "
            "outage and trying again will not help: report it"
        )
    except GatewayError as failed:
        return False, f"{payment_id}: the gateway could not be asked ({failed}); try again"
    detail = f" ({result.detail})" if result.detail else ""
    return True, f"{payment_id}: {result.action}{detail}"


#: Why a cancel lost, as the API answers it (409 and its code).
CANCEL_REFUSALS = {
    CancelOutcome.ALREADY_PROCESSING: "a worker is charging it (or it waits for the processor)",
    CancelOutcome.ALREADY_COMPLETED: "it is already COMPLETED",
    CancelOutcome.ALREADY_FAILED: "it is already FAILED",
    CancelOutcome.OUTCOME_IN_DOUBT: "an earlier call may have charged it (in doubt)",
}


def cancel(conn: Connection, payment_id: uuid.UUID) -> tuple[bool, str | None]:
    """Cancel one PENDING payment: (done, None) or (False, why, as the API
    answers it: ``409 ALREADY_PROCESSING: ...``). The API's own
    compare-and-swap (``DELETE /v1/scheduled-payments/{id}``) made for the
    payment's payer, so it loses the same races. The console's single
    cancel and every payment of a bulk cancel go through here."""
    found = get_payment(conn, payment_id, actor=None, with_attempts=False)
    if found is None:
        return False, "404 NOT_FOUND: no payment has this id"
    outcome = transitions.cancel(conn, payment_id, actor=found["payer"])
    if outcome is CancelOutcome.CANCELLED:
        return True, None
    if outcome is CancelOutcome.NOT_FOUND:
        return False, "404 NOT_FOUND: no payment has this id"
    return False, f"409 {outcome.value}: {CANCEL_REFUSALS.get(outcome, '')}"


# -- the console's audit rows ----------------------------------------------------


def audit_row(
    conn: Connection,
    event: str,
    outcome: str,
    *,
    actor: str | None,
    key_id: int | None = None,
    target: object = None,
    reason: str | None = None,
    filter: str | None = None,
    payments: int | None = None,
    done: int | None = None,
    refused: int | None = None,
    request_id: int | None = None,
    log_line: bool = True,
) -> None:
    """One row of the console's audit page, and (unless the caller wrote
    it already) the same event as an audit log line."""
    conn.execute(
        q("console_audit_insert"),
        {
            "event": event,
            "outcome": outcome,
            "actor": actor,
            "key_id": key_id,
            "target": None if target is None else str(target)[:500],
            "reason": None if reason is None else reason[:1000],
            "filter": filter,
            "payments": payments,
            "done": done,
            "refused": refused,
            "request_id": request_id,
        },
    )
    if log_line:
        record(event, outcome, actor=actor, key_id=key_id, target=target, reason=reason)


# -- requests ------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The payments a filter matched, as previewed."""

    rows: list[dict]  # payment_id, due_at, payer, amount_minor, currency

    @property
    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row["currency"]] = out.get(row["currency"], 0) + row["amount_minor"]
        return dict(sorted(out.items()))

    def needs_approval(self, action: str, *, above_minor: int) -> bool:
        """A refund always needs a second operator; any action whose total
        in one currency is above ``above_minor`` minor units does too (a
        cancel included: it moves no money, but it stops that much from
        being collected, and cannot be undone)."""
        return action == "refund" or any(v > above_minor for v in self.totals.values())


def request(
    conn: Connection,
    *,
    action: str,
    selection: Selection,
    filter: str,
    reason: str,
    actor: str,
    key_id: int,
    above_minor: int,
    minutes: float,
) -> dict:
    """Record a bulk action over ``selection``: RUNNING at once, or awaiting
    a second operator for ``minutes``."""
    if action not in LABELS:
        raise BulkRefused(404, "No such action.")
    if not selection.rows:
        raise BulkRefused(400, "No payment matches this filter: nothing to do.")
    state = AWAITING if selection.needs_approval(action, above_minor=above_minor) else RUNNING
    with conn.transaction():
        row = conn.execute(
            q("bulk_request_insert"),
            {
                "action": action,
                "filter": filter,
                "reason": reason,
                "actor": actor,
                "key_id": key_id,
                "state": state,
                "minutes": minutes,
                "payments": len(selection.rows),
                "totals": json.dumps(selection.totals),
            },
        ).fetchone()
        assert row is not None
        rows = selection.rows
        conn.execute(
            q("bulk_items_insert"),
            {
                "request_id": row["id"],
                "ids": [r["payment_id"] for r in rows],
                "due_ats": [r["due_at"] for r in rows],
                "payers": [r["payer"] for r in rows],
                "amounts": [r["amount_minor"] for r in rows],
                "currencies": [r["currency"] for r in rows],
            },
        )
        audit_row(
            conn,
            "console.bulk_request",
            "success",
            actor=actor,
            key_id=key_id,
            target=f"{action} request {row['id']}",
            reason=reason,
            filter=filter,
            payments=len(rows),
            request_id=row["id"],
        )
    return row


def get(conn: Connection, request_id: int) -> dict | None:
    return conn.execute(q("bulk_request"), {"id": request_id}).fetchone()


def expire(conn: Connection) -> int:
    """Mark the requests nobody decided in time EXPIRED (each audited)."""
    with conn.transaction():
        rows = conn.execute(q("bulk_expire")).fetchall()
        for row in rows:
            audit_row(
                conn,
                "console.bulk_expire",
                "success",
                actor=None,
                target=f"{row['action']} request {row['id']}",
                reason=row["reason"],
                filter=row["filter"],
                payments=row["payments"],
                request_id=row["id"],
            )
    return len(rows)


def decide(conn: Connection, request_id: int, *, approve: bool, actor: str, key_id: int) -> dict:
    """Approve (it runs) or reject a request awaiting approval, by
    compare-and-swap; refused (BulkRefused) for its own requester, once it
    expired, or once decided."""
    event = "console.bulk_approve" if approve else "console.bulk_reject"
    with conn.transaction():
        row = conn.execute(
            q("bulk_decide"),
            {
                "id": request_id,
                "state": RUNNING if approve else REJECTED,
                "actor": actor,
                "key_id": key_id,
            },
        ).fetchone()
        if row is not None:
            audit_row(
                conn,
                event,
                "success",
                actor=actor,
                key_id=key_id,
                target=f"{row['action']} request {row['id']}",
                reason=row["reason"],
                filter=row["filter"],
                payments=row["payments"],
                request_id=row["id"],
            )
            return row
    found = get(conn, request_id)
    if found is None:
        raise BulkRefused(404, "No such request.")
    if found["requested_by"] == actor or found["requested_key_id"] == key_id:
        why, status = "you cannot approve your own request", 403
    elif found["state"] != AWAITING:
        why, status = f"this request is already {found['state'].lower().replace('_', ' ')}", 409
    else:  # awaiting, past its expiry
        why, status = "this request expired: ask again", 409
    audit_row(
        conn,
        event,
        "refused",
        actor=actor,
        key_id=key_id,
        target=f"{found['action']} request {found['id']}",
        reason=why,
        filter=found["filter"],
        payments=found["payments"],
        request_id=found["id"],
    )
    raise BulkRefused(status, why[0].upper() + why[1:] + ".")


# -- the runner ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunCounts:
    done: int = 0
    refused: int = 0
    finished: int = 0
    expired: int = 0


@contextlib.contextmanager
def _logged(event: str, *, actor: str, target: object, reason: str) -> Iterator[None]:
    """The audit log line of one payment's action in a bulk run (the
    console's single action writes the same line through the web's helper)."""
    try:
        yield
    except (DeadLetterActionRefused, NotFound) as refused:
        record(event, "refused", actor=actor, target=target, reason=str(refused), channel="bulk")
        raise
    except Exception as failed:
        record(event, "failure", actor=actor, target=target, reason=type(failed).__name__)
        raise
    record(event, "success", actor=actor, target=target, reason=reason, channel="bulk")


def _cancel_one(conn: Connection, job: dict, payment_id: uuid.UUID) -> tuple[bool, str]:
    """One payment of a bulk cancel: the single cancel's code, and its
    audit log line (``payment.cancel``, channel ``bulk``)."""
    actor = job["requested_by"]
    try:
        done, why = cancel(conn, payment_id)
    except Exception as failed:
        record(
            "payment.cancel",
            "failure",
            actor=actor,
            target=payment_id,
            reason=type(failed).__name__,
        )
        raise
    reason = f"bulk request {job['id']}: {job['reason']}"
    record(
        "payment.cancel",
        "success" if done else "refused",
        actor=actor,
        target=payment_id,
        reason=reason if done else why,
        channel="bulk",
    )
    return done, "cancelled" if done else f"refused: {why}"


def act_on_one(conn: Connection, gateway: Processor, job: dict) -> str | None:
    """Act on the request's next payment and record its outcome, in one
    transaction: 'done', 'refused', or None when none is left to take."""
    with conn.transaction():
        item = conn.execute(q("bulk_next_item"), {"request_id": job["id"]}).fetchone()
        if item is None:
            return None
        payment_id = item["payment_id"]
        name = job["action"]
        if name == "cancel":
            done, detail = _cancel_one(conn, job, payment_id)
            return _finish_item(conn, job, payment_id, done, detail)
        done, message = attempt(
            conn,
            gateway,
            name,
            payment_id,
            actor=job["requested_by"],
            note=job["reason"],
            audited=lambda: _logged(
                f"dead_letter.{name}",
                actor=job["requested_by"],
                target=payment_id,
                reason=f"bulk request {job['id']}: {job['reason']}",
            ),
        )
        return _finish_item(conn, job, payment_id, done, message.removeprefix(f"{payment_id}: "))


def _finish_item(
    conn: Connection, job: dict, payment_id: uuid.UUID, done: bool, detail: str
) -> str:
    outcome = "done" if done else "refused"
    conn.execute(
        q("bulk_item_finish"),
        {"request_id": job["id"], "payment_id": payment_id, "outcome": outcome, "detail": detail},
    )
    return outcome


def run_once(pool: Pool, gateway: Processor, *, chunk: int = CHUNK) -> RunCounts:
    """Expire undecided requests, then act on up to ``chunk`` payments of
    each running request, finishing those with nothing left to do."""
    done = refused = finished = 0
    with pool.connection() as conn:
        expired = expire(conn)
        for job in conn.execute(q("bulk_running"), {"limit": 20}).fetchall():
            for _ in range(chunk):
                outcome = act_on_one(conn, gateway, job)
                if outcome is None:
                    break
                done += outcome == "done"
                refused += outcome == "refused"
            with conn.transaction():
                ended = conn.execute(q("bulk_finish"), {"id": job["id"]}).fetchone()
                if ended is not None:
                    finished += 1
                    audit_row(
                        conn,
                        "console.bulk_finish",
                        "success",
                        actor=ended["requested_by"],
                        target=f"{ended['action']} request {ended['id']}",
                        reason=ended["reason"],
                        filter=ended["filter"],
                        payments=ended["payments"],
                        done=ended["done"],
                        refused=ended["refused"],
                        request_id=ended["id"],
                    )
    return RunCounts(done=done, refused=refused, finished=finished, expired=expired)
