"""Payment ids that carry their own partition.

``payments`` is partitioned by ``due_at`` and its key is ``(id, due_at)``; a
lookup by id alone would have to probe every day partition (13–16 ms with
400 of them). So a payment id is UUIDv7-shaped with the *due time* (not the
creation time) in its 48 timestamp bits: from the id alone we derive a
one-millisecond ``due_at`` range, and Postgres prunes to exactly one
partition. The remaining 74 bits are random, so ids stay unguessable.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

_ONE_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The last millisecond a datetime can hold (9999-12-31T23:59:59.999Z).
_LAST_MILLI = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - _EPOCH) // _ONE_MS
#: An id's random bits: 128 less 48 of time, 4 of version and 2 of variant.
_RANDOM_BITS = 74


def new_payment_id(due_at: datetime) -> uuid.UUID:
    """A fresh id whose timestamp bits are ``due_at`` in Unix milliseconds."""
    return _payment_id(due_at, secrets.randbits(_RANDOM_BITS))


def new_payment_ids(due_ats: Sequence[datetime]) -> list[uuid.UUID]:
    """A fresh id for each of ``due_ats``, as :func:`new_payment_id` makes
    them, from one read of the system's randomness for them all (a read is
    a system call: one per id was a tenth of a batch create's CPU)."""
    size = (_RANDOM_BITS + 7) // 8
    pool = secrets.token_bytes(size * len(due_ats))
    mask = (1 << _RANDOM_BITS) - 1
    return [
        _payment_id(due_at, int.from_bytes(pool[i * size : (i + 1) * size]) & mask)
        for i, due_at in enumerate(due_ats)
    ]


def _payment_id(due_at: datetime, rand: int) -> uuid.UUID:
    # Integer arithmetic: a float timestamp can round across a millisecond edge.
    millis = (due_at - _EPOCH) // _ONE_MS
    if not 0 <= millis < 1 << 48:
        raise ValueError("due_at out of range for a payment id")
    value = (millis << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62)
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def due_range(payment_id: uuid.UUID) -> tuple[datetime, datetime]:
    """The half-open ``[from, to)`` range of ``due_at`` a payment id can have."""
    millis = payment_id.int >> 80
    start = _EPOCH + millis * _ONE_MS
    return start, start + _ONE_MS


def parse_payment_id(text: str) -> uuid.UUID | None:
    """The id in a URL, or None when it is not a well-formed payment id."""
    try:
        value = uuid.UUID(text)
    except (ValueError, TypeError, AttributeError):
        return None
    if value.version != 7 or str(value) != text.lower():
        return None
    if value.int >> 80 > _LAST_MILLI:  # a time past the calendar: no such payment
        return None
    return value
