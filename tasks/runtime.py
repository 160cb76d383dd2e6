"""What an actor needs, built once per worker process on first use (after
Dramatiq has forked, so no socket is shared with a parent)."""

from __future__ import annotations

import threading

from paycron.breaker import CircuitBreaker
from paycron.config import Config
from paycron.db import make_pool, make_redis
from paycron.execution import Executor
from paycron.gateway_client import build_gateway
from paycron.metrics import serve_metrics
from paycron.pacing import CallLimiter

_lock = threading.Lock()
_executor: Executor | None = None


def build_executor(config: Config) -> Executor:
    serve_metrics(config.metrics_port, component="worker")
    client = make_redis(config)
    return Executor(
        config=config,
        pool=make_pool(config, max_size=config.db_pool_max, name="worker"),
        gateway=build_gateway(config),
        breaker=CircuitBreaker(client, config),
        call_limiter=CallLimiter(client, config),
    )


def executor(config: Config) -> Executor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = build_executor(config)
    return _executor
