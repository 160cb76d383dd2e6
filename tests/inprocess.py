"""The engine's parts wired in-process for tests: real Postgres, real Redis,
the real fake gateway over HTTP; only Dramatiq is replaced by a list."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from paycron.config import Config
from paycron.engine.execution import Executor
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import ClaimPacer
from paycron.processors.factory import build_processor
from paycron.store.db import make_pool
from paycron.store.transitions import Claim
from scheduler.reaper import Reaper
from scheduler.sweeper import Sweeper, SweepSettings


@dataclass
class Engine:
    config: Config
    #: The breaker's clock: a test that moves it by hand needs no sleep.
    clock: Callable[[], float] = time.time
    messages: list[tuple[list[Claim], bool]] = field(default_factory=list)
    #: ``threads``, ``asyncio`` or ``asyncio-paced`` (tests.aio_support): the executor under test.
    executor_kind: str = "threads"

    def __post_init__(self):
        self.pool = make_pool(self.config, max_size=8, name="test-engine")
        self.redis = redis.Redis.from_url(self.config.redis_url)
        self.breaker = CircuitBreaker(self.redis, self.config, clock=self.clock)
        self.gateway = build_processor(self.config)
        self.executor = Executor(
            config=self.config,
            pool=self.pool,
            gateway=self.gateway,
            breaker=self.breaker,
            call_limiter=None,
        )
        self.threaded = self.executor
        if self.executor_kind.startswith("asyncio"):
            from tests.aio_support import AsyncFacade

            self.executor = AsyncFacade(
                self.threaded,
                self.config.gateway_url,
                paced=self.executor_kind == "asyncio-paced",
            )
        self.sweeper = Sweeper(
            settings=SweepSettings.from_config(self.config),
            pool=self.pool,
            pacer=ClaimPacer(self.redis, self.config),
            breaker=self.breaker,
            enqueue=lambda claims, probe: self.messages.append((list(claims), probe)),
        )
        self.reaper = Reaper(config=self.config, pool=self.pool)

    def sweep(self) -> list[tuple[list[Claim], bool]]:
        """Run one sweep; return the messages it sent."""
        self.sweeper.run_once()
        sent, self.messages[:] = list(self.messages), []
        return sent

    def work(self, messages=None):
        """Execute messages (by default: sweep first)."""
        counts = []
        for claims, probe in self.sweep() if messages is None else messages:
            counts.append(self.executor.execute(claims, probe=probe))
        return counts

    def drain(self, rounds: int = 20) -> None:
        """Sweep and execute until nothing is due any more."""
        for _ in range(rounds):
            if not self.work():
                return

    def close(self):
        if self.executor is not self.threaded:
            self.executor.close()
        self.gateway.close()
        self.pool.close()
