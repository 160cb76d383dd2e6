"""Webhook endpoints, their signatures and their delivery streams.

An endpoint receives its payer's events, from its creation on, as one
ordered stream (the events feed's order) whose cursor lives on the endpoint
row. The relay (``scheduler/relay.py``) claims endpoints with a lease, POSTs
each event outside any transaction, and records every attempt here; the SQL
is in ``webhooks.sql``; the request and signature scheme are described in
``scheduler/relay.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import random
import secrets
import socket
import urllib.parse
import uuid
from dataclasses import dataclass
from enum import Enum

from psycopg import Connection

from paycron.sql import q

SIGNATURE_HEADER = "Paycron-Signature"
EVENT_ID_HEADER = "Paycron-Event-Id"
#: Secrets carry 256 random bits; the prefix makes a leaked one recognisable.
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Paycron-Signature`` header value for ``body`` sent at ``timestamp``:
    ``t=<timestamp>,v1=<hex HMAC-SHA256>`` keyed with the whole secret string
    (UTF-8) over ``f"{timestamp}.{body}"``, the exact body bytes."""
    signed = str(timestamp).encode() + b"." + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def backoff(attempts: int, *, base: float, cap: float, jitter: float,
            rng: random.Random | None = None) -> float:
    """Seconds to wait after an event's ``attempts``-th failed delivery:
    ``base`` doubling per attempt up to ``cap``, times uniform(1 ± jitter)
    so endpoints that failed together do not retry together."""
    rng = rng or random.Random()
    exponent = min(max(attempts, 1) - 1, 32)  # 2**32 s is past any cap; no float overflow
    return min(cap, base * 2 ** exponent * rng.uniform(1 - jitter, 1 + jitter))


def create_endpoint(conn: Connection, *, actor: str, url: str) -> dict:
    """A new endpoint, with its secret (shown to the client once)."""
    return conn.execute(q("webhook_endpoint_create"),
                        {"actor": actor, "url": url, "secret": new_secret()}).fetchone()


def list_endpoints(conn: Connection, *, actor: str) -> list[dict]:
    return conn.execute(q("webhook_endpoints_of"), {"actor": actor}).fetchall()


def delete_endpoint(conn: Connection, endpoint_id: uuid.UUID, *, actor: str) -> bool:
    """False when ``actor`` has no such endpoint (also another payer's)."""
    return conn.execute(q("webhook_endpoint_delete"),
                        {"id": endpoint_id, "actor": actor}).fetchone() is not None


@dataclass(frozen=True)
class Lease:
    """One claimed endpoint: only this claim may move its cursor."""

    endpoint_id: uuid.UUID
    url: str
    secret: str
    owner: uuid.UUID

    def params(self) -> dict:
        return {"endpoint_id": self.endpoint_id, "lease_owner": self.owner}


class Recorded(Enum):
    """What recording a delivery found."""

    MOVED = "moved"  # cursor past the event, lease held: go on
    DELETED = "deleted"  # moved, but the endpoint was deleted meanwhile: stop
    LEASE_LOST = "lease_lost"  # the lease ran out and the stream is another's: stop


def claim_endpoints(conn: Connection, *, limit: int, lease_seconds: float) -> list[Lease]:
    rows = conn.execute(q("webhook_claim_endpoints"),
                        {"limit": limit, "lease_seconds": lease_seconds}).fetchall()
    return [Lease(endpoint_id=r["id"], url=r["url"], secret=r["secret"], owner=r["lease_owner"])
            for r in rows]


def pending_events(conn: Connection, lease: Lease, *, limit: int) -> list[dict]:
    """The next events of the stream, each with its ``attempts`` so far."""
    return conn.execute(q("webhook_pending_events"), {**lease.params(), "limit": limit}).fetchall()


def record_delivered(conn: Connection, lease: Lease, event: dict, status: int) -> Recorded:
    row = conn.execute(q("webhook_record_delivered"), {
        **lease.params(), "event_id": event["id"], "txid": event["txid"], "status": status,
    }).fetchone()
    if row is None:
        return Recorded.LEASE_LOST
    return Recorded.MOVED if row["live"] else Recorded.DELETED


def record_failed(conn: Connection, lease: Lease, event: dict, *, status: int | None,
                  error: str, delay: float) -> None:
    """Records the attempt, backs the endpoint off ``delay`` seconds, releases it."""
    conn.execute(q("webhook_record_failed"), {
        **lease.params(), "event_id": event["id"], "status": status, "error": error,
        "delay": delay,
    })


def release(conn: Connection, lease: Lease) -> None:
    conn.execute(q("webhook_release_endpoint"), lease.params())


def forbidden_destination(url: str) -> str | None:
    """Why the relay must not call ``url``, or None.

    The relay runs inside our network: a payer must not point it at an
    internal service or a cloud metadata address (SSRF). Every address the
    host resolves to must be a public one. Checked when the endpoint is
    registered and again before each delivery (DNS may change); tests and
    on-premise set-ups allow private hosts with WEBHOOK_ALLOW_PRIVATE_HOSTS.
    """
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        return "the URL has no host"
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return f"{host} does not resolve"
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global or address.is_multicast:
            return f"{host} resolves to a non-public address ({address})"
    return None
