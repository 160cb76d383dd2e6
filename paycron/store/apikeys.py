"""Bearer API keys. The key is shown once; only its sha256 is stored.

A key is ``pc_<prefix>_<secret>``: the prefix identifies it in listings and
revocations without revealing it; the secret carries 256 random bits, which
is why a plain sha256 (not a slow KDF) is the right hash.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from paycron.sql import q
from paycron.store.db import Connection, Pool, one_row

SCOPE_PAYMENTS = "payments"
SCOPE_ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the actor is the payer of every payment they create."""

    actor: str
    scopes: tuple[str, ...]
    #: The key's row id: what a console session remembers instead of the key.
    key_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return SCOPE_ADMIN in self.scopes


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def create_api_key(conn: Connection, actor: str, *, admin: bool = False) -> tuple[str, dict]:
    """A new key for ``actor``: returns (the key, shown once; its stored row)."""
    prefix = secrets.token_hex(4)
    key = f"pc_{prefix}_{secrets.token_urlsafe(32)}"
    scopes = [SCOPE_PAYMENTS, SCOPE_ADMIN] if admin else [SCOPE_PAYMENTS]
    row = one_row(
        conn.execute(
            q("create_api_key"),
            {"actor": actor, "prefix": prefix, "key_hash": hash_key(key), "scopes": scopes},
        )
    )
    return key, row


def _find_principal(conn: Connection, key_hash: bytes) -> Principal | None:
    row = conn.execute(q("find_api_key"), {"key_hash": key_hash}, prepare=True).fetchone()
    if row is None:
        return None
    return Principal(actor=row["actor"], scopes=tuple(row["scopes"]), key_id=row["id"])


class PrincipalCache:
    """Keys a process has authenticated, trusted for ``ttl`` seconds.

    Looking the key up costs a database round trip per request, as much as
    the create itself; with the cache a create is one round trip. The price
    is that a revocation takes up to ``ttl`` seconds to reach every process.
    Unknown and revoked keys are never remembered, so a new key works at
    once and guessing keys cannot fill the cache; it is keyed by the key's
    sha256, so no process keeps a key in memory longer than its request.
    """

    def __init__(
        self,
        ttl: float,
        *,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.ttl = ttl
        self.max_entries = max_entries
        self._monotonic = monotonic
        # Plain dict operations are atomic under the GIL: no lock needed for
        # gthread workers; a racing miss just looks the key up twice.
        self._entries: dict[bytes, tuple[float, Principal]] = {}
        self._by_id: dict[int, tuple[float, Principal]] = {}

    def authenticate(self, pool: Pool, key: str) -> Principal | None:
        key_hash = hash_key(key)
        now = self._monotonic()
        hit = self._entries.get(key_hash)
        if hit is not None and hit[0] > now:
            return hit[1]
        with pool.connection() as conn:
            principal = _find_principal(conn, key_hash)
        if principal is None:
            self._entries.pop(key_hash, None)
        elif self.ttl > 0:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # rare; simpler than LRU and just as bounded
            self._entries[key_hash] = (now + self.ttl, principal)
        return principal

    def by_id(self, pool: Pool, key_id: int) -> Principal | None:
        """The live key with this id (a console session's), trusted as long
        as a key presented by the API: a revoked key's sessions end within
        ``ttl`` seconds, as its API requests do."""
        now = self._monotonic()
        hit = self._by_id.get(key_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        with pool.connection() as conn:
            row = conn.execute(q("find_api_key_by_id"), {"id": key_id}).fetchone()
        principal = (
            None
            if row is None
            else Principal(actor=row["actor"], scopes=tuple(row["scopes"]), key_id=row["id"])
        )
        if principal is None:
            self._by_id.pop(key_id, None)
        elif self.ttl > 0:
            if len(self._by_id) >= self.max_entries:
                self._by_id.clear()
            self._by_id[key_id] = (now + self.ttl, principal)
        return principal


def list_api_keys(conn: Connection) -> list[dict]:
    return conn.execute(q("list_api_keys")).fetchall()


@dataclass(frozen=True)
class Revocation:
    """What a revocation did: the key it revoked, or none and the active
    keys that share the prefix it was given (none: no such key)."""

    revoked: dict | None
    ambiguous: list[dict]


def revoke_api_key(conn: Connection, prefix: str) -> Revocation:
    """Revoke the one active key with ``prefix``; when several share it,
    revoke none (name one by id, :func:`revoke_api_key_by_id`)."""
    row = conn.execute(q("revoke_api_key"), {"prefix": prefix}).fetchone()
    if row is not None:
        return Revocation(revoked=row, ambiguous=[])
    shared = conn.execute(q("active_api_keys_with_prefix"), {"prefix": prefix}).fetchall()
    return Revocation(revoked=None, ambiguous=shared if len(shared) > 1 else [])


def revoke_api_key_by_id(conn: Connection, key_id: int) -> Revocation:
    row = conn.execute(q("revoke_api_key_by_id"), {"id": key_id}).fetchone()
    return Revocation(revoked=row, ambiguous=[])
