"""How much a worker process keeps in flight at a real processor's latency.

Calls per second = calls in flight ÷ latency (Little's law), so a process
that waits on each call in turn reaches a 500/s ceiling at 300 ms only with
150 calls in flight. :class:`InFlightLimit` sizes what one process holds
from the ceiling and the latency it observes (an exponentially weighted
mean), with headroom, bounded by ``GATEWAY_MAX_IN_FLIGHT``.
:class:`Dispatcher` runs each message's group in the background within
that bound, so a Dramatiq thread only admits work: the in-flight count no
longer depends on the thread count. Holding more than the ceiling needs is
harmless (the shared per-second window still paces every call); holding
less is what made a spike drain 10x slower than the ceiling allowed.

A group in the background is not acknowledged work: if the process dies,
its rows stay PROCESSING under a lease and the reaper returns them, as for
any crash (Dramatiq redelivery is never relied on, docs/design.md).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from paycron.engine.execution import Executor
from paycron.observability.outages import FailureLog
from paycron.store.transitions import Claim

log = logging.getLogger("paycron.inflight")

#: Assumed latency before the first call is measured: a real processor's
#: slow end, so a cold worker over-provisions rather than crawls.
INITIAL_LATENCY_SECONDS = 1.0
#: Weight of each new observation in the running mean.
EWMA_ALPHA = 0.05
#: In flight = ceiling x latency x this: bursts, jitter and the latency tail.
HEADROOM = 1.5


class InFlightLimit:
    """A counting limit whose size follows Little's law."""

    def __init__(
        self,
        *,
        rate: float,
        max_in_flight: int,
        floor: int = 1,
        initial_latency: float = INITIAL_LATENCY_SECONDS,
    ):
        self.rate = rate
        self.max_in_flight = max_in_flight
        self.floor = min(floor, max_in_flight)
        self.latency = initial_latency
        self.held = 0
        self._waiting = 0  # threads in acquire, waiting for room
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        wanted = math.ceil(self.rate * self.latency * HEADROOM)
        return max(self.floor, min(self.max_in_flight, wanted))

    def observe(self, seconds: float) -> None:
        """One call's duration: the mean moves, and so may the size. Waiters
        are woken only when it grew (waking them after every call, to find
        no room, cost a busy worker 9% of its time and its waiters 4% more)."""
        with self._cond:
            before = self.size
            self.latency += EWMA_ALPHA * (seconds - self.latency)
            if self._waiting and self.size > before:
                self._cond.notify_all()

    def acquire(self, n: int) -> None:
        """Wait until ``n`` more fit (a group larger than the limit is let in alone)."""
        with self._cond:
            while self.held and self.held + n > self.size:
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            self.held += n

    def release(self, n: int) -> None:
        with self._cond:
            self.held -= n
            if self._waiting:
                self._cond.notify_all()


class Dispatcher:
    """Runs groups of claims in the background of one worker process, never
    holding more claims than :class:`InFlightLimit` allows."""

    def __init__(self, *, executor: Executor, limit: InFlightLimit, groups: ThreadPoolExecutor):
        self.executor = executor
        self.limit = limit
        self._groups = groups
        # An outage fails every group: one line per kind per minute, counted.
        self._failures = FailureLog("executing a group of claims")
        self._failures_lock = threading.Lock()

    def submit(self, claims: Sequence[Claim], *, probe: bool = False) -> None:
        """Admit a group (blocking while the process is full: back pressure
        on the broker) and return; its calls are made in the background."""
        self.limit.acquire(len(claims))
        try:
            self._groups.submit(self._run, claims, probe)
        except BaseException:
            self.limit.release(len(claims))
            raise

    def _run(self, claims: Sequence[Claim], probe: bool) -> None:
        try:
            self.executor.execute(claims, probe=probe)
        except Exception as exc:  # the rows stay leased; the reaper returns them
            with self._failures_lock:
                self._failures.failed(exc)
        else:
            with self._failures_lock:
                self._failures.succeeded()
        finally:
            self.limit.release(len(claims))
