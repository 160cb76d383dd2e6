"""Execution at a real processor's latency (docs/design.md): calls of a
batch side by side, the in-flight bound from Little's law, the lease checked
just before each call, and 409 "key in use" costing no budget. Against a
scripted gateway over real HTTP and the real Postgres."""

from __future__ import annotations

import asyncio
import concurrent.futures.thread
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from dramatiq.middleware.time_limit import TimeLimitExceeded

from paycron.domain.policy import KEY_IN_USE_LOOKUP_AFTER
from paycron.engine import inflight
from paycron.engine.execution import Executor
from paycron.engine.inflight import (
    HEADROOM,
    AsyncDispatcher,
    AsyncInFlightLimit,
    Dispatcher,
    InFlightLimit,
    Room,
)
from paycron.limits.breaker import CircuitBreaker
from paycron.processors.card.aio import AsyncCardProcessor
from paycron.processors.card.client import CardProcessor
from paycron.store.db import make_pool
from paycron.store.transitions import claim_due
from tests.aio_support import EXECUTORS, AsyncFacade
from tests.factories import insert_payment
from tests.rows import attempts_of, payment

OK = (200, {}, b'{"id": "ch_1"}')


class RecordingProcessor(CardProcessor):
    """The real client, noting the timeout each charge was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeouts: list[float | None] = []

    def charge(self, request, **kwargs):
        self.timeouts.append(kwargs.get("timeout"))
        return super().charge(request, **kwargs)


class RecordingAsyncProcessor(AsyncCardProcessor):
    """The real async client, noting the timeout each charge was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeouts: list[float | None] = []

    async def charge(self, request, **kwargs):
        self.timeouts.append(kwargs.get("timeout"))
        return await super().charge(request, **kwargs)


@pytest.fixture
def make_executor(config, scripted, executor_kind):
    """An executor of ``executor_kind`` (the async one runs on its own loop
    behind the threaded one's face: tests.aio_support)."""
    made = []
    facades = []

    def make(*, calls=None, clock=None, **kwargs) -> Executor:
        pool = make_pool(config, max_size=2, name="test-in-flight")
        gateway = RecordingProcessor(scripted.url, timeout=config.gateway_timeout_seconds)
        extra = {"clock": clock} if clock else {}
        executor = Executor(
            config=config,
            pool=pool,
            gateway=gateway,
            call_limiter=None,
            breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
            calls=calls,
            **extra,
            **kwargs,
        )
        made.append(executor)
        if executor_kind == "asyncio":
            facades.append(AsyncFacade(executor, scripted.url, charger=RecordingAsyncProcessor))
            return facades[-1]  # type: ignore[return-value]
        return executor

    yield make
    for facade in facades:
        facade.close()
    for executor in made:
        executor.gateway.close()
        executor.pool.close()
        if executor.calls is not None:
            executor.calls.shutdown()


both = pytest.mark.parametrize("executor_kind", EXECUTORS)


@both
def test_a_batchs_calls_are_in_flight_together(conn, scripted, make_executor):
    """Ten calls each wait until all ten have arrived: made one after
    another, the first would wait alone and time out."""
    arrived = threading.Barrier(10, timeout=5)

    def together(_body):
        try:
            arrived.wait()
        except threading.BrokenBarrierError:
            return (503, {}, b"{}")
        return OK

    scripted.answers[2500] = together
    for _ in range(10):
        insert_payment(conn)
    executor = make_executor(calls=ThreadPoolExecutor(max_workers=16))
    counts = executor.execute(claim_due(conn, limit=10, lease_seconds=30))
    assert counts.calls == 10
    assert counts.outcomes == {"SUCCEEDED": 10}


