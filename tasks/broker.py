"""The worker process's composition root: config, Sentry, broker."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from paycron.config import Config
from paycron.observability import init_sentry

config = Config.from_env()
init_sentry(config, component="worker")

broker = RedisBroker(url=config.redis_url, namespace=f"{config.redis_namespace}-dramatiq")
dramatiq.set_broker(broker)
