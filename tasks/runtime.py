"""What an actor needs, built once per worker process on first use (after
Dramatiq has forked, so no socket is shared with a parent)."""

from __future__ import annotations

import random
import threading
import time

import redis
from dramatiq.rate_limits import WindowRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from paycron.breaker import CircuitBreaker
from paycron.config import Config
from paycron.db import make_pool
from paycron.execution import Executor
from paycron.gateway_client import HttpGateway

_lock = threading.Lock()
_executor: Executor | None = None


def call_token_acquirer(client: redis.Redis, config: Config):
    """Block until a gateway call fits under ``GATEWAY_RATE_LIMIT`` across all
    workers. Waits instead of raising: a raised RateLimitExceeded would burn
    Dramatiq retries and, at max_retries=0, drop the message."""
    limiter = WindowRateLimiter(RedisBackend(client=client),
                                f"{config.redis_namespace}:gateway-calls",
                                limit=config.gateway_rate_limit, window=1)

    def acquire() -> None:
        while True:
            with limiter.acquire(raise_on_failure=False) as acquired:
                if acquired:
                    return
            time.sleep(random.uniform(0.005, 0.05))

    return acquire


def build_executor(config: Config) -> Executor:
    client = redis.Redis.from_url(config.redis_url or "redis://127.0.0.1:6379/0")
    return Executor(
        config=config,
        pool=make_pool(config, max_size=config.db_pool_max, name="worker"),
        gateway=HttpGateway(config.gateway_url, timeout=config.gateway_timeout_seconds),
        breaker=CircuitBreaker(client, config),
        acquire_call_token=call_token_acquirer(client, config),
    )


def executor(config: Config) -> Executor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = build_executor(config)
    return _executor
