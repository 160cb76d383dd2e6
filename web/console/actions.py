"""The dead-letter actions: re-drive, refund, dismiss, and a re-drive of a
selection. Each is confirmed on a page of its own (a plain form: no script
needed), then done by ``paycron.engine.dead_letters`` itself, recorded with the
signed-in operator's actor."""

from __future__ import annotations

import uuid

from flask import current_app, flash, g, redirect, render_template, request, url_for

from paycron.domain.ids import parse_payment_id
from paycron.domain.keys import gateway_key
from paycron.engine import console_bulk, dead_letters
from paycron.errors import NotFound
from web.audit import audit, audited
from web.console import bp, reads
from web.console.session import ConsoleRefused

#: What each action is called on its button.
LABELS = console_bulk.LABELS
#: The key a refund is made under, by the processor that holds the charge: the
#: fake keys it by payment id, Stripe by the PaymentIntent it refunds.
REFUND_KEYS = {"stripe": "refund:<intent id>", "fake": "refund:<payment id>"}


def explanation(name: str, payment: dict | None = None, *, processor: str = "fake") -> str:
    """What an action will do, said for ``payment`` (its own keys) or, without
    one, for any payment (a selection). ``processor`` is the acting gateway's,
    used when the payment has not been called anywhere yet."""
    if name == "redrive":
        if payment is None:
            current, following = "<payment id>[:n]", "<payment id>:<n+1>"
        else:
            generation = payment.get("key_generation") or 1
            current = gateway_key(payment["id"], generation)
            following = gateway_key(payment["id"], generation + 1)
        return (
            "Ask the processor by reference first: a charge found completes the payment; "
            "one still processing makes it wait for the processor's outcome. If nothing "
            "is found and no earlier call can still land, it goes back to PENDING with a "
            f"fresh retry budget under the next idempotency key ({following}), not the "
            f"current one ({current}): the processor replays its stored answer for a key. "
            "If an earlier call may still land, the re-drive is refused until then."
        )
    if name == "refund":
        held_by = (payment or {}).get("processor") or processor
        key = REFUND_KEYS.get(held_by, REFUND_KEYS["fake"])
        return (
            "Refund the charge the processor holds for this payment (keyed "
            f"{key}, so it is never refunded twice) and close the dead letter."
        )
    return "Close the dead letter without any action at the processor."


#: At most this many payments are re-driven by one confirmation.
MAX_SELECTION = reads.PAGE


def _payment_id(text: str) -> uuid.UUID:
    parsed = parse_payment_id(text)
    if parsed is None:
        raise ConsoleRefused(404, "No dead letter for this payment.")
    return parsed


def _action(name: str) -> str:
    if name not in console_bulk.LETTER_ACTIONS:
        raise ConsoleRefused(404, "No such action.")
    return LABELS[name]


def _attempt(
    conn, name: str, payment_id: uuid.UUID, *, note: str | None = None
) -> tuple[bool, str]:
    """(done, what to tell the operator): the engine's own action, the very
    code every payment of a bulk action goes through; audited as a log line
    and as a row of the console's audit page."""
    done, message = console_bulk.attempt(
        conn,
        current_app.extensions["paycron.gateway"],
        name,
        payment_id,
        actor=g.operator.actor,
        note=note,
        audited=lambda: audited(
            f"dead_letter.{name}", target=payment_id, channel="console", reason=note
        ),
    )
    console_bulk.audit_row(
        conn,
        f"dead_letter.{name}",
        "success" if done else "refused",
        actor=g.operator.actor,
        key_id=g.operator.key_id,
        target=f"payment {payment_id}",
        reason=note if done else message.removeprefix(f"{payment_id}: "),
        payments=1,
        log_line=False,
    )
    return done, message


@bp.get("/dead-letters/<payment_id>/<name>")
def confirm(payment_id: str, name: str):
    label = _action(name)
    parsed = _payment_id(payment_id)
    with current_app.extensions["paycron.pool"].connection() as conn:
        try:
            shown = dead_letters.show(conn, parsed)
        except NotFound:
            raise ConsoleRefused(404, "No dead letter for this payment.") from None
    audit("console.read", "success", target=f"dead letter {parsed}", channel="console")
    return render_template(
        "console/confirm.html",
        name=name,
        label=label,
        explanation=explanation(
            name, shown["payment"], processor=current_app.extensions["paycron.gateway"].name
        ),
        payment=shown["payment"],
        letter=shown["dead_letters"][0],
    )


@bp.post("/dead-letters/<payment_id>/<name>")
def act(payment_id: str, name: str):
    _action(name)
    parsed = _payment_id(payment_id)
    note = request.form.get("note", "").strip()[:1000] or None
    with current_app.extensions["paycron.pool"].connection() as conn:
        done, message = _attempt(conn, name, parsed, note=note)
    flash(message, "done" if done else "refused")
    return redirect(url_for("console.dead_letters"))


@bp.post("/dead-letters/redrive-selected")
def redrive_selected():
    chosen = request.form.getlist("payment_id")
    ids = [parsed for text in dict.fromkeys(chosen) if (parsed := parse_payment_id(text))]
    if not ids:
        flash("Choose at least one dead letter to re-drive.", "refused")
        return redirect(url_for("console.dead_letters"))
    if len(ids) > MAX_SELECTION:
        raise ConsoleRefused(400, f"At most {MAX_SELECTION} payments at once.")
    if request.form.get("confirmed") != "yes":
        return render_template(
            "console/confirm_selection.html", ids=ids, explanation=explanation("redrive")
        )
    with current_app.extensions["paycron.pool"].connection() as conn:
        for payment_id in ids:
            done, message = _attempt(conn, "redrive", payment_id)
            flash(message, "done" if done else "refused")
    return redirect(url_for("console.dead_letters"))
