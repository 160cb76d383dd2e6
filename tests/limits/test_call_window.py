"""The shared per-second call window: the async executor's limiter takes
from the same window as the threaded one's (a mixed fleet keeps one rate)."""

from __future__ import annotations

import asyncio
import time

import redis

from paycron.limits.aio import AsyncCallLimiter
from paycron.limits.pacing import CallLimiter
from paycron.store.aio import async_redis


def test_the_async_call_window_is_the_threaded_one(config):
    config = config.with_overrides(gateway_rate_limit=5)
    threaded = CallLimiter(redis.Redis.from_url(config.redis_url), config)

    async def scenario():
        client = async_redis(config)
        limiter = AsyncCallLimiter(client, config)
        try:
            time.sleep(1.02 - time.time() % 1)  # just past a second: both fall in it
            first = threaded.acquire_some(3)
            second = await limiter.acquire_some(5)  # what the second has left
            return first, second
        finally:
            await client.aclose()

    first, second = asyncio.run(scenario())
    assert (first, second) == (3, 2)


def test_a_bounded_wait_for_a_call_gives_up_at_its_deadline(config):
    """The payment-method check waits for a token no longer than its own
    deadline: with the window full and less time left than until the next
    second, no token and no sleep."""
    config = config.with_overrides(gateway_rate_limit=1)
    sleeps: list[float] = []
    limiter = CallLimiter(redis.Redis.from_url(config.redis_url), config, sleep=sleeps.append)
    time.sleep(1.02 - time.time() % 1)  # just past a second: most of it is left
    assert limiter.acquire_some(1) == 1
    assert limiter.acquire_some(1, within=0.05) == 0
    assert sleeps == []
