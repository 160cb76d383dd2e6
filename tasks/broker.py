"""The worker process's composition root (``dramatiq tasks`` imports it):
config from the environment, Sentry as "worker" (before the broker: its
Dramatiq integration patches the broker's constructor), the Redis broker.
What an actor needs at run time is built per process in tasks/runtime.py."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from paycron.config import Config
from paycron.observability.sentry import init_sentry
from tasks.prompt_broker import PromptRedisBroker

config = Config.from_env()
init_sentry(config, component="worker")

broker = (PromptRedisBroker if config.prompt_start else RedisBroker)(
    url=config.redis_url, namespace=f"{config.redis_namespace}-dramatiq"
)
dramatiq.set_broker(broker)
