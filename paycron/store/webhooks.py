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
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from paycron.errors import LimitReached
from paycron.sql import q
from paycron.store.db import Connection

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


def backoff(
    attempts: int, *, base: float, cap: float, jitter: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after an event's ``attempts``-th failed delivery:
    ``base`` doubling per attempt up to ``cap``, times uniform(1 ± jitter)
    so endpoints that failed together do not retry together."""
    rng = rng or random.Random()
    exponent = min(max(attempts, 1) - 1, 32)  # 2**32 s is past any cap; no float overflow
    return min(cap, base * 2**exponent * rng.uniform(1 - jitter, 1 + jitter))


def create_endpoint(
    conn: Connection, *, actor: str, url: str, max_endpoints: int | None = None
) -> dict:
    """A new endpoint, with its secret (shown to the client once);
    :class:`LimitReached` when ``actor`` already has ``max_endpoints`` live
    ones (``MAX_WEBHOOK_ENDPOINTS``; None: no quota), and then nothing is created."""
    with conn.transaction():
        conn.execute(q("webhook_endpoint_lock_actor"), {"actor": actor})
        row = conn.execute(
            q("webhook_endpoint_create"),
            {"actor": actor, "url": url, "secret": new_secret(), "max_endpoints": max_endpoints},
        ).fetchone()
    if row is None:
        raise LimitReached(f"at most {max_endpoints} webhook endpoints; delete one first")
    return row


#: Sorts before every real (created_at, id): the keyset start of page one.
_FIRST_PAGE = ("-infinity", uuid.UUID(int=0))


def list_endpoints(
    conn: Connection,
    *,
    actor: str,
    limit: int,
    after: tuple[datetime, uuid.UUID] | None = None,
) -> tuple[list[dict], tuple[datetime, uuid.UUID] | None]:
    """A page of ``actor``'s live endpoints, oldest first, and the position
    the next page starts after (None on the last page)."""
    after_created_at, after_id = after or _FIRST_PAGE
    rows = conn.execute(
        q("webhook_endpoints_of"),
        {
            "actor": actor,
            "limit": limit + 1,
            "after_created_at": after_created_at,
            "after_id": after_id,
        },
    ).fetchall()
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], (last["created_at"], last["id"])


def delete_endpoint(conn: Connection, endpoint_id: uuid.UUID, *, actor: str) -> bool:
    """False when ``actor`` has no such endpoint (also another payer's)."""
    return (
        conn.execute(q("webhook_endpoint_delete"), {"id": endpoint_id, "actor": actor}).fetchone()
        is not None
    )


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
    rows = conn.execute(
        q("webhook_claim_endpoints"), {"limit": limit, "lease_seconds": lease_seconds}
    ).fetchall()
    return [
        Lease(endpoint_id=r["id"], url=r["url"], secret=r["secret"], owner=r["lease_owner"])
        for r in rows
    ]


def pending_events(conn: Connection, lease: Lease, *, limit: int) -> list[dict]:
    """The next events of the stream, each with its ``attempts`` so far."""
    return conn.execute(q("webhook_pending_events"), {**lease.params(), "limit": limit}).fetchall()


def record_delivered(
    conn: Connection, lease: Lease, event: dict, status: int, *, latency_ms: int | None = None
) -> Recorded:
    row = conn.execute(
        q("webhook_record_delivered"),
        {
            **lease.params(),
            "event_id": event["id"],
            "txid": event["txid"],
            "status": status,
            "latency_ms": latency_ms,
        },
    ).fetchone()
    if row is None:
        return Recorded.LEASE_LOST
    return Recorded.MOVED if row["live"] else Recorded.DELETED


def record_failed(
    conn: Connection,
    lease: Lease,
    event: dict,
    *,
    status: int | None,
    error: str,
    delay: float,
    latency_ms: int | None = None,
) -> None:
    """Records the attempt, backs the endpoint off ``delay`` seconds, releases it."""
    conn.execute(
        q("webhook_record_failed"),
        {
            **lease.params(),
            "event_id": event["id"],
            "status": status,
            "error": error,
            "delay": delay,
            "latency_ms": latency_ms,
        },
    )


@dataclass(frozen=True)
class Replay:
    """One claimed replay: where it goes, and its event (None: pruned)."""

    id: int
    lease: Lease  # the endpoint's URL and secret; it fences nothing
    live: bool
    event: dict | None


def claim_replays(conn: Connection, *, limit: int, lease_seconds: float) -> list[Replay]:
    """Lease up to ``limit`` of the replays operators asked for (the console
    inserts them), oldest first."""
    rows = conn.execute(
        q("webhook_claim_replays"), {"limit": limit, "lease_seconds": lease_seconds}
    ).fetchall()
    return [
        Replay(
            id=r["id"],
            lease=Lease(
                endpoint_id=r["endpoint_id"],
                url=r["url"],
                secret=r["secret"],
                owner=uuid.UUID(int=0),
            ),
            live=r["live"],
            event=(
                None
                if r["event_id"] is None
                else {
                    "id": r["event_id"],
                    **{k: r[k] for k in ("txid", "payment_id", "type", "status", "attempt")},
                    "data": r["data"],
                    "created_at": r["created_at"],
                }
            ),
        )
        for r in rows
    ]


def record_replay(
    conn: Connection,
    replay_id: int,
    *,
    status: int | None,
    error: str | None,
    latency_ms: int | None,
) -> None:
    conn.execute(
        q("webhook_record_replay"),
        {"id": replay_id, "status": status, "error": error, "latency_ms": latency_ms},
    )


def release(conn: Connection, lease: Lease) -> None:
    conn.execute(q("webhook_release_endpoint"), lease.params())


#: NAT64 prefixes (RFC 6052 well-known, RFC 8215 local use): the last 32 bits
#: are an IPv4 address that the translator connects to.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
#: IPv4-compatible IPv6 (deprecated by RFC 4291, still parsed): ::a.b.c.d.
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
#: IPv4-translated (SIIT, RFC 2765): ::ffff:0:a.b.c.d, which a stateless
#: translator maps to a.b.c.d (the IPv4-mapped ::ffff:a.b.c.d is ``ipv4_mapped``).
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
#: Site-local (RFC 3879 deprecated it, routers may still route it inside a
#: site); Python counts it as global.
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: host -> every address it resolves to, as text (an IP literal to itself).
Resolver = Callable[[str], Sequence[str]]


def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order, without repeats."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, which a translator or
    tunnel may connect to: 64:ff9b::7f00:1 reaches 127.0.0.1 through NAT64."""
    embedded = []
    if address.ipv4_mapped:
        embedded.append(address.ipv4_mapped)
    if address.sixtofour:
        embedded.append(address.sixtofour)
    if address.teredo:
        embedded.extend(address.teredo)  # (server, client)
    if address in _NAT64 or address in _IPV4_COMPATIBLE or address in _IPV4_TRANSLATED:
        embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return embedded


def is_public(address: IPAddress) -> bool:
    """Whether the relay may connect to ``address``: a global unicast address,
    and so is every IPv4 address embedded in it."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64_LOCAL:  # the IPv4 part's place varies with the prefix length
            return False
        if address in _SITE_LOCAL:
            return False
        return all(is_public(v4) for v4 in _embedded_ipv4(address))
    return True


@dataclass(frozen=True)
class Destination:
    """Where one delivery goes: the URL's parts and the address to connect to,
    the one that was checked (never resolved again: DNS rebinding)."""

    scheme: str
    #: As in the URL (IDNA-encoded, IPv6 in brackets): the Host header, the
    #: TLS server name and the name the certificate must carry.
    host: str
    port: int
    #: Path and query, the request target.
    target: str
    address: str

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Refused:
    """Why a URL is not a destination: the rule it broke, never the address
    it resolved to (that would map internal DNS for whoever registers)."""

    rule: str
    #: What the relay records as the delivery's error.
    code: str = "forbidden_destination"


def check_destination(
    url: str, *, resolve: Resolver = resolve_host, allow_private: bool = False
) -> Destination | Refused:
    """Resolve ``url``'s host once and check every address it gave.

    The relay runs inside our network: a payer must not point it at an
    internal service or a cloud metadata address (SSRF). Every address must
    be public (:func:`is_public`), and the caller connects to the returned
    ``address``, so a name that answers a public address to this check and
    127.0.0.1 to a second lookup gets no second lookup. Tests and on-premise
    set-ups allow private hosts with WEBHOOK_ALLOW_PRIVATE_HOSTS.
    """
    try:
        parts = parse_url(url)
    except LocationParseError:
        return Refused("the URL cannot be parsed")
    if parts.scheme not in ("http", "https") or not parts.host:
        return Refused("the URL has no http(s) scheme and host")
    host = parts.host
    try:
        addresses = [ipaddress.ip_address(a) for a in resolve(host.strip("[]"))]
    except (OSError, UnicodeError, ValueError):
        addresses = []
    if not addresses:
        return Refused("the host does not resolve", code="name_not_resolved")
    if not allow_private and not all(is_public(a) for a in addresses):
        return Refused(
            "the host resolves to a non-public address (every address it "
            "resolves to must be a public one)"
        )
    default_port = 443 if parts.scheme == "https" else 80
    return Destination(
        scheme=parts.scheme,
        host=host,
        port=parts.port or default_port,
        target=parts.request_uri,
        address=str(addresses[0]),
    )


def forbidden_destination(url: str, *, resolve: Resolver = resolve_host) -> str | None:
    """Why the relay must not call ``url`` (the rule, see :func:`check_destination`), or None.
    Checked when the endpoint is registered; the relay checks again before each delivery."""
    checked = check_destination(url, resolve=resolve)
    return checked.rule if isinstance(checked, Refused) else None
