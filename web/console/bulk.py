"""Bulk dead-letter actions over a filter, their four-eyes approvals, the
audit page and cancelling a PENDING payment (docs/console.md).

A bulk action is previewed (its count, totals and first rows), given a
reason, then either runs (the scheduler's runner acts on it in chunks:
``paycron.engine.console_bulk``) or waits for another operator's approval.
The payments it acts on are those previewed: the preview carries a digest
of their ids, a confirmation whose filter now matches others is refused
(409), and the ids are stored with the request, so an approval runs exactly
what was previewed, never the filter evaluated again."""

from __future__ import annotations

import csv
import hashlib
import io
import uuid
from datetime import date

from flask import Response, current_app, flash, g, redirect, render_template, request, url_for

from paycron.domain.enums import Status
from paycron.domain.ids import parse_payment_id
from paycron.engine import console_bulk
from paycron.engine.console_bulk import LABELS, BulkRefused, Selection
from paycron.sql import q
from paycron.store import partitions
from paycron.store.payments import get_payment
from web.audit import audit
from web.console import bp, filters, page_cursor, reads
from web.console.actions import explanation
from web.console.session import ConsoleRefused

#: Rows of a preview shown on its page; the rest are counted and totalled.
PREVIEW_ROWS = 20
#: A bulk filter with a processor reads at most this many letters per payment allowed.
SCAN_FACTOR = 10
#: The audit page's CSV holds at most this many rows, newest first.
CSV_ROWS = 10_000


def _pool():
    return current_app.extensions["paycron.pool"]


def _config():
    return current_app.extensions["paycron.config"]


def _action(name: str) -> str:
    if name not in console_bulk.LETTER_ACTIONS:
        raise ConsoleRefused(404, "No such action.")
    return LABELS[name]


def _refused(error: BulkRefused):
    raise ConsoleRefused(error.status, error.message)


def select(conn, chosen: filters.LetterFilter, *, cap: int) -> Selection:
    """Every open dead letter the filter matches, with its payment, up to
    ``cap`` (more is refused: narrow the filter)."""
    rows: list[dict] = []
    cursor, read = None, 0
    while True:
        page = reads.open_letters(
            conn,
            cursor=cursor,
            limit=500,
            reason=chosen.reason,
            payer=chosen.payer,
            before=chosen.before,
            processor=chosen.processor,
        )
        read += 500
        for letter in page.rows:
            payment = letter["payment"]
            if payment is None:
                continue  # its day was archived: nothing to act on
            rows.append(
                {
                    "payment_id": letter["payment_id"],
                    "due_at": letter["due_at"],
                    "payer": letter["payer"],
                    "amount_minor": payment["amount_minor"],
                    "currency": payment["currency"],
                    "reason": letter["reason"],
                    "created_at": letter["created_at"],
                    "status": payment["status"],
                    "in_doubt": payment["in_doubt"],
                }
            )
        if len(rows) > cap:
            raise ConsoleRefused(
                400,
                f"More than {cap} payments match this filter (CONSOLE_BULK_MAX): narrow it.",
            )
        if page.next_cursor is None:
            return Selection(rows)
        if read > SCAN_FACTOR * cap:
            raise ConsoleRefused(
                400, "This filter reads too many dead letters to find its matches: narrow it."
            )
        cursor = page.next_cursor


