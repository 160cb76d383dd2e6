"""An endpoint's webhook deliveries and their replay (docs/console.md,
"Webhook deliveries").

A replay is only queued here (a ``webhook_replays`` row, audited as
``webhook.replay``): a relay (``scheduler/relay.py``) sends it, so the
request that asks for it never waits on the endpoint.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from flask import current_app, flash, g, redirect, render_template, request, url_for

from paycron.sql import parse_blocks
from web.audit import audit
from web.console import bp, reads
from web.console.session import ConsoleRefused

QUERIES = parse_blocks((Path(__file__).parent / "deliveries.sql").read_text())

#: Deliveries on one page of an endpoint; replays shown with them.
DELIVERIES_PAGE = reads.PAGE
REPLAYS_SHOWN = 20
_BIGINT_MAX = 2**63 - 1


def _endpoint_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ConsoleRefused(404, "No webhook endpoint has this id.") from None


@bp.get("/webhooks/<endpoint_id>")
def webhook_endpoint(endpoint_id: str):
    parsed = _endpoint_id(endpoint_id)
    cursor = request.args.get("cursor") or None
    try:
        before = int(cursor) if cursor else _BIGINT_MAX
    except ValueError:
        before = -1
    if not 0 <= before <= _BIGINT_MAX:
        raise ConsoleRefused(400, "A bad page cursor.")
    with current_app.extensions["paycron.pool"].connection() as conn:
        endpoint = conn.execute(QUERIES["webhook_endpoint"], {"id": parsed}).fetchone()
        if endpoint is None:
            raise ConsoleRefused(404, "No webhook endpoint has this id.")
        rows = conn.execute(
            QUERIES["webhook_deliveries_page"],
            {"endpoint_id": parsed, "before_event_id": before, "limit": DELIVERIES_PAGE + 1},
        ).fetchall()
        replays = conn.execute(
            QUERIES["webhook_replays_of"], {"endpoint_id": parsed, "limit": REPLAYS_SHOWN}
        ).fetchall()
    more, rows = len(rows) > DELIVERIES_PAGE, rows[:DELIVERIES_PAGE]
    page = reads.Page(rows, str(rows[-1]["event_id"]) if more else None)
    audit("console.read", "success", target=f"webhook endpoint {parsed}", channel="console")
    return render_template(
        "console/webhook_endpoint.html", endpoint=endpoint, deliveries=page, replays=replays
    )


@bp.post("/webhooks/<endpoint_id>/deliveries/<int:event_id>/replay")
def replay_delivery(endpoint_id: str, event_id: int):
    """Queue one delivery to be sent again; the relay sends it (signed anew)
    outside the endpoint's stream, and the endpoint's page shows the answer."""
    parsed = _endpoint_id(endpoint_id)
    target = f"webhook endpoint {parsed} event {event_id}"
    if event_id > _BIGINT_MAX:
        audit("webhook.replay", "refused", target=target, reason="no such event", channel="console")
        raise ConsoleRefused(404, "This endpoint has no delivery of that event.")
    with current_app.extensions["paycron.pool"].connection() as conn:
        row = conn.execute(
            QUERIES["webhook_replay_request"],
            {"endpoint_id": parsed, "event_id": event_id, "requested_by": g.operator.actor},
        ).fetchone()
    if row is None:
        audit(
            "webhook.replay",
            "refused",
            target=target,
            reason="no such delivery, the endpoint was deleted or the event pruned",
            channel="console",
        )
        raise ConsoleRefused(
            404,
            "Nothing to replay: this endpoint has no delivery of that event, "
            "was deleted, or the event is no longer kept.",
        )
    audit(
        "webhook.replay", "success", target=target, reason=f"replay {row['id']}", channel="console"
    )
    flash(f"Replay {row['id']} of event {event_id} queued: the relay sends it within seconds.")
    return redirect(url_for("console.webhook_endpoint", endpoint_id=parsed))
