"""The execute actor: one message = a small group of claimed payments,
handed to this process's dispatcher (paycron/engine/inflight.py).

Postgres is the only retry layer: the actor is never retried by Dramatiq
(``max_retries=0``). A lost or failed message leaves PROCESSING rows whose
lease the reaper returns; a duplicated or late one is dropped by the fence.
"""

from __future__ import annotations

import dramatiq

from paycron.engine.messages import EXECUTE_ACTOR, decode_claims
from tasks.broker import config
from tasks.runtime import async_dispatcher, dispatcher

_OPTIONS = dict(
    actor_name=EXECUTE_ACTOR,
    queue_name=config.queue_name,
    max_retries=0,
    # The actor only admits the group (its calls run in the dispatcher's
    # background, within the in-flight limit); the wait for room is bounded
    # by the calls ahead of it, each shorter than a lease.
    time_limit=int(config.lease_seconds * 1000),
)

if config.execution == "asyncio":

    @dramatiq.actor(**_OPTIONS)  # type: ignore[call-overload]
    async def execute_payments(claims: list[list], probe: bool = False) -> None:
        dispatcher = await async_dispatcher(config)
        await dispatcher.submit(decode_claims(claims), probe=probe)

else:

    @dramatiq.actor(**_OPTIONS)  # type: ignore[call-overload]
    def execute_payments(claims: list[list], probe: bool = False) -> None:
        dispatcher(config).submit(decode_claims(claims), probe=probe)
