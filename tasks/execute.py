"""The execute actor: one message = a small group of claimed payments.

Postgres is the only retry layer: the actor is never retried by Dramatiq
(``max_retries=0``). A lost or failed message leaves PROCESSING rows whose
lease the reaper returns; a duplicated or late one is dropped by the fence.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import dramatiq

from paycron.transitions import Claim
from tasks.broker import config
from tasks.runtime import executor


def encode_claims(claims: list[Claim]) -> list[list]:
    return [[str(c.payment_id), c.due_at.isoformat(), c.attempt] for c in claims]


def decode_claims(raw: list[list]) -> list[Claim]:
    return [Claim(uuid.UUID(pid), datetime.fromisoformat(due), int(n)) for pid, due, n in raw]


@dramatiq.actor(
    queue_name=config.queue_name,
    max_retries=0,
    # The whole group's calls fit in half a lease (Config.group_size).
    time_limit=int(config.lease_seconds * 1000),
)
def execute_payments(claims: list[list], probe: bool = False) -> None:
    executor(config).execute(decode_claims(claims), probe=probe)
