"""Idempotency keys: requests serialized per key, definitive answers replayed.

A key's answer is kept as the bytes first sent, so a replay is byte for
byte the same whichever surface stored it. Which answers are definitive
(stored) is the surface's decision, not the store's.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from gateway.fake.errors import KeyInUse, KeyMismatch

#: Keys are remembered a day, as at Stripe; the engine must not rely on more.
DEFAULT_KEY_RETENTION_SECONDS = 86400.0


class KeyEntry:
    """One idempotency key: its request fingerprint and, once known, its stored answer.

    `status` is None while the first request is still being processed.
    """

    __slots__ = ("key", "fingerprint", "status", "body", "expires_at")

    def __init__(self, key: str, fingerprint: tuple[Any, ...]) -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.status: int | None = None
        self.body = b""
        self.expires_at = 0.0

    @property
    def answered(self) -> bool:
        """True if the entry holds a stored answer to replay."""
        return self.status is not None


class KeyStore:
    """Every key in use or remembered, forgotten `retention_seconds` after its answer.

    The retention is the same for every key, so the expiry queue is in
    expiry order and each claim prunes it in amortized O(1).
    """

    def __init__(self, *, retention_seconds: float = DEFAULT_KEY_RETENTION_SECONDS) -> None:
        self.retention_seconds = retention_seconds
        self._entries: dict[str, KeyEntry] = {}
        self._expiry: deque[KeyEntry] = deque()

    def claim(self, key: str, fingerprint: tuple[Any, ...]) -> KeyEntry:
        """Take `key` for a new request, or hand back the answer it already holds.

        The entry returned is either fresh (not `answered`: the caller now
        processes the request and must `store` or `release` it) or holds
        the stored answer to replay. Raises `KeyMismatch` for another body
        under the key, `KeyInUse` while its first request is in progress.
        """
        self._prune(time.monotonic())
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = KeyEntry(key, fingerprint)
            return entry
        if entry.fingerprint != fingerprint:
            raise KeyMismatch("this Idempotency-Key was used with a different request body")
        if entry.status is None:
            raise KeyInUse("a request with this Idempotency-Key is still being processed")
        return entry

    def store(self, entry: KeyEntry, status: int, body: bytes) -> None:
        """Keep a definitive answer for the entry's key."""
        entry.status = status
        entry.body = body
        entry.expires_at = time.monotonic() + self.retention_seconds
        self._expiry.append(entry)

    def release(self, entry: KeyEntry) -> None:
        """Free a key whose request ended without a definitive answer (nothing is kept)."""
        if entry.status is None and self._entries.get(entry.key) is entry:
            del self._entries[entry.key]

    def clear(self) -> None:
        """Forget every key."""
        self._entries.clear()
        self._expiry.clear()

    def _prune(self, now: float) -> None:
        """Forget keys whose retention has passed."""
        expiry = self._expiry
        while expiry and expiry[0].expires_at <= now:
            entry = expiry.popleft()
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