@both
def test_no_call_is_sent_once_its_lease_is_too_short(conn, scripted, make_executor):
    """The clock jumps past the lease between the lease renewal and the
    call: nothing is sent, nothing is charged, no budget is used."""
    scripted.answers[2500] = OK
    row = insert_payment(conn)
    ticks = iter([1000.0, 1000.0 + 29.5])  # renewed at 1000 (30 s lease), sending at 1029.5
    executor = make_executor(clock=lambda: next(ticks))
    counts = executor.execute(claim_due(conn, limit=1, lease_seconds=30))
    assert (counts.calls, counts.outcomes) == (0, {"NOT_SENT": 1})
    assert scripted.charge_requests() == 0
    after = payment(conn, row["id"])
    assert (after["status"], after["failures"], after["in_doubt"]) == ("PENDING", 0, False)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["NOT_SENT"]


@both
def test_a_calls_timeout_is_cut_to_the_lease_left(conn, config, scripted, make_executor):
    scripted.answers[2500] = OK
    insert_payment(conn)
    ticks = iter([1000.0, 1000.0 + 27.0])  # 3 s of a 30 s lease left; the timeout is 2 s
    executor = make_executor(clock=lambda: next(ticks))
    executor.execute(claim_due(conn, limit=1, lease_seconds=30))
    insert_payment(conn)
    ticks2 = iter([2000.0, 2000.0 + 28.5])  # 1.5 s left
    executor.clock = lambda: next(ticks2)
    executor.execute(claim_due(conn, limit=1, lease_seconds=30))
    assert executor.gateway.timeouts == [config.gateway_timeout_seconds, 1.5]


@both
def test_key_in_use_costs_no_budget_and_is_looked_up_after_ten(conn, scripted, make_executor):
    """An earlier call with this key still runs at the processor: every 409
    is in doubt, spends nothing, and after ten in a row the payment is asked
    about by reference; still nothing found, it waits on, budget intact."""
    scripted.answers[2500] = (
        409,
        {},
        json.dumps({"error": {"code": "idempotency_key_in_use"}}).encode(),
    )
    row = insert_payment(conn)
    executor = make_executor()
    for streak in range(1, KEY_IN_USE_LOOKUP_AFTER + 1):
        conn.execute("UPDATE payments SET run_at = due_at WHERE id = %s", (row["id"],))
        executor.execute(claim_due(conn, limit=1, lease_seconds=30))
        after = payment(conn, row["id"])
        assert (after["status"], after["failures"], after["in_doubt"], after["key_in_use"]) == (
            "PENDING",
            0,
            True,
            streak,
        )
    lookups = [r for r in scripted.requests if r[0] == "GET"]
    assert len(lookups) == 1  # at the tenth, not before
    assert {a["outcome"] for a in attempts_of(conn, row["id"])} == {"KEY_IN_USE"}


@both
@pytest.mark.parametrize("status", ["succeeded", "refunded"])  # a refund is still a charge
def test_a_key_in_use_then_found_completes(conn, scripted, make_executor, status):
    scripted.answers[2500] = (409, {}, b"{}")
    row = insert_payment(conn, key_in_use=KEY_IN_USE_LOOKUP_AFTER - 1, in_doubt=True)
    scripted.charges[str(row["id"])] = [
        {
            "id": "ch_9",
            "reference": str(row["id"]),
            "amount": 2500,
            "currency": "USD",
            "status": status,
        }
    ]
    make_executor().execute(claim_due(conn, limit=1, lease_seconds=30))
    after = payment(conn, row["id"])
    assert (after["status"], after["in_doubt"]) == ("COMPLETED", False)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["FOUND_BY_LOOKUP"]


def test_the_in_flight_size_follows_latency_within_its_bound():
    limit = InFlightLimit(rate=500, max_in_flight=256, floor=5, initial_latency=0.3)
    assert limit.size == round(500 * 0.3 * HEADROOM)
    for _ in range(500):
        limit.observe(0.01)  # a fast gateway needs few
    assert limit.size == 8  # 500 x ~0.01 x 1.5, rounded up
    for _ in range(500):
        limit.observe(2.0)  # a slow one more, but never past the bound
    assert limit.size == 256
    assert InFlightLimit(rate=1, max_in_flight=256, floor=5, initial_latency=0.1).size == 5


