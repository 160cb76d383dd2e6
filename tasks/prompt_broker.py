"""The workers' Redis broker with a prompt idle consumer (no side effects on
import: tasks/broker.py builds the process's broker from it)."""

from __future__ import annotations

from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name

#: An idle consumer looks for messages at least this often (Dramatiq's own
#: default backs off to a second): a claim enqueued by a sweep that woke for
#: it is picked up within this, not after up to a second.
PROMPT_IDLE_MS = 50


class PromptRedisBroker(RedisBroker):
    """The Redis broker whose idle consumers back off to PROMPT_IDLE_MS at
    most (the worker asks for ``dramatiq_worker_timeout``, a second).

    Only a queue's own consumer: the one Dramatiq adds for its delayed
    messages keeps the worker's timeout. paycron never delays a message
    (the schedule is Postgres's, its actor is never retried), and that
    consumer polling 20 times a second cost a busy worker process 4% of
    its CPU (and an idle engine 33 ms of CPU a second)."""

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000):
        if queue_name == dq_name(queue_name):
            return super().consume(queue_name, prefetch, timeout)
        return super().consume(queue_name, prefetch, min(timeout, PROMPT_IDLE_MS))
