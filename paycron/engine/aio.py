"""Executing claimed payments on one event loop per worker process
(``EXECUTOR=asyncio``; docs/performance.md).

The same unit of work as :class:`~paycron.engine.execution.Executor`, step
for step: the breaker asked; tokens taken from the shared window before the
lease; in one statement (the same text) every claim fenced, its lease
renewed and its ``IN_FLIGHT`` attempt committed; the batch's calls made
concurrently with no connection held, each only while its lease still
covers it and each inside one wall-clock deadline (``asyncio.timeout``
around the whole call); the outcomes recorded in one statement; the
breaker told. A call in flight costs a task and a socket, not a thread.

What is rare runs on a thread, with the blocking executor it is paired
with (the same code as ``EXECUTOR=threads``): a payment in doubt or whose
leases kept expiring (it may be looked up instead of called), a lookup
before a decision, a release while the breaker is open, a finish that
Postgres refused whole.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult, ChargeRequest
from paycron.engine.execution import (
    MIN_SEND_SECONDS,
    Executor,
    GroupCounts,
    charge_request,
    decide_by_lookup,
)
from paycron.limits.aio import AsyncCallLimiter, AsyncCircuitBreaker
from paycron.limits.breaker import BreakerState
from paycron.observability import metrics
from paycron.store import aio as store
from paycron.store import transitions
from paycron.store.transitions import Claim, Finished

log = logging.getLogger("paycron.execution")

R = TypeVar("R")


def use_uvloop() -> str:
    """Make every event loop this process creates from now on uvloop's
    (libuv's loop: its sockets, timers and callbacks in C), where it is
    installed; the loop's name, for the worker's start line. A worker's
    executor costs a tenth less CPU per payment on it (``python -m
    bench.executor_cpu --executors asyncio,asyncio-std``, docs/performance.md).
    Dramatiq makes the worker's loop itself, so the choice is the policy's."""
    try:
        import uvloop
    except ImportError:  # not built for this platform: asyncio's own loop
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


class AsyncCharger(Protocol):
    name: str

    async def charge(
        self, request: ChargeRequest, *, timeout: float | None = None
    ) -> CallResult: ...


class CallPlaces(Protocol):
    """The places of a process's calls out at the processor (the loop's
    in-flight limit): one taken before each call, given back when it is answered."""

    async def take_place(self) -> None: ...

    def give_place(self) -> None: ...


class AsyncExecutor:
    """Runs groups of claims on the loop. One per worker process.

    ``blocking``: the threaded executor of the rare paths (its pool small,
    its gateway the blocking client of the same processor). ``charger``:
    the processor's async charge; None makes every charge on a thread with
    the blocking client (a processor without one, e.g. Stripe's SDK).

    The rare paths run on threads of the executor's own pool, as many as
    ``GATEWAY_MAX_IN_FLIGHT`` (started only when used), not on asyncio's
    default few per core: after a processor's brownout most payments are
    in doubt, and each of their calls takes one for as long as it lasts.
    """

    def __init__(
        self,
        *,
        blocking: Executor,
        pool: store.AsyncPool,
        breaker: AsyncCircuitBreaker,
        call_limiter: AsyncCallLimiter | None,
        charger: AsyncCharger | None,
        on_latency: Callable[[float], None] | None = None,
    ):
        self.blocking = blocking
        self.config = blocking.config
        self.pool = pool
        self.breaker = breaker
        self.call_limiter = call_limiter
        self.charger = charger
        self.on_latency = on_latency
        self.clock = blocking.clock
        self.rare = ThreadPoolExecutor(
            max_workers=self.config.gateway_max_in_flight, thread_name_prefix="gateway-call-rare"
        )

    async def _on_thread(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``asyncio.to_thread`` on the rare paths' pool."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.rare, call)

    async def execute(
        self,
        claims: Sequence[Claim],
        *,
        probe: bool = False,
        answered: Callable[[], None] | None = None,
        places: CallPlaces | None = None,
    ) -> GroupCounts:
        counts = GroupCounts(claims=len(claims))
        if not claims:
            return counts  # nothing to ask the window for (it would grant 0, forever)
        if self.call_limiter is not None:
            # The breaker asked and the first tokens taken in one round trip.
            granted = await self.call_limiter.admit(len(claims), breaker=self.breaker, probe=probe)
        else:
            state = await self.breaker.state()
            held = state is BreakerState.OPEN or (state is BreakerState.HALF_OPEN and not probe)
            granted = 0 if held else len(claims)
        if not granted:
            counts.released = await self._on_thread(transitions.release, self.blocking.pool, claims)
            metrics.BREAKER_RELEASES.inc(counts.released)
            return counts
        done = await self._execute_batches(claims, granted, counts, answered, places)
        failures = sum(1 for d in done if d.result.breaker_failure)
        if probe and counts.calls:
            await self.breaker.probe_finished(failed=failures > 0)
        await self.breaker.record(calls=counts.calls, failures=failures)
        return counts

    async def _execute_batches(
        self,
        claims: Sequence[Claim],
        granted: int,
        counts: GroupCounts,
        answered: Callable[[], None] | None,
        places: CallPlaces | None = None,
    ) -> list[Finished]:
        """Tokens first, then the lease (as the threaded executor), batch by
        batch as the shared window grants them (``granted``: the first
        batch's, already taken). Unlike the threaded
        executor, a batch does not wait for the one before it to be
        answered: each starts as soon as its tokens are granted, so a claim
        waits for the window and for a place among the process's calls (at
        most about one call's time, :meth:`_call`), never for its own
        group's other batches, and a group's calls end within about two
        calls' time of its last tokens (``MESSAGE_GROUP_SIZE`` is not cut to
        fit sequential calls in a lease, paycron/config.py)."""
        remaining = list(claims)
        running: list[asyncio.Future[list[Finished]]] = []
        try:
            while remaining:
                if not granted:
                    assert self.call_limiter is not None  # without it the first grant is all
                    granted = await self.call_limiter.acquire_some(len(remaining))
                batch, remaining = remaining[:granted], remaining[granted:]
                granted = 0
                if not remaining and not running:
                    # all granted at once
                    return await self._execute_batch(batch, counts, answered, places)
                running.append(
                    asyncio.ensure_future(self._execute_batch(batch, counts, answered, places))
                )
        finally:
            # Whatever happens while tokens are awaited, the batches started
            # end (answered, written) before the group does: its room and the
            # drain on SIGTERM cover them.
            outcomes = await asyncio.gather(*running, return_exceptions=True)
        done: list[Finished] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            done += outcome
        return done

    async def _execute_batch(
        self,
        batch: Sequence[Claim],
        counts: GroupCounts,
        answered: Callable[[], None] | None = None,
        places: CallPlaces | None = None,
    ) -> list[Finished]:
        config = self.config
        # Read before the lease is renewed, so the lease ends no earlier.
        lease_end = self.clock() + config.lease_seconds
        rows = await store.start(
            self.pool,
            batch,
            lease_seconds=config.lease_seconds,
            processor=self.blocking.gateway.name,
        )
        counts.stale += len(batch) - len(rows)
        if answered is not None:
            for _ in range(len(batch) - len(rows)):
                answered()
        if len(rows) == 1:
            done = [await self._call(rows[0], lease_end, answered, places)]
        else:
            done = list(
                await asyncio.gather(
                    *(self._call(row, lease_end, answered, places) for row in rows)
                )
            )
        counts.calls += sum(1 for d in done if d.result.outcome is not Outcome.NOT_SENT)
        for i, item in enumerate(done):
            if item.decision.needs_lookup:
                done[i] = await self._on_thread(self._decide_by_lookup, item)
                counts.looked_up += 1
        recorded = await store.finish(
            self.pool,
            done,
            fallback=self.blocking.pool,
            land_seconds=config.in_flight_bound_seconds,
            poll_seconds=config.gateway_poll_seconds,
        )
        self.blocking._report(done, recorded, counts)
        return done

    def _decide_by_lookup(self, item: Finished) -> Finished:
        return decide_by_lookup(self.blocking.gateway, item, now=self.blocking.db_clock.now())

    async def _call(
        self,
        row: dict,
        lease_end: float,
        answered: Callable[[], None] | None = None,
        places: CallPlaces | None = None,
    ) -> Finished:
        """One claim's call, made in a place of the process's (``places``):
        its attempt is written, and it waits here for a call to be answered
        when they are all taken; the lease is checked once it has one."""
        try:
            if places is None:
                return await self._call_one(row, lease_end)
            await places.take_place()
            try:
                return await self._call_one(row, lease_end)
            finally:
                places.give_place()
        finally:
            if answered is not None:
                answered()

    async def _call_one(self, row: dict, lease_end: float) -> Finished:
        if self.blocking.looks_up_first(row):
            # In doubt, or its leases kept expiring: the blocking path decides
            # whether to look it up instead, and calls it if not.
            return await self._on_thread(self.blocking._call, row, lease_end)
        try:
            result = await self._send(row, lease_end)
        except Exception:  # a bug must not lose the group: in doubt, asked again
            log.exception("gateway call failed unexpectedly for %s", row["id"])
            result = CallResult(Outcome.AMBIGUOUS, error_code="client_error", in_doubt=True)
        return self.blocking.decided(row, result)

    async def _send(self, row: dict, lease_end: float) -> CallResult:
        left = lease_end - self.clock()
        if left < MIN_SEND_SECONDS:
            return CallResult(Outcome.NOT_SENT, error_code="lease_too_short")
        self.blocking.late_by(row)
        timeout = min(self.config.gateway_timeout_seconds, left)
        started = time.monotonic()
        if self.charger is not None:
            result = await self.charger.charge(charge_request(row), timeout=timeout)
        else:
            result = await self._on_thread(
                self.blocking.gateway.charge, charge_request(row), timeout=timeout
            )
        elapsed = time.monotonic() - started
        self.blocking.called(result, elapsed)
        if self.on_latency is not None:
            self.on_latency(elapsed)
        return result
