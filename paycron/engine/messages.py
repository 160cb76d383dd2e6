"""The one message the scheduler sends the workers (docs/design.md: the parts talk
only through Postgres rows and Dramatiq messages): "execute this group of
claims". Both sides use this module, so neither imports the other's wiring.

A message carries ``(payment_id, due_at, attempt)`` per claim and whether it
is the breaker's probe; the worker trusts nothing in it beyond what the row
confirms (its fence is ``status='PROCESSING' AND attempt = N``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import dramatiq

from paycron.store.transitions import Claim

#: The worker's actor that executes a group of claims.
EXECUTE_ACTOR = "execute_payments"


def encode_claims(claims: Sequence[Claim]) -> list[list]:
    return [[str(c.payment_id), c.due_at.isoformat(), c.attempt] for c in claims]


def decode_claims(raw: list[list]) -> list[Claim]:
    return [Claim(uuid.UUID(pid), datetime.fromisoformat(due), int(n)) for pid, due, n in raw]


def execute_message(claims: Sequence[Claim], *, probe: bool, queue_name: str) -> dramatiq.Message:
    return dramatiq.Message(
        queue_name=queue_name,
        actor_name=EXECUTE_ACTOR,
        args=(encode_claims(claims), probe),
        kwargs={},
        options={},
    )
