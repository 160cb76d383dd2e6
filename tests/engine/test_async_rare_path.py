"""The event loop's rare path (EXECUTOR=asyncio): a payment in doubt is
called on a thread with the blocking client, and after a processor's
brownout most payments are in doubt. Those calls run side by side up to the
in-flight limit, as the threaded executor's do, not a few at a time on
asyncio's default handful of threads (paycron/engine/aio.py)."""

from __future__ import annotations

import threading

import redis

from paycron.engine.execution import Executor
from paycron.limits.breaker import CircuitBreaker
from paycron.processors.card.aio import AsyncCardProcessor
from paycron.processors.card.client import CardProcessor
from paycron.store.db import make_pool
from paycron.store.transitions import claim_due
from tests.aio_support import AsyncFacade
from tests.factories import insert_payment
from tests.rows import payment

IN_DOUBT = 24  # four times the threads asyncio's default gives a 2-core machine


class CountingCardProcessor(CardProcessor):
    """The blocking client, counting its charges in flight at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def charge(self, *args, **kwargs):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().charge(*args, **kwargs)
        finally:
            with self.lock:
                self.now -= 1


def test_payments_in_doubt_are_called_side_by_side_on_the_loop(config, gateway, conn):
    gateway.faults(latency_ms=500)  # every call in flight long enough to overlap
    config = config.with_overrides(gateway_max_in_flight=64)
    ids = [insert_payment(conn)["id"] for _ in range(IN_DOUBT)]
    conn.execute("UPDATE payments SET in_doubt = true WHERE id = ANY(%s)", (ids,))
    claims = claim_due(conn, limit=IN_DOUBT, lease_seconds=config.lease_seconds)
    assert len(claims) == IN_DOUBT
    blocking = CountingCardProcessor(gateway.url, timeout=5, max_connections=64)
    with make_pool(config, max_size=4, name="rare-path") as pool:
        executor = Executor(
            config=config,
            pool=pool,
            gateway=blocking,
            breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
            call_limiter=None,
        )
        facade = AsyncFacade(executor, gateway.url, charger=AsyncCardProcessor)
        try:
            counts = facade.execute(claims)
        finally:
            facade.close()
    assert counts.calls == IN_DOUBT
    assert {payment(conn, pid)["status"] for pid in ids} == {"COMPLETED"}
    assert blocking.most == IN_DOUBT, f"at most {blocking.most} of {IN_DOUBT} calls at once"