def test_a_full_process_admits_no_more_until_calls_finish():
    limit = InFlightLimit(rate=10, max_in_flight=4, initial_latency=1.0)  # size 4
    three, two = Room(3), Room(2)
    limit.acquire(three)
    admitted = threading.Event()
    waiter = threading.Thread(target=lambda: (limit.acquire(two), admitted.set()))
    waiter.start()
    assert not admitted.wait(0.3)  # 3 + 2 > 4: waits
    limit.release(three)
    assert admitted.wait(5)
    waiter.join()
    limit.release(two)
    limit.release(two)  # given back twice: still given back once
    assert limit.held == 0
    limit.acquire(Room(9))  # larger than the limit, but alone: let in rather than stuck
    assert limit.held == 9


class _CountingCondition(threading.Condition):
    def __init__(self):
        super().__init__()
        self.wakeups = 0

    def notify_all(self):
        self.wakeups += 1
        super().notify_all()


def test_a_waiter_is_let_in_when_the_size_grows_and_no_one_is_woken_for_nothing():
    limit = InFlightLimit(rate=10, max_in_flight=100, initial_latency=0.2)  # size 3
    limit._cond = cond = _CountingCondition()
    held, done = Room(2), Room(1)
    limit.acquire(held)
    limit.acquire(done)
    for _ in range(20):
        limit.observe(0.2)  # calls finish, no one waits: nobody to wake
    limit.release(done)
    limit.acquire(Room(1))
    assert cond.wakeups == 0
    admitted = threading.Event()
    waiter = threading.Thread(target=lambda: (limit.acquire(Room(3)), admitted.set()))
    waiter.start()
    assert not admitted.wait(0.3)  # 3 + 3 > 3: waits
    limit.observe(0.1)  # faster: the size does not grow, the waiter sleeps on
    assert cond.wakeups == 0 and not admitted.wait(0.1)
    for _ in range(40):
        limit.observe(0.5)  # slower: more fit in flight (Little's law)
        if admitted.is_set():
            break
    assert admitted.wait(5) and limit.held == 6
    waiter.join()


class _Executor:
    def __init__(self, fail=False):
        self.fail, self.ran, self.release = fail, [], threading.Event()

    def execute(self, claims, *, probe=False):
        self.release.wait(5)
        self.ran.append(len(claims))
        if self.fail:
            raise RuntimeError("the database went away")


def test_the_dispatcher_returns_before_the_calls_and_frees_its_room_after():
    executor = _Executor()
    limit = InFlightLimit(rate=10, max_in_flight=10, initial_latency=1.0)
    with ThreadPoolExecutor(max_workers=4) as groups:
        dispatcher = Dispatcher(executor=executor, limit=limit, groups=groups)
        dispatcher.submit(["a", "b", "c"])
        assert limit.held == 3 and executor.ran == []  # admitted, still running
        executor.release.set()
    assert executor.ran == [3] and limit.held == 0


def test_a_failed_group_frees_its_room_too():
    executor = _Executor(fail=True)
    executor.release.set()
    limit = InFlightLimit(rate=10, max_in_flight=10, initial_latency=1.0)
    with ThreadPoolExecutor(max_workers=1) as groups:
        Dispatcher(executor=executor, limit=limit, groups=groups).submit(["a", "b"])
    assert executor.ran == [2] and limit.held == 0


