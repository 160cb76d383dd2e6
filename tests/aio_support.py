"""The async executor (EXECUTOR=asyncio) behind the threaded executor's
face, so one test runs against both: its own event loop on a thread, as a
worker process's, and ``execute`` blocking until the group is done."""

from __future__ import annotations

import asyncio
import threading

import uvloop

from paycron.engine.aio import AsyncExecutor
from paycron.engine.execution import Executor
from paycron.limits.aio import AsyncCallLimiter, AsyncCircuitBreaker
from paycron.processors.card.aio import AsyncCardProcessor
from paycron.store.aio import async_redis, make_async_pool

#: The executors a test that takes ``executor_kind`` runs against.
EXECUTORS = ["threads", "asyncio"]
#: With the loop's executor also paced by the shared call window: its
#: breaker is then asked in the window's script (paycron/limits/aio.py).
BREAKER_EXECUTORS = [*EXECUTORS, "asyncio-paced"]


class LoopThread:
    """A loop on a thread, as a worker's: uvloop's, as tasks/broker.py makes it."""

    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class AsyncFacade:
    """An :class:`AsyncExecutor` paired with ``blocking`` (its rare paths),
    charging ``url``'s fake processor with ``charger`` (a class like
    AsyncCardProcessor) over its own connections."""

    def __init__(
        self,
        blocking: Executor,
        url: str,
        *,
        charger=AsyncCardProcessor,
        pool_size=2,
        paced: bool = False,
    ):
        self.blocking = blocking
        self.loop = LoopThread()
        config = blocking.config

        async def build() -> AsyncExecutor:
            client = async_redis(config)
            return AsyncExecutor(
                blocking=blocking,
                pool=await make_async_pool(config, max_size=pool_size, name="test-async"),
                breaker=AsyncCircuitBreaker(client, blocking.breaker),
                # paced: the shared call window of GATEWAY_RATE_LIMIT, in Redis
                call_limiter=AsyncCallLimiter(client, config) if paced else None,
                charger=charger(url, timeout=config.gateway_timeout_seconds),
            )

        self.inner = self.loop.run(build())

    def execute(self, claims, *, probe=False, answered=None):
        return self.loop.run(self.inner.execute(claims, probe=probe, answered=answered))

    @property
    def clock(self):
        return self.inner.clock

    @clock.setter
    def clock(self, value):
        self.inner.clock = self.blocking.clock = value

    @property
    def gateway(self):
        return self.inner.charger

    @property
    def pool(self):
        return self.inner.pool

    def close(self):
        async def close():
            await self.inner.charger.close()
            await self.inner.pool.close()

        self.loop.run(close())
        self.loop.close()
