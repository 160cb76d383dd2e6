"""The audit log: who did what to which payment, from where, and how it ended.

One JSON object per line on the logger ``paycron.audit`` (see
``docs/audit-log.md``), written to standard error by every process that
configures logging (:func:`configure_audit_log`). Each line has the same
fields, in the same order::

    {"time": "2026-12-03T08:15:02.311Z", "event": "console.sign_in",
     "outcome": "success", "actor": "ops-ann", "key_id": 7,
     "remote_addr": "203.0.113.9", "target": null, "reason": null}

``event`` is a dotted name of a fixed vocabulary (:data:`EVENTS`), ``outcome``
one of ``success``, ``failure`` (the action was tried and did not work) and
``refused`` (it was not allowed). Nothing secret is ever a field: no API key,
no cookie or session id, no customer or payment method; free text (a
reason, a filter) is bounded and a processor token in it is blanked.

:func:`remote_address` is the one rule for the client's address: the TCP
peer, unless the peer is one of ``TRUSTED_PROXIES``, in which case the
right-most address of ``X-Forwarded-For`` that is not itself a trusted proxy.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime

from sentry_sdk.integrations.logging import ignore_logger

from paycron.observability.sentry import redact_tokens

LOGGER_NAME = "paycron.audit"
log = logging.getLogger(LOGGER_NAME)

OUTCOMES = ("success", "failure", "refused")

#: Every event the audit log knows, and what it records.
EVENTS = {
    "console.sign_in": "an operator signs in (failure: unknown or revoked key; refused: payer key)",
    "console.sign_out": "an operator signs out",
    "console.session_ended": "a console session is ended by its key's revocation",
    "console.unauthenticated": "a console page asked for without a session",
    "console.csrf_refused": "a console form sent without its CSRF token",
    "console.read": "an operator reads payer data (a page, a search)",
    "api.unauthorized": "an API request without a valid key (401)",
    "api.forbidden": "a payer key on an admin route (answered 404)",
    "metrics.unauthorized": "a scrape without the metrics token (401)",
    "admin.read": "an admin key reads payer data through the admin API",
    "dead_letter.redrive": "a dead letter re-driven (admin API or console)",
    "dead_letter.refund": "a dead letter's charge refunded (admin API or console)",
    "dead_letter.dismiss": "a dead letter dismissed (admin API or console)",
    "console.bulk_request": "an operator asks for a bulk action over a filter (console)",
    "console.bulk_approve": "a second operator approves a bulk action (console)",
    "console.bulk_reject": "a second operator rejects a bulk action (console)",
    "console.bulk_expire": "a bulk action's approval request expires undecided",
    "console.bulk_finish": "a bulk action has acted on (or refused) each of its payments",
    "payment.cancel": "an operator cancels a PENDING payment (console)",
    "webhook.replay": "a webhook delivery queued to be sent again (console)",
    "api_key.create": "an API key created (CLI)",
    "api_key.revoke": "an API key revoked (CLI)",
    "customer.register": "a processor customer registered to a payer (admin API or CLI)",
    "customer.remove": "a processor customer's binding to its payer removed (admin API or CLI)",
}

#: Free text (a target, a reason) is cut to this many characters.
MAX_TEXT = 200


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = redact_tokens(str(value))
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def record(
    event: str,
    outcome: str,
    *,
    actor: str | None = None,
    key_id: int | None = None,
    remote_addr: str | None = None,
    target: object = None,
    reason: object = None,
    channel: str | None = None,
) -> dict:
    """Write one audit line and return it (as a dict)."""
    if event not in EVENTS:
        raise ValueError(f"not an audit event: {event!r}")
    if outcome not in OUTCOMES:
        raise ValueError(f"not an audit outcome: {outcome!r}")
    line = {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": event,
        "outcome": outcome,
        "actor": _text(actor),
        "key_id": key_id,
        "remote_addr": remote_addr,
        "target": _text(target),
        "reason": _text(reason),
    }
    if channel is not None:
        line["channel"] = channel
    # The template alone reaches Sentry (breadcrumbs): never the line's data.
    log.info("%s", json.dumps(line, ensure_ascii=True))
    return line


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None


def _trusted(address, proxies: Iterable[Network]) -> bool:
    return address is not None and any(address in network for network in proxies)


def remote_address(
    peer: str | None, forwarded_for: str | None, proxies: tuple[Network, ...]
) -> str | None:
    """The client's address: ``peer`` unless it is a trusted proxy; then
    the right-most ``X-Forwarded-For`` hop that is not a trusted proxy (a
    client can write any left-hand hops it likes, so those are never
    believed). A malformed hop ends the walk at the last address known."""
    current = _address(peer or "")
    if current is None:
        return peer
    if not forwarded_for or not _trusted(current, proxies):
        return str(current)
    for hop in reversed(forwarded_for.split(",")):
        address = _address(hop)
        if address is None:
            break
        current = address
        if not _trusted(address, proxies):
            break
    return str(current)


class _MessageOnly(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage()


def configure_audit_log(stream=None) -> logging.Logger:
    """Send ``paycron.audit`` to ``stream`` (standard error), one JSON
    object per line and nothing else on it; once per process."""
    if not any(getattr(h, "_paycron_audit", False) for h in log.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(_MessageOnly())
        handler._paycron_audit = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    ignore_logger(LOGGER_NAME)  # an audit line is no breadcrumb of an error
    log.propagate = False  # the lines are complete; no second copy through root
    return log