@both
@pytest.mark.parametrize(
    ("found", "status", "reason"),
    [
        # another amount or currency: "mismatched", parked for a human, never a new key
        ({"amount": 9999, "currency": "USD", "status": "succeeded"}, "FAILED", "LOOKUP_MISMATCH"),
        ({"amount": 2500, "currency": "EUR", "status": "succeeded"}, "FAILED", "LOOKUP_MISMATCH"),
        # not charged, or in a status that is none of ours: proves nothing
        ({"amount": 2500, "currency": "USD", "status": "failed"}, "PENDING", None),
        ({"amount": 2500, "currency": "USD", "status": "pending"}, "PENDING", None),
    ],
)
def test_a_lookup_completes_only_on_this_payments_charge(
    conn, scripted, make_executor, found, status, reason
):
    scripted.answers[2500] = (409, {}, b"{}")
    row = insert_payment(conn, key_in_use=KEY_IN_USE_LOOKUP_AFTER - 1, in_doubt=True)
    scripted.charges[str(row["id"])] = [{"id": "ch_x", "reference": str(row["id"]), **found}]
    make_executor().execute(claim_due(conn, limit=1, lease_seconds=30))
    after = payment(conn, row["id"])
    assert (
        after["status"],
        after["failure_reason"],
        after["in_doubt"],
        after["key_generation"],
    ) == (status, reason, True, 1)
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["KEY_IN_USE"]


def test_an_absurd_lookup_answer_does_not_lose_the_groups_outcomes(
    conn, scripted, make_executor, monkeypatch
):
    """One payment's lookup answers garbage; its neighbour's success is still
    recorded and the looked-up one waits on, in doubt."""
    scripted.answers[2500] = (409, {}, b"{}")
    scripted.answers[111] = OK
    looked_up = insert_payment(conn, key_in_use=KEY_IN_USE_LOOKUP_AFTER - 1, in_doubt=True)
    neighbour = insert_payment(conn, amount_minor=111)
    executor = make_executor()
    monkeypatch.setattr(
        executor.gateway,
        "find_charges",
        lambda request: (_ for _ in ()).throw(TypeError("not JSON")),
    )
    executor.execute(claim_due(conn, limit=2, lease_seconds=30))
    assert payment(conn, neighbour["id"])["status"] == "COMPLETED"
    after = payment(conn, looked_up["id"])
    assert (after["status"], after["in_doubt"]) == ("PENDING", True)


class _Interrupt:
    """Dramatiq's time limit, deterministically: raises TimeLimitExceeded in
    this thread at the ``at``-th point of the admission — each line of the
    dispatcher's code, and the moment the thread pool's ``submit`` returns
    with the group queued (Dramatiq raises asynchronously, between any two
    statements, once)."""

    def __init__(self, at: int):
        self.at, self.points, self.fired = at, 0, False

    def _point(self):
        self.points += 1
        if self.points == self.at:
            self.fired = True
            time.sleep(0.05)  # a group already handed off starts meanwhile
            raise TimeLimitExceeded()

    def _in_dispatcher(self, frame, event, arg):
        if event == "line":
            self._point()
        return self._in_dispatcher

    def _in_pool_submit(self, frame, event, arg):
        if event == "return":
            self._point()
        return self._in_pool_submit

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if code.co_filename == inflight.__file__:
            return self._in_dispatcher(frame, event, arg)
        if code.co_filename == concurrent.futures.thread.__file__ and code.co_name == "submit":
            return self._in_pool_submit
        return None


class _Recording:
    """An executor that records the room held while its group runs, once the
    admission is over (returned or interrupted)."""

    def __init__(self, limit):
        self.limit, self.held_while_running = limit, []
        self.admitted = threading.Event()

    def execute(self, claims, *, probe=False):
        self.admitted.wait(5)
        self.held_while_running.append(self.limit.held)


