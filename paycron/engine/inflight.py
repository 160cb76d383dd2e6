"""How much a worker process keeps in flight at a real processor's latency.

Calls per second = calls in flight ÷ latency (Little's law), so a process
that waits on each call in turn reaches a 500/s ceiling at 300 ms only with
150 calls in flight. :class:`InFlightLimit` sizes what one process holds
from the ceiling and the latency it observes (an exponentially weighted
mean), with headroom, bounded by ``GATEWAY_MAX_IN_FLIGHT``.
:class:`Dispatcher` runs each message's group in the background within
that limit, so a Dramatiq thread only admits work: the in-flight count no
longer depends on the thread count. Holding more than the ceiling needs is
harmless (the shared per-second window still paces every call); holding
less is what made a spike drain 10x slower than the ceiling allowed.

A group in the background is not acknowledged work: if the process dies,
its rows stay PROCESSING under a lease and the reaper returns them, as for
any crash (Dramatiq redelivery is never relied on, docs/design.md).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from paycron.engine.aio import AsyncExecutor
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
#: Claims one process admits at most, answered or not, as a multiple of
#: GATEWAY_MAX_IN_FLIGHT (the event loop frees a call's place when it is
#: answered, before its group's outcomes are written).
ADMITTED_CEILING = 2


class Room:
    """The room one group holds in an :class:`InFlightLimit`. Held or not is
    its membership of the limit's set, changed by one operation under the
    limit's lock: an exception raised into the thread at any point (Dramatiq's
    time limit) can neither leave it held by no one nor give it back twice.

    ``answered``: its calls already answered (the event loop's groups count
    them; a threaded group keeps its whole room until it ends). An answered
    call's place is free for another group's call while its own group
    waits for its last calls and writes its outcomes."""

    __slots__ = ("size", "running", "answered")

    def __init__(self, size: int):
        self.size = size
        self.running = False  # its group has started: only the group gives it back
        self.answered = 0


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
        self._rooms: set[Room] = set()
        self._waiting = 0  # threads in acquire, waiting for room
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        wanted = math.ceil(self.rate * self.latency * HEADROOM)
        return max(self.floor, min(self.max_in_flight, wanted))

    @property
    def held(self) -> int:
        """Claims admitted and not answered yet: the sum of the rooms held
        (computed, never counted up and down, so no interruption can make
        it drift)."""
        return sum(room.size - room.answered for room in list(self._rooms))

    @property
    def admitted(self) -> int:
        """Claims admitted, answered or not (until their group ends)."""
        return sum(room.size for room in list(self._rooms))

    def _fits(self, room: Room) -> bool:
        """Whether ``room`` may be held now: its calls within the size, and
        the claims admitted, answered ones included, within twice the
        ceiling (so groups waiting on their last calls or on Postgres
        never pile up); a group larger than either alone when none is held."""
        if not self._rooms:
            return True
        return (
            self.held + room.size <= self.size
            and self.admitted + room.size <= ADMITTED_CEILING * self.max_in_flight
        )

    def observe(self, seconds: float) -> None:
        """One call's duration: the mean moves, and so may the size. Waiters
        are woken only when it grew (waking them after every call, to find
        no room, cost a busy worker 9% of its time and its waiters 4% more)."""
        with self._cond:
            before = self.size
            self.latency += EWMA_ALPHA * (seconds - self.latency)
            if self._waiting and self.size > before:
                self._cond.notify_all()

    def acquire(self, room: Room, *, running: bool = False) -> None:
        """Wait until ``room`` fits (a group larger than the limit is let in
        alone), then hold it; at once if it is held already. ``running``:
        its group starts now, and only it gives the room back."""
        with self._cond:
            while room not in self._rooms and not self._fits(room):
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            self._rooms.add(room)
            room.running = room.running or running

    def release(self, room: Room, *, unless_running: bool = False) -> None:
        """Give ``room`` back (again is a no-op); with ``unless_running``, not
        while its group runs in it."""
        with self._cond:
            if unless_running and room.running:
                return
            if room in self._rooms:
                self._rooms.discard(room)
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
        room = Room(len(claims))
        try:
            self.limit.acquire(room)
            self._groups.submit(self._run, claims, probe, room)
        except BaseException:
            # Refused, or interrupted anywhere (Dramatiq's time limit raises
            # in this thread between any two statements): give the room back
            # unless the group already runs in it. A group still queued takes
            # room again before it runs, so the room is neither leaked nor
            # given back twice, and no group runs outside the bound.
            self.limit.release(room, unless_running=True)
            raise

    def _run(self, claims: Sequence[Claim], probe: bool, room: Room) -> None:
        self.limit.acquire(room, running=True)
        try:
            self.executor.execute(claims, probe=probe)
        except Exception as exc:  # the rows stay leased; the reaper returns them
            with self._failures_lock:
                self._failures.failed(exc)
        else:
            with self._failures_lock:
                self._failures.succeeded()
        finally:
            self.limit.release(room)


class AsyncInFlightLimit(InFlightLimit):
    """:class:`InFlightLimit` for one event loop (``EXECUTOR=asyncio``): the
    same size and rooms, waited for by tasks; every method runs on the loop.

    What is held and admitted is counted as rooms come, answer and go, not
    summed over every room: the loop asks after every answered call while
    groups wait, and those sums, with a task to wake the waiters after each
    such call, were 6.6% of a busy loop's samples. Nothing interrupts the
    loop between two statements (a task is cancelled only at an await), so
    the counts cannot drift; the threaded limit keeps its sums, which no
    exception raised into a thread can skew. Waking the waiters is one
    task at a time, however many calls are answered before it runs: it
    wakes them all."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._acond = asyncio.Condition()
        self._held = 0
        self._admitted = 0
        self._wake_pending = False
        #: Calls out at the processor now (each took a place), and the calls
        #: waiting for a place, first come first served.
        self._calling = 0
        self._place_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _fits(self, room: Room) -> bool:
        """As the threaded limit's, but a group may be let in while up to
        ``floor`` (one group) of the places it needs are still taken: its
        calls each wait for a place (:meth:`take_place`), so what is out at
        the processor never exceeds the size, and a place that frees is
        taken at once by a call whose group is ready (its tokens taken, its
        attempts written) instead of idling until a whole group fits."""
        if not self._rooms:
            return True
        return (
            self.held + room.size <= self.size + self.floor
            and self.admitted + room.size <= ADMITTED_CEILING * self.max_in_flight
        )

    @property
    def calling(self) -> int:
        """Calls out at the processor now."""
        return self._calling

    async def take_place(self) -> None:
        """Wait for a place for one call (first come, first served) and take it."""
        if self._calling < self.size and not self._place_waiters:
            self._calling += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._place_waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_place()  # handed a place as it was cancelled: pass it on
            elif waiter in self._place_waiters:  # else passed over, already out of the line
                self._place_waiters.remove(waiter)
            raise

    def give_place(self) -> None:
        """One call's place back: the next waiting call takes it."""
        self._calling -= 1
        self._pass_places()

    def _pass_places(self) -> None:
        while self._place_waiters and self._calling < self.size:
            waiter = self._place_waiters.popleft()
            if not waiter.done():
                self._calling += 1
                waiter.set_result(None)

    @property
    def held(self) -> int:
        return self._held

    @property
    def admitted(self) -> int:
        return self._admitted

    def acquire(self, room: Room, *, running: bool = False) -> None:
        raise TypeError("the loop's limit is acquired with acquire_async")

    def release(self, room: Room, *, unless_running: bool = False) -> None:
        raise TypeError("the loop's limit is released with release_now")

    def observe(self, seconds: float) -> None:
        before = self.size
        self.latency += EWMA_ALPHA * (seconds - self.latency)
        if self.size > before:
            self._pass_places()
            if self._waiting:
                self._wake()

    def _wake(self) -> None:
        if self._wake_pending:
            return  # the waiters' wake is already on its way

        async def notify() -> None:
            async with self._acond:
                self._wake_pending = False  # from here a new change needs a new wake
                self._acond.notify_all()

        self._wake_pending = True
        task = asyncio.get_running_loop().create_task(notify())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)
        # Cancelled before it ran (the loop closing): the next change wakes
        # again. At worst a wake too many, never one lost.
        task.add_done_callback(self._woken)

    def _woken(self, _task: asyncio.Task) -> None:
        self._wake_pending = False

    async def acquire_async(self, room: Room) -> None:
        """Wait until ``room`` fits (a group larger than the limit alone), then hold it."""
        async with self._acond:
            while not self._fits(room):
                self._waiting += 1
                try:
                    await self._acond.wait()
                finally:
                    self._waiting -= 1
            if room not in self._rooms:
                self._rooms.add(room)
                self._held += room.size - room.answered
                self._admitted += room.size

    def answered(self, room: Room) -> None:
        """One of ``room``'s calls was answered (or will not be made): its
        place is another call's, though the group still holds the room."""
        if room in self._rooms and room.answered < room.size:
            room.answered += 1
            self._held -= 1
            # Woken when a whole group fits (a smaller one is let in by the
            # next release): not after every call, for nothing.
            if self._waiting and self._held <= self.size:
                self._wake()

    def release_now(self, room: Room) -> None:
        if room in self._rooms:
            self._rooms.discard(room)
            self._held -= room.size - room.answered
            self._admitted -= room.size
            if self._waiting:
                self._wake()


