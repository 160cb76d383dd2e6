"""An outage is one line per failure kind per interval, with a count, not a
traceback per failed run."""

from __future__ import annotations

import logging
import threading

import psycopg

from paycron.observability.outages import FailureLog
from scheduler.service import PeriodicService


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_kind_per_interval_with_the_count(caplog):
    clock = Clock()
    failures = FailureLog("sweeper", logging.getLogger("t"), interval=60, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="t"):
        for second in range(0, 130, 2):  # a run every 2 s for 130 s
            clock.now = second
            failures.failed(psycopg.OperationalError("connection refused\nDETAIL: more"))
            failures.failed(ConnectionError("redis down"))
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        "sweeper failed: OperationalError: connection refused",
        "sweeper failed: ConnectionError: redis down",
        "sweeper failed: OperationalError: connection refused (30 times in the last 60s)",
        "sweeper failed: ConnectionError: redis down (30 times in the last 60s)",
        "sweeper failed: OperationalError: connection refused (30 times in the last 60s)",
        "sweeper failed: ConnectionError: redis down (30 times in the last 60s)",
    ]
    # The traceback is kept, once per kind, at DEBUG only.
    assert sum(1 for r in caplog.records if r.exc_info) == 2
    failures.succeeded()
    assert caplog.records[-1].getMessage() == "sweeper works again after 130 failures"


class Failing(PeriodicService):
    name = "sweeper"
    interval_seconds = 0.001

    def __init__(self, stop: threading.Event, runs: int):
        self.stop, self.runs = stop, runs

    def run_once(self):
        self.runs -= 1
        if self.runs == 0:
            self.stop.set()
        raise psycopg.OperationalError("connection failed: Connection refused")


def test_a_service_failing_every_run_logs_one_line_not_tracebacks(caplog):
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="paycron.outages"):
        Failing(stop, runs=50).run(stop)
    shown = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in shown] == [
        "sweeper failed: OperationalError: connection failed: Connection refused"
    ]
    assert not any(r.exc_info for r in shown)