def select_pending(conn, chosen: filters.PaymentFilter, *, cap: int, today: date) -> Selection:
    """Every PENDING payment the payments filter matches (by payer, on
    ``payments_fair_idx``; otherwise the due stretch the list reads, on a
    partial index of PENDING rows), up to ``cap`` (more is refused)."""
    if chosen.status != "PENDING":
        raise ConsoleRefused(
            400, "A bulk cancel acts on PENDING payments: filter by Status PENDING first."
        )
    if chosen.payer:
        due_from, due_to = chosen.due_range()
        name = "pending_of_payer"
    else:
        due_from, due_to = chosen.window(today)
        name = "pending_due"
    # A PENDING payment is due at or after the live bound: the settled days
    # below it are not planned (a payer without a due range would plan them all).
    live_from = partitions.live_bound(conn)
    due_from = live_from if due_from is None else max(due_from, live_from)
    narrowed = any(v is not None for v in (chosen.failure_reason, chosen.doubt, chosen.processor))
    scan = SCAN_FACTOR * cap if narrowed else cap + 1
    found = conn.execute(
        reads.QUERIES[name],
        {
            "payer": chosen.payer,
            "due_from": due_from,
            "due_to": due_to or "infinity",
            "scan": scan,
            "failure_reason": chosen.failure_reason,
            "in_doubt": chosen.doubt,
            "processor": chosen.processor,
        },
    ).fetchall()
    rows = sorted(
        ({**row, "payment_id": row["id"]} for row in found if row["id"] is not None),
        key=lambda row: row["id"],
    )
    if len(rows) > cap:
        raise ConsoleRefused(
            400, f"More than {cap} payments match this filter (CONSOLE_BULK_MAX): narrow it."
        )
    if found and found[0]["scanned"] >= scan:
        raise ConsoleRefused(
            400, "This filter reads too many PENDING payments to find its matches: narrow it."
        )
    return Selection(rows)


def digest(selection: Selection) -> str:
    """Which payments a preview showed, in a form field."""
    ids = sorted(str(row["payment_id"]) for row in selection.rows)
    return hashlib.sha256(",".join(ids).encode()).hexdigest()[:32]


def _totals(totals: dict[str, int]) -> list[tuple[int, str]]:
    """(minor units, currency) per currency, for the money() macro."""
    return [(v, c) for c, v in sorted(totals.items())]


@bp.route("/dead-letters/all/<name>", methods=["GET", "POST"])
def bulk_preview(name: str):
    label = _action(name)
    config = _config()
    source = request.form if request.method == "POST" else request.args
    chosen = filters.LetterFilter.from_args(source)
    with _pool().connection() as conn:
        selection = select(conn, chosen, cap=config.console_bulk_max)
        approval = selection.needs_approval(name, above_minor=config.console_approval_above_minor)
        if request.method == "GET":
            audit("console.read", "success", target="bulk preview " + chosen.query())
            return render_template(
                "console/bulk_preview.html",
                name=name,
                label=label,
                query=chosen,
                selection=selection,
                shown=selection.rows[:PREVIEW_ROWS],
                totals=_totals(selection.totals),
                digest=digest(selection),
                approval=approval,
                explanation=explanation(
                    name, processor=current_app.extensions["paycron.gateway"].name
                ),
                above=config.console_approval_above_minor,
                minutes=config.console_approval_minutes,
            )
        # "note": the filter has a field called reason (the dead letters' own)
        reason = request.form.get("note", "").strip()
        if not reason:
            raise ConsoleRefused(400, "A reason is required: say why, for the audit.")
        if len(reason) > 1000:
            raise ConsoleRefused(400, "A reason is at most 1000 characters.")
        if request.form.get("digest") != digest(selection):
            raise ConsoleRefused(
                409,
                "The payments this filter matches changed since the preview: "
                "look at the preview again.",
            )
        try:
            made = console_bulk.request(
                conn,
                action=name,
                selection=selection,
                filter=chosen.query(),
                reason=reason,
                actor=g.operator.actor,
                key_id=g.operator.key_id,
                above_minor=config.console_approval_above_minor,
                minutes=config.console_approval_minutes,
            )
        except BulkRefused as refused:
            _refused(refused)
    if made["state"] == console_bulk.AWAITING:
        flash(
            f"Request {made['id']} ({label.lower()} {made['payments']} payments) awaits "
            "another operator's approval.",
            "done",
        )
    else:
        flash(f"{label} of {made['payments']} payments started.", "done")
    return redirect(url_for("console.bulk_request", request_id=made["id"]))


