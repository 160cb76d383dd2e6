"""The one shape of every periodic service the scheduler runs (River's):
settings validated when the service is built, ``run_once() -> counts``
that works in batches until one comes back short, and :meth:`run`, a loop
that calls it and sleeps the service's interval only then. Tests call
``run_once``; the scheduler's root starts each service's ``run`` in a thread
of its own, so a slow one (a partition detach, a hung webhook) never holds
up another (the sweep).
"""

from __future__ import annotations

import logging
import threading

from paycron.observability.outages import FailureLog

log = logging.getLogger("paycron.scheduler")

#: After a failed run (a database or Redis outage), wait this long at most.
ERROR_PAUSE_SECONDS = 5.0


class PeriodicService:
    """Subclasses set :attr:`name` and :attr:`interval_seconds` and define
    :meth:`run_once`, returning a dataclass of counts."""

    name = "service"
    interval_seconds = 1.0

    def run_once(self):
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set: run once, then wait the interval. A failed
        run is retried after a pause; an outage is logged as one line per
        failure kind per minute, with a count (paycron.observability.outages)."""
        failures = FailureLog(self.name)
        while not stop.is_set():
            try:
                counts = self.run_once()
            except Exception as exc:
                failures.failed(exc)
                stop.wait(min(ERROR_PAUSE_SECONDS, 2 * self.interval_seconds))
                continue
            failures.succeeded()
            self.sleep(stop, self.wait_after(counts))

    def sleep(self, stop: threading.Event, seconds: float) -> None:
        """Wait ``seconds`` or until ``stop``; a service that can be woken
        earlier waits on its own signal too."""
        stop.wait(seconds)

    def wait_after(self, counts) -> float:
        """How long to sleep after a run: the interval, since ``run_once``
        returns only when a batch came back short."""
        return self.interval_seconds

    def close(self) -> None:
        """Free what the service holds once its loop has ended."""

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name=self.name, daemon=True)
        thread.start()
        return thread