#: Tasks the loop runs in the background, held so none is collected mid-run.
_TASKS: set[asyncio.Task] = set()


class AsyncDispatcher:
    """:class:`Dispatcher` on one event loop: the actor's coroutine admits a
    group within the limit (waiting while the process is full: back
    pressure) and returns; the group runs as a task and gives its room back.
    Cancelled while it waits (Dramatiq's time limit), it holds nothing."""

    def __init__(self, *, executor: AsyncExecutor, limit: AsyncInFlightLimit):
        self.executor = executor
        self.limit = limit
        self._failures = FailureLog("executing a group of claims")
        #: The groups running now (their calls in flight or their outcomes being written).
        self._groups: set[asyncio.Task] = set()

    async def submit(self, claims: Sequence[Claim], *, probe: bool = False) -> None:
        room = Room(len(claims))
        await self.limit.acquire_async(room)
        # No await from here on: nothing can interrupt between holding the
        # room and the task that gives it back.
        task = asyncio.get_running_loop().create_task(self._run(claims, probe, room))
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)
        self._groups.add(task)
        task.add_done_callback(self._groups.discard)

    async def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the groups running now to end
        (their calls answered, their outcomes written); how many had not.
        A worker stopping calls it once nothing admits groups any more: as
        the threaded dispatcher's pools are joined when its process exits,
        so the loop is not closed under calls in flight (each would wait
        for its lease to expire, in doubt). Those still running after
        ``timeout`` are left to their leases."""
        if not self._groups:
            return 0
        _, running = await asyncio.wait(set(self._groups), timeout=timeout)
        return len(running)

    async def _run(self, claims: Sequence[Claim], probe: bool, room: Room) -> None:
        try:
            await self.executor.execute(
                claims,
                probe=probe,
                answered=functools.partial(self.limit.answered, room),
                places=self.limit,
            )
        except Exception as exc:  # the rows stay leased; the reaper returns them
            self._failures.failed(exc)
        else:
            self._failures.succeeded()
        finally:
            self.limit.release_now(room)