@bp.route("/payments/all/cancel", methods=["GET", "POST"])
def bulk_cancel_preview():
    """Cancel every PENDING payment the payments filter matches: the same
    preview, digest, cap, four eyes and runner as the dead letters' actions."""
    config = _config()
    source = request.form if request.method == "POST" else request.args
    chosen = filters.PaymentFilter.from_args(source, statuses=[s.value for s in Status])
    with _pool().connection() as conn:
        selection = select_pending(
            conn,
            chosen,
            cap=config.console_bulk_max,
            today=current_app.extensions["paycron.clock"]().date(),
        )
        approval = selection.needs_approval(
            "cancel", above_minor=config.console_approval_above_minor
        )
        if request.method == "GET":
            audit("console.read", "success", target="bulk preview payments " + chosen.describe())
            return render_template(
                "console/bulk_preview.html",
                name="cancel",
                label=LABELS["cancel"],
                query=chosen,
                selection=selection,
                shown=selection.rows[:PREVIEW_ROWS],
                totals=_totals(selection.totals),
                digest=digest(selection),
                approval=approval,
                explanation=(
                    "The API's own cancel (a compare-and-swap on PENDING), made for the "
                    "payment's payer: a payment a worker claimed meanwhile, or that an "
                    "earlier call may have charged, is refused with the API's answer "
                    "(409 ALREADY_PROCESSING, 409 OUTCOME_IN_DOUBT, ...) and left as it is."
                ),
                above=config.console_approval_above_minor,
                minutes=config.console_approval_minutes,
                action_url=url_for("console.bulk_cancel_preview"),
                back_url=url_for("console.payments", **chosen.args()),
                noun="PENDING payments",
            )
        reason = request.form.get("note", "").strip()
        if not reason:
            raise ConsoleRefused(400, "A reason is required: say why, for the audit.")
        if len(reason) > 1000:
            raise ConsoleRefused(400, "A reason is at most 1000 characters.")
        if request.form.get("digest") != digest(selection):
            raise ConsoleRefused(
                409,
                "The payments this filter matches changed since the preview: "
                "look at the preview again.",
            )
        try:
            made = console_bulk.request(
                conn,
                action="cancel",
                selection=selection,
                filter=chosen.query(),
                reason=reason,
                actor=g.operator.actor,
                key_id=g.operator.key_id,
                above_minor=config.console_approval_above_minor,
                minutes=config.console_approval_minutes,
            )
        except BulkRefused as refused:
            _refused(refused)
    if made["state"] == console_bulk.AWAITING:
        flash(
            f"Request {made['id']} (cancel {made['payments']} payments) awaits "
            "another operator's approval.",
            "done",
        )
    else:
        flash(f"Cancel of {made['payments']} payments started.", "done")
    return redirect(url_for("console.bulk_request", request_id=made["id"]))


@bp.get("/bulk/<int:request_id>")
def bulk_request(request_id: int):
    after = uuid.UUID(int=0)
    cursor = page_cursor()
    if cursor:
        parsed = parse_payment_id(cursor)
        if parsed is None:
            raise ConsoleRefused(400, "A bad page cursor.")
        after = parsed
    with _pool().connection() as conn:
        made = console_bulk.get(conn, request_id)
        if made is None:
            raise ConsoleRefused(404, "No such bulk request.")
        items = conn.execute(
            q("bulk_items_page"),
            {"request_id": request_id, "after": after, "limit": reads.PAGE + 1},
        ).fetchall()
    more, items = len(items) > reads.PAGE, items[: reads.PAGE]
    audit("console.read", "success", target=f"bulk request {request_id}")
    return render_template(
        "console/bulk_request.html",
        made=made,
        label=LABELS[made["action"]],
        items=items,
        next_cursor=str(items[-1]["payment_id"]) if more else None,
        totals=_totals(made["totals"]),
    )


@bp.get("/approvals")
def approvals():
    with _pool().connection() as conn:
        console_bulk.expire(conn)
        waiting = conn.execute(q("bulk_awaiting_page"), {"limit": 100}).fetchall()
    audit("console.read", "success", target="approvals")
    return render_template(
        "console/approvals.html",
        waiting=[{**w, "totals_shown": _totals(w["totals"])} for w in waiting],
        labels=LABELS,
    )


