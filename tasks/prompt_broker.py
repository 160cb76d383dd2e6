"""The workers' Redis broker with a prompt idle consumer (no side effects on
import: tasks/broker.py builds the process's broker from it)."""

from __future__ import annotations

from dramatiq.brokers.redis import RedisBroker

#: An idle consumer looks for messages at least this often (Dramatiq's own
#: default backs off to a second): a claim enqueued by a sweep that woke for
#: it is picked up within this, not after up to a second.
PROMPT_IDLE_MS = 50


class PromptRedisBroker(RedisBroker):
    """The Redis broker whose idle consumers back off to PROMPT_IDLE_MS at
    most (the worker asks for ``dramatiq_worker_timeout``, a second)."""

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000):
        return super().consume(queue_name, prefetch, min(timeout, PROMPT_IDLE_MS))
