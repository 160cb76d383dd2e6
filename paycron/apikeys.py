"""Bearer API keys. The key is shown once; only its sha256 is stored.

A key is ``pc_<prefix>_<secret>``: the prefix identifies it in listings and
revocations without revealing it; the secret carries 256 random bits, which
is why a plain sha256 (not a slow KDF) is the right hash.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from psycopg import Connection

from paycron.sql import q

SCOPE_PAYMENTS = "payments"
SCOPE_ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the actor is the payer of every payment they create."""

    actor: str
    scopes: tuple[str, ...]

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
    row = conn.execute(q("create_api_key"), {
        "actor": actor, "prefix": prefix, "key_hash": hash_key(key), "scopes": scopes,
    }).fetchone()
    return key, row


def authenticate(conn: Connection, key: str) -> Principal | None:
    row = conn.execute(q("find_api_key"), {"key_hash": hash_key(key)}, prepare=True).fetchone()
    if row is None:
        return None
    return Principal(actor=row["actor"], scopes=tuple(row["scopes"]))


def list_api_keys(conn: Connection) -> list[dict]:
    return conn.execute(q("list_api_keys")).fetchall()


def revoke_api_key(conn: Connection, prefix: str) -> dict | None:
    return conn.execute(q("revoke_api_key"), {"prefix": prefix}).fetchone()