def test_a_time_limit_anywhere_in_submit_neither_leaks_nor_double_frees_the_room():
    """Interrupted at every line of the admission in turn: afterwards no room
    is held (nothing leaked, nothing given back twice), and a group that runs
    holds its room while it runs."""
    at = 0
    while True:
        at += 1
        limit = InFlightLimit(rate=10, max_in_flight=10, initial_latency=1.0)
        executor = _Recording(limit)
        interrupt = _Interrupt(at)
        with ThreadPoolExecutor(max_workers=1) as groups:
            groups.submit(lambda: None).result()  # a thread waits for the group
            dispatcher = Dispatcher(executor=executor, limit=limit, groups=groups)
            sys.settrace(interrupt)
            try:
                dispatcher.submit(["a", "b", "c"])
            except TimeLimitExceeded:
                pass
            finally:
                sys.settrace(None)
                executor.admitted.set()
        assert limit.held == 0, f"interrupted at point {at}: {limit.held} claims' room leaked"
        assert all(held >= 3 for held in executor.held_while_running), (
            f"interrupted at point {at}: the group ran outside its room"
        )
        if not interrupt.fired:
            break  # every line of the admission has been interrupted once
    assert at > 5  # the admission was walked, not skipped


@both
def test_no_connection_is_held_across_a_call(conn, scripted, make_executor):
    """While the processor holds the calls, the executor's pool has every
    connection back: the lease and IN_FLIGHT were committed before."""
    held = []

    def answer(_body):
        stats = executor.pool.get_stats()
        held.append(stats["pool_size"] - stats["pool_available"])
        return OK

    scripted.answers[2500] = answer
    for _ in range(3):
        insert_payment(conn)
    executor = make_executor(calls=ThreadPoolExecutor(max_workers=4))
    counts = executor.execute(claim_due(conn, limit=3, lease_seconds=30))
    assert counts.outcomes == {"SUCCEEDED": 3}
    assert held == [0, 0, 0]


class _AsyncGroups:
    """An async executor whose groups run until released; with ``answer``,
    each group's calls are answered (as many as that) before it waits."""

    def __init__(self, fail=False, answer=0):
        self.fail, self.ran, self.release = fail, [], asyncio.Event()
        self.answer = answer

    async def execute(self, claims, *, probe=False, answered=None, places=None):
        for _ in range(min(self.answer, len(claims))):
            answered()
        await self.release.wait()
        self.ran.append(len(claims))
        if self.fail:
            raise RuntimeError("the database went away")


def test_the_async_dispatcher_keeps_the_in_flight_bound():
    """Admitted groups hold their room until they finish; past the size by
    more than one group's places (``floor``: its calls would wait for
    places), one waits (back pressure) and is let in when room opens."""

    async def scenario():
        groups = _AsyncGroups()
        limit = AsyncInFlightLimit(rate=5, max_in_flight=5, initial_latency=1.0, floor=1)
        dispatcher = AsyncDispatcher(executor=groups, limit=limit)
        await dispatcher.submit(["a", "b", "c"])
        await dispatcher.submit(["d", "e"])
        await dispatcher.submit(["f"])  # its call would wait for a place
        assert limit.held == 6 and groups.ran == []  # admitted, running
        fourth = asyncio.create_task(dispatcher.submit(["g"]))
        await asyncio.sleep(0.05)
        assert not fourth.done() and limit.held == 6  # full: it waits
        groups.release.set()
        await asyncio.wait_for(fourth, 5)
        while limit.held:
            await asyncio.sleep(0.01)
        assert sorted(groups.ran) == [1, 1, 2, 3]

    asyncio.run(scenario())


def test_an_async_submit_cancelled_while_it_waits_holds_nothing():
    """Dramatiq's time limit cancels the actor's coroutine while it waits
    for room: no room is taken, and a failed group still gives its back."""

    async def scenario():
        groups = _AsyncGroups(fail=True)
        limit = AsyncInFlightLimit(rate=2, max_in_flight=2, initial_latency=1.0)
        dispatcher = AsyncDispatcher(executor=groups, limit=limit)
        await dispatcher.submit(["a", "b"])
        await dispatcher.submit(["c"])  # one group's places past the size (floor 1)
        waiting = asyncio.create_task(dispatcher.submit(["d"]))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert limit.held == 3 and limit._waiting == 0
        groups.release.set()
        while limit.held:
            await asyncio.sleep(0.01)
        assert sorted(groups.ran) == [1, 2]

    asyncio.run(scenario())


