"""The console's bulk actions run here, in chunks (docs/console.md): each
run expires undecided approval requests, then acts on up to ``CHUNK``
payments of each running request (one transaction per payment, its outcome
recorded in it: ``paycron.engine.console_bulk``). A crash mid-way loses
nothing and repeats nothing: the next run, in this process or another,
takes the payments still to do."""

from __future__ import annotations

import logging

from paycron.engine import console_bulk
from paycron.processors.base import Processor
from paycron.store.db import Pool
from scheduler.service import PeriodicService

log = logging.getLogger("paycron.console_bulk")


class ConsoleBulkRunner(PeriodicService):
    name = "console-bulk"
    interval_seconds = 1.0

    def __init__(self, *, pool: Pool, gateway: Processor, chunk: int = console_bulk.CHUNK):
        self.pool, self.gateway, self.chunk = pool, gateway, chunk

    def run_once(self) -> console_bulk.RunCounts:
        counts = console_bulk.run_once(self.pool, self.gateway, chunk=self.chunk)
        if counts.done or counts.refused or counts.finished or counts.expired:
            log.info("console bulk actions: %s", counts)
        return counts

    def wait_after(self, counts: console_bulk.RunCounts) -> float:
        # More to do: go on at once (other requests had their turn this run).
        return 0.0 if counts.done + counts.refused >= self.chunk else self.interval_seconds
