"""The web's side of the audit log (``paycron.observability.audit``): the
request's client address, and who is asking, filled in for every line.

``audit(...)`` for a single line; ``audited(...)`` around an action, which
records how it ended (success, refused, failure) and lets its error go on
to the handler that answers it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flask import current_app, g, has_request_context, request

from paycron.errors import DeadLetterActionRefused, NotFound
from paycron.observability.audit import record, remote_address
from paycron.store.apikeys import Principal


def client_address() -> str | None:
    """The client's address, believing ``X-Forwarded-For`` only from a
    peer in ``TRUSTED_PROXIES``."""
    if not has_request_context():
        return None
    proxies = current_app.extensions["paycron.config"].trusted_proxies
    return remote_address(request.remote_addr, request.headers.get("X-Forwarded-For"), proxies)


def request_target() -> str:
    """``METHOD /path`` (never the query string: it can name a payer)."""
    return f"{request.method} {request.path}"


def audit(
    event: str,
    outcome: str,
    *,
    principal: Principal | None = None,
    target: object = None,
    reason: object = None,
    channel: str | None = None,
    key_id: int | None = None,
) -> dict:
    who = principal or g.get("operator") or g.get("principal")
    return record(
        event,
        outcome,
        actor=who.actor if who else None,
        key_id=who.key_id if who else key_id,
        remote_addr=client_address(),
        target=target,
        reason=reason,
        channel=channel,
    )


@contextlib.contextmanager
def audited(event: str, *, target: object, channel: str, reason: object = None) -> Iterator[None]:
    """Record ``event`` as it ends: ``refused`` when the engine refused it
    (resolved already, nothing to refund, no such letter), ``failure`` when
    it raised anything else (the gateway could not be asked), else
    ``success``."""
    try:
        yield
    except (DeadLetterActionRefused, NotFound) as refused:
        audit(event, "refused", target=target, reason=str(refused), channel=channel)
        raise
    except Exception as failed:
        audit(event, "failure", target=target, reason=type(failed).__name__, channel=channel)
        raise
    audit(event, "success", target=target, reason=reason, channel=channel)