def test_the_async_limit_lets_a_waiter_in_when_the_size_grows():
    async def scenario():
        limit = AsyncInFlightLimit(rate=10, max_in_flight=100, initial_latency=0.2)  # size 3
        dispatcher = AsyncDispatcher(executor=_AsyncGroups(), limit=limit)
        await dispatcher.submit(["a", "b", "c"])
        waiting = asyncio.create_task(dispatcher.submit(["d", "e"]))  # 5 > 3 + floor 1
        await asyncio.sleep(0.05)
        assert not waiting.done()
        for _ in range(20):
            limit.observe(2.0)  # the processor slowed down: more in flight
        await asyncio.wait_for(waiting, 5)
        assert limit.held == 5

    asyncio.run(scenario())


def test_an_answered_call_gives_its_place_to_another_groups_call():
    """On the loop a call answered frees its place though its group still
    waits for its other calls and writes its outcomes: the bound is on
    calls in flight, not on payments whose group has not ended."""

    async def scenario():
        groups = _AsyncGroups(answer=2)  # two calls of each group answered, the rest in flight
        limit = AsyncInFlightLimit(rate=5, max_in_flight=5, initial_latency=1.0)  # size 5
        dispatcher = AsyncDispatcher(executor=groups, limit=limit)
        await dispatcher.submit(["a", "b", "c"])
        await asyncio.sleep(0.01)  # the group runs: two answered
        assert (limit.held, limit.admitted) == (1, 3)
        # Fits beside the one call in flight (1 + 4 <= 5 + floor 1); with
        # its three calls still counted it would not (3 + 4).
        await dispatcher.submit(["d", "e", "f", "g"])
        await asyncio.sleep(0.01)
        assert (limit.held, limit.admitted) == (3, 7)
        waiting = asyncio.create_task(dispatcher.submit(["h", "i", "j", "k"]))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # 3 in flight + 4 > 5 + floor 1: it waits
        groups.release.set()
        await asyncio.wait_for(waiting, 5)
        while limit.admitted:
            await asyncio.sleep(0.01)
        assert sorted(groups.ran) == [3, 4, 4]

    asyncio.run(scenario())