@bp.post("/approvals/<int:request_id>/<decision>")
def decide(request_id: int, decision: str):
    if decision not in ("approve", "reject"):
        raise ConsoleRefused(404, "No such decision.")
    with _pool().connection() as conn:
        try:
            made = console_bulk.decide(
                conn,
                request_id,
                approve=decision == "approve",
                actor=g.operator.actor,
                key_id=g.operator.key_id,
            )
        except BulkRefused as refused:
            _refused(refused)
    if decision == "approve":
        flash(f"Request {request_id} approved: it runs now.", "done")
        return redirect(url_for("console.bulk_request", request_id=made["id"]))
    flash(f"Request {request_id} rejected.", "done")
    return redirect(url_for("console.approvals"))


@bp.get("/audit")
def audit_page():
    before = 2**63 - 1
    cursor = page_cursor()
    if cursor:
        try:
            before = reads._id(cursor)
        except ValueError:
            raise ConsoleRefused(400, "A bad page cursor.") from None
    with _pool().connection() as conn:
        rows = conn.execute(
            q("console_audit_page"), {"before_id": before, "limit": reads.PAGE + 1}
        ).fetchall()
    more, rows = len(rows) > reads.PAGE, rows[: reads.PAGE]
    audit("console.read", "success", target="audit")
    return render_template(
        "console/audit.html", rows=rows, next_cursor=str(rows[-1]["id"]) if more else None
    )


AUDIT_COLUMNS = (
    "id",
    "at",
    "event",
    "outcome",
    "actor",
    "key_id",
    "target",
    "reason",
    "filter",
    "payments",
    "done",
    "refused",
    "request_id",
)


@bp.get("/audit.csv")
def audit_csv():
    with _pool().connection() as conn:
        rows = conn.execute(
            q("console_audit_page"), {"before_id": 2**63 - 1, "limit": CSV_ROWS}
        ).fetchall()
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(AUDIT_COLUMNS)
    for row in rows:
        writer.writerow(
            [row["at"].isoformat() if name == "at" else _cell(row[name]) for name in AUDIT_COLUMNS]
        )
    audit("console.read", "success", target="audit csv")
    return Response(
        out.getvalue(),
        mimetype="text/csv",
        headers={"Content-Disposition": "attachment; filename=console-audit.csv"},
    )


def _cell(value) -> str:
    """A CSV cell a spreadsheet shows as text, never runs as a formula."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


@bp.post("/payments/<payment_id>/cancel")
def cancel(payment_id: str):
    parsed = parse_payment_id(payment_id)
    if parsed is None:
        raise ConsoleRefused(404, "No payment has this id.")
    reason = request.form.get("reason", "").strip()[:1000]
    if not reason:
        raise ConsoleRefused(400, "A reason is required: say why, for the audit.")
    with _pool().connection() as conn:
        if get_payment(conn, parsed, actor=None, with_attempts=False) is None:
            raise ConsoleRefused(404, "No payment has this id.")
        # The API's own compare-and-swap, as the payment's payer would call it:
        # the same code every payment of a bulk cancel goes through.
        done, why = console_bulk.cancel(conn, parsed)
        console_bulk.audit_row(
            conn,
            "payment.cancel",
            "success" if done else "refused",
            actor=g.operator.actor,
            key_id=g.operator.key_id,
            target=f"payment {parsed}",
            reason=reason if done else f"{reason} ({why})",
            payments=1,
            log_line=False,
        )
    audit(
        "payment.cancel",
        "success" if done else "refused",
        target=parsed,
        reason=reason if done else why,
        channel="console",
    )
    if not done:
        raise ConsoleRefused(409, f"Not cancelled ({why}).")
    flash(f"{parsed}: cancelled.", "done")
    return redirect(url_for("console.payment", payment_id=parsed))