def test_groups_whose_calls_are_answered_still_count_up_to_twice_the_ceiling():
    """Answered claims waiting for their group's end (its last calls, its
    write to Postgres) are bounded too: at most twice GATEWAY_MAX_IN_FLIGHT
    admitted, so a slow Postgres cannot make a process take in ever more."""

    async def scenario():
        groups = _AsyncGroups(answer=10)  # every call answered at once
        limit = AsyncInFlightLimit(rate=1000, max_in_flight=4, initial_latency=1.0)  # size 4
        dispatcher = AsyncDispatcher(executor=groups, limit=limit)
        for pair in (["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]):
            await dispatcher.submit(pair)
            await asyncio.sleep(0.01)
        assert (limit.held, limit.admitted) == (0, 8)
        waiting = asyncio.create_task(dispatcher.submit(["i"]))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # nothing in flight, but 8 + 1 > 2 x 4
        groups.release.set()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())


def test_the_loops_batches_start_as_the_window_grants_them(conn, config, scripted):
    """The shared window grants one call a second: the loop starts each
    batch as its token comes, beside the calls already in flight, so the
    three calls (each waiting until all three have arrived) are in flight
    together. One batch after another, the first would wait alone and fail."""
    arrived = threading.Barrier(3, timeout=6)

    def together(_body):
        try:
            arrived.wait()
        except threading.BrokenBarrierError:
            return (503, {}, b"{}")
        return OK

    scripted.answers[2500] = together
    config = config.with_overrides(gateway_rate_limit=1)
    ids = [insert_payment(conn)["id"] for _ in range(3)]
    claims = claim_due(conn, limit=3, lease_seconds=30)
    pool = make_pool(config, max_size=2, name="test-in-flight")
    blocking = Executor(
        config=config,
        pool=pool,
        gateway=CardProcessor(scripted.url, timeout=config.gateway_timeout_seconds),
        call_limiter=None,
        breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
    )
    facade = AsyncFacade(blocking, scripted.url, paced=True)
    answered = []
    try:
        counts = facade.execute(claims, answered=lambda: answered.append(1))
    finally:
        facade.close()
        pool.close()
    assert counts.outcomes == {"SUCCEEDED": 3}
    assert {payment(conn, pid)["status"] for pid in ids} == {"COMPLETED"}
    assert len(answered) == 3


def test_an_empty_group_on_the_paced_loop_ends_at_once(config, scripted):
    """A group of no claims (no sweeper sends one; a hand-made message
    could) asks nothing and ends: a window asked for 0 tokens grants 0,
    which is also its answer when full, and waiting for more never ended."""
    pool = make_pool(config, max_size=1, name="test-in-flight")
    blocking = Executor(
        config=config,
        pool=pool,
        gateway=CardProcessor(scripted.url, timeout=config.gateway_timeout_seconds),
        call_limiter=None,
        breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
    )
    facade = AsyncFacade(blocking, scripted.url, paced=True)
    try:
        counts = facade.loop.run(asyncio.wait_for(facade.inner.execute([]), 3))
    finally:
        facade.close()
        pool.close()
    assert (counts.claims, counts.calls, counts.released) == (0, 0, 0)


def test_the_loops_counts_of_held_and_admitted_are_the_sums_over_its_rooms():
    """The loop's limit counts what is held and admitted instead of summing
    its rooms each time: after every step of a run of groups admitted,
    answered call by call and ended in any order, the counts are the sums
    the threaded limit computes."""
    import random

    sums = (InFlightLimit.held.fget, InFlightLimit.admitted.fget)

    async def scenario():
        rng = random.Random(7)
        limit = AsyncInFlightLimit(rate=1000, max_in_flight=40, initial_latency=1.0)
        rooms: list[Room] = []
        for _ in range(400):
            step = rng.random()
            if step < 0.35:
                room = Room(rng.randint(1, 6))
                if limit._fits(room):  # else it would wait: not this test's point
                    await limit.acquire_async(room)
                    rooms.append(room)
            elif step < 0.8 and rooms:
                limit.answered(rng.choice(rooms))  # past its size: ignored
            elif rooms:
                room = rooms.pop(rng.randrange(len(rooms)))
                limit.release_now(room)
                limit.release_now(room)  # again: a no-op
                limit.answered(room)  # after its end: ignored
            assert (limit.held, limit.admitted) == tuple(s(limit) for s in sums)
        assert rooms or (limit.held, limit.admitted) == (0, 0)

    asyncio.run(scenario())


def test_waiters_are_woken_once_however_many_calls_are_answered_before_it():
    """Every answered call that leaves room for a group would wake the
    waiters: the loop has one wake on its way at a time, and the waiter
    it wakes still gets in."""
    from paycron.engine import inflight

    async def scenario():
        groups = _AsyncGroups()
        limit = AsyncInFlightLimit(rate=1000, max_in_flight=60, initial_latency=1.0, floor=2)
        dispatcher = AsyncDispatcher(executor=groups, limit=limit)
        for name in "abc":
            await dispatcher.submit([name] * 20)
        held = list(limit._rooms)
        waiting = asyncio.create_task(dispatcher.submit(["d"] * 20))
        await asyncio.sleep(0.01)
        assert not waiting.done() and limit._waiting == 1
        tasks_before = len(inflight._TASKS)
        for room in held:
            for _ in range(10):
                limit.answered(room)  # no await: the loop runs nothing meanwhile
        assert len(inflight._TASKS) - tasks_before == 1
        await asyncio.wait_for(waiting, 5)
        assert limit.held == 30 + 20
        groups.release.set()

    asyncio.run(scenario())


def test_a_group_waits_for_places_call_by_call_and_the_processor_never_sees_more(
    conn, config, scripted
):
    """The loop lets a group in while up to one group's places are still
    taken; its calls, attempts written, each wait for a place. So the places
    are all used (groups of 3 in 4 places: 4 at once, where whole groups
    alone would keep 3) and never more than the size at the processor."""
    lock = threading.Lock()
    now = {"at_once": 0, "most": 0}

    def slow(_body):
        with lock:
            now["at_once"] += 1
            now["most"] = max(now["most"], now["at_once"])
        time.sleep(0.5)
        with lock:
            now["at_once"] -= 1
        return OK

    scripted.answers[2500] = slow
    ids = [insert_payment(conn)["id"] for _ in range(9)]
    claims = claim_due(conn, limit=9, lease_seconds=30)
    pool = make_pool(config, max_size=2, name="test-in-flight")
    blocking = Executor(
        config=config,
        pool=pool,
        gateway=CardProcessor(scripted.url, timeout=config.gateway_timeout_seconds),
        call_limiter=None,
        breaker=CircuitBreaker(redis.Redis.from_url(config.redis_url), config),
    )
    facade = AsyncFacade(blocking, scripted.url)
    limit_seen = {}

    async def scenario():
        limit = AsyncInFlightLimit(rate=1000, max_in_flight=4, initial_latency=1.0, floor=3)
        dispatcher = AsyncDispatcher(executor=facade.inner, limit=limit)
        for i in range(0, 9, 3):
            await dispatcher.submit(claims[i : i + 3])
            limit_seen.setdefault("held", []).append(limit.held)
        assert await dispatcher.drain(10) == 0
        limit_seen["end"] = (limit.held, limit.admitted, limit.calling)

    try:
        facade.loop.run(scenario())
    finally:
        facade.close()
        pool.close()
    assert now["most"] == 4
    assert limit_seen["held"][:2] == [3, 6]  # the second group let in beside the first
    assert limit_seen["end"] == (0, 0, 0)
    assert {payment(conn, pid)["status"] for pid in ids} == {"COMPLETED"}


def test_a_call_cancelled_while_it_waits_for_a_place_takes_none_and_loses_none():
    """A call cancelled (its group's task, at shutdown) while it waits for a
    place holds none; one cancelled just as a place was handed to it passes
    that place on, so no place is lost and none is counted twice."""

    async def scenario():
        limit = AsyncInFlightLimit(rate=1000, max_in_flight=1, initial_latency=1.0)
        await limit.take_place()
        first = asyncio.create_task(limit.take_place())
        second = asyncio.create_task(limit.take_place())
        third = asyncio.create_task(limit.take_place())
        await asyncio.sleep(0)
        third.cancel()  # waiting: it leaves the line
        await asyncio.sleep(0)
        limit.give_place()  # handed to the first ...
        first.cancel()  # ... cancelled before it ran: the second gets it
        for task in (first, third):
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.wait_for(second, 1)
        assert limit.calling == 1 and not limit._place_waiters
        limit.give_place()
        assert limit.calling == 0
        await asyncio.wait_for(limit.take_place(), 1)  # free at once

    async def passed_over():
        # Cancelled, then passed over by a place given back before its
        # cancellation ran: it leaves quietly, the place goes to the next.
        limit = AsyncInFlightLimit(rate=1000, max_in_flight=1, initial_latency=1.0)
        await limit.take_place()
        first = asyncio.create_task(limit.take_place())
        second = asyncio.create_task(limit.take_place())
        await asyncio.sleep(0)
        first.cancel()
        limit.give_place()  # the first's future is cancelled already: the second's
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(second, 1)
        assert limit.calling == 1 and not limit._place_waiters

    asyncio.run(scenario())
    asyncio.run(passed_over())
