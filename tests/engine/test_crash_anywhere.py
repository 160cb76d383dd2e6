"""Crash anywhere: the engine's money invariants hold whatever boundary fails.

A fixed script runs the real sweeper, executor (worker), reaper and the
console's re-drive (its lookup) against Postgres and Redis for a few
payments, round after round, until they settle. It is run once without
faults to record every boundary it crosses (tests/faults.py: each statement
before it is sent and after it ran, each COMMIT before it is sent and after
it took effect with its answer lost, each Redis command before it is sent
and after it ran with its reply lost), then once per *schedule*: a failure
at one of those boundaries (``once``), or at it and every later crossing
(``always``: a crash loop). The part that meets the failure dies as a
process does (its exception ends its run; the next round starts it again);
the rest goes on.

After every step the money invariants of tests/money_invariants.py must
hold; after a ``once`` schedule has run its rounds, every payment must also
have settled as the processor says (charged: COMPLETED, or FAILED in doubt
with its letter open; not charged: never COMPLETED) and none may still be
PROCESSING.

The payments' answers at the processor are drawn from ``PAYCRON_FAULT_SEED``
(printed with every failure); ``PAYCRON_FAULT_SCHEDULE`` replays one
schedule (as printed, e.g. ``once:finish_attempts:after:2``);
``PAYCRON_FAULT_FULL=1`` enumerates every occurrence of every boundary
(CI takes the first crossing of each).

The worker runs each executor (``EXECUTOR``): ``threads``, and ``asyncio``,
whose start and finish go through its own async pool and whose breaker
reads and counts go through ``redis.asyncio`` (tests/faults.py wraps both),
its rare paths through the blocking executor it is paired with.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import dramatiq
import psycopg
import pytest
import redis as redis_lib
from dramatiq.brokers.redis import RedisBroker

from paycron.engine import dead_letters
from paycron.engine.aio import AsyncExecutor
from paycron.engine.execution import Executor
from paycron.engine.messages import decode_claims, execute_message
from paycron.errors import DeadLetterActionRefused, GatewayError, NotFound
from paycron.limits.aio import AsyncCircuitBreaker
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import ClaimPacer
from paycron.sql import q
from paycron.store import processor_events
from paycron.store.aio import make_async_pool
from paycron.store.db import make_pool
from scheduler.reaper import Reaper
from scheduler.sweeper import Sweeper, SweepSettings
from tests.aio_support import EXECUTORS, LoopThread
from tests.factories import insert_payment
from tests.faults import (
    AFTER,
    BEFORE,
    AsyncFaultPool,
    Fault,
    FaultPool,
    Injector,
    faulty_async_redis,
    faulty_redis,
)
from tests.model_processor import CARD, CHARGE, DECLINE, NOTHING, ModelProcessor, Plan
from tests.money_invariants import (
    MoneyChecker,
    Violation,
)
from tests.support import Clock

#: What each payment's calls do at the processor, call after call (the last
#: repeats); a key answered once replays its answer whatever is planned.
SCRIPTS = {
    "charged": [(CHARGE, "200")],
    "charged, answer lost": [(CHARGE, "timeout"), (CHARGE, "200")],
    "5xx, then charged": [(NOTHING, "500"), (CHARGE, "200")],
    "declined": [(DECLINE, "402")],
    "never answers": [(NOTHING, "timeout")],
}
#: Rounds of sweep, work, reap (and from the fourth, re-drives): a crash loop
#: needs six to reach the reaper's limit (five expiries); one crash, five.
ROUNDS, LOOP_ROUNDS = 5, 7
#: Which path each boundary is on, by the SQL block (or Redis command) it crosses.
PATHS = {
    "lock_due_fairly": "claim",
    "claim_locked": "claim",
    "commit:claim_locked": "claim",
    "count_queued": "claim",
    "start_attempts": "start",
    "finish_attempts": "finish",
    "release_claims": "release",
    "lock_expired": "reap",
    "reap_locked": "reap",
    "commit:reap_locked": "reap",
    "get_payment": "lookup",
    "get_attempts": "lookup",
    "open_dead_letters": "lookup",
    "dead_letters_of": "lookup",
    "redrive": "lookup",
    "complete_from_gateway": "lookup",
    "await_from_lookup": "lookup",
    "processor:find_charges": "lookup",
}
#: Redis commands belong to the part that sends them.
PART_PATHS = {"sweeper": "claim", "worker": "start", "reaper": "reap", "console": "lookup"}
#: What a process that meets a dropped connection raises (and dies of).
CRASHES = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    redis_lib.ConnectionError,
    dramatiq.errors.BrokerConnectionError,
)


@dataclass
class Outcome:
    """One schedule's run."""

    fault: Fault | None
    trace: list[tuple[str, str, int, str]] = field(default_factory=list)
    crashes: Counter = field(default_factory=Counter)
    violation: Violation | None = None
    fired: int = 0


class Rig:
    """The engine's parts for one schedule, wired through the injector."""

    def __init__(self, env: dict, fault: Fault | None, seed: int):
        self.env = env
        self.conn = env["conn"]
        config = env["config"]
        self.config = config
        self.injector = Injector(fault)
        self.part = "harness"
        self.outcome = Outcome(fault)
        pool = FaultPool(env["pool"], self.injector)
        self.redis = faulty_redis(env["redis_url"], self.injector)
        self.clean_redis = redis_lib.Redis.from_url(env["redis_url"])
        self.processor = ModelProcessor(
            CARD, self.clock, retention_seconds=config.gateway_key_retention_seconds
        )
        # One payment per script, in an order the seed picks.
        order = sorted(SCRIPTS)
        random.Random(seed).shuffle(order)
        self.scripts: dict[str, list] = {}
        self.calls: Counter = Counter()
        self.processor.next_plan = self._next_plan
        self._find = self.processor.find_charges
        self.processor.find_charges = self._find_charges
        self.breaker = CircuitBreaker(self.redis, config, clock=Clock())
        self.namespace = f"{config.redis_namespace}-dramatiq"
        self.broker = RedisBroker(client=self.redis, namespace=self.namespace, middleware=[])
        self.sweeper = Sweeper(
            settings=SweepSettings.from_config(config),
            pool=pool,
            pacer=ClaimPacer(self.redis, config),
            breaker=self.breaker,
            enqueue=lambda claims, probe: self.broker.enqueue(
                execute_message(claims, probe=probe, queue_name=config.queue_name)
            ),
        )
        self.executor = Executor(
            config=config,
            pool=pool,
            gateway=self.processor,
            breaker=self.breaker,
            call_limiter=None,
        )
        self.loop: LoopThread | None = None
        if env["executor"] == "asyncio":
            self.loop = LoopThread()
            self.aio = self.loop.run(self._async_executor(env["redis_url"]))
        self.reaper = Reaper(config=config, pool=pool)
        self.pool = pool
        self.offset = 0.0
        self.checker = MoneyChecker({CARD: self.processor})
        self.ids = []
        for i, script in enumerate(order):
            due = datetime.now(UTC) - timedelta(seconds=len(order) - i)
            pid = insert_payment(self.conn, due_at=due)["id"]
            self.ids.append(pid)
            self.scripts[str(pid)] = SCRIPTS[script]
        self._cross = self.injector.cross
        self.injector.cross = self._tagged_cross

    async def _async_executor(self, redis_url: str) -> AsyncExecutor:
        """The async executor, paired with the blocking one for its rare paths
        and its charges (the model processor has no async client)."""
        pool = await make_async_pool(self.config, max_size=2, name="crash-anywhere-async")
        return AsyncExecutor(
            blocking=self.executor,
            pool=AsyncFaultPool(pool, self.injector),
            breaker=AsyncCircuitBreaker(faulty_async_redis(redis_url, self.injector), self.breaker),
            call_limiter=None,
            charger=None,
        )

    def clock(self) -> float:
        return time.time() + self.offset

    def _tagged_cross(self, name: str, phase: str) -> bool:
        with self.injector.lock:  # a crossing and its trace line together
            fired = self._cross(name, phase)
            if self.injector.enabled:
                n = self.injector.crossed[(name, phase)]
                self.outcome.trace.append((name, phase, n, self.part))
            return fired

    def _next_plan(self, reference: str) -> Plan:
        script = self.scripts[reference]
        effect, answer = script[min(self.calls[reference], len(script) - 1)]
        self.calls[reference] += 1
        return Plan(effect, answer)

    def _find_charges(self, request):
        if self.injector.cross("processor:find_charges", BEFORE):
            raise GatewayError("the processor could not be asked (injected)")
        return self._find(request)

    # -- the parts, each a process that may die

    def run(self, part: str, work) -> None:
        self.part = part
        try:
            work()
        except CRASHES as exc:
            self.outcome.crashes[f"{part}: {type(exc).__name__}"] += 1
        finally:
            self.part = "harness"

    def sweep(self) -> None:
        self.sweeper.run_once()

    def work(self) -> None:
        """The worker takes every queued message (as Dramatiq hands them over)."""
        queue = f"{self.namespace}:{self.config.queue_name}"
        while (message_id := self.clean_redis.lpop(queue)) is not None:
            raw = self.clean_redis.hget(f"{queue}.msgs", message_id)
            message = dramatiq.Message.decode(raw)
            claims, probe = message.args
            if self.loop is None:
                self.executor.execute(decode_claims(claims), probe=probe)
            else:
                self.loop.run(self.aio.execute(decode_claims(claims), probe=probe))

    def reap(self) -> None:
        self.reaper.run_once()

    def redrive(self) -> None:
        """The console re-drives every open letter (each asked by lookup first)."""
        with self.pool.connection() as conn:
            letters = dead_letters.list_open(conn)
            for letter in letters:
                try:
                    dead_letters.redrive(conn, self.processor, letter["payment_id"], actor="ops")
                except (DeadLetterActionRefused, GatewayError, NotFound):
                    pass

    # -- time and checks, outside the injector

    def time_passes(self, seconds: float) -> None:
        with self.injector.paused():
            shift = {"d": timedelta(seconds=seconds), **self.checker.due}
            self.conn.execute(
                "UPDATE payments SET lease_until = lease_until - %(d)s, "
                "run_at = greatest(due_at, run_at - %(d)s), "
                "calls_land_by = calls_land_by - %(d)s, in_doubt_since = in_doubt_since - %(d)s "
                "WHERE due_at BETWEEN %(due_from)s AND %(due_to)s",
                shift,
            )
            self.conn.execute("UPDATE attempts SET started_at = started_at - %(d)s", shift)
            self.offset += seconds
            self.breaker._clock.advance(seconds)

    def check(self, step: str) -> None:
        with self.injector.paused():
            self.checker.check(self.conn, self.ids, step=step)

    def check_settled(self) -> None:
        """Once the rounds are over: every payment as the processor says."""
        rows = self.checker.rows(self.conn, self.ids)
        for pid, row in rows.items():
            charged = bool(self.checker.charges(pid))
            where = f"payment {pid} at the end: {row['status']} in_doubt={row['in_doubt']}"
            if row["status"] == "PROCESSING":
                raise Violation(f"{where}: still PROCESSING")
            if charged and not (
                row["status"] == "COMPLETED" or (row["status"] == "FAILED" and row["in_doubt"])
            ):
                raise Violation(f"{where}: the processor holds its charge")
            if not charged and row["status"] == "COMPLETED":
                raise Violation(f"{where}: COMPLETED without a charge")

    def close(self) -> None:
        self.redis.close()
        self.clean_redis.close()
        if self.loop is not None:

            async def close() -> None:
                await self.aio.breaker._redis.aclose()
                await self.aio.pool.close()

            with self.injector.paused():
                self.loop.run(close())
            self.loop.close()


def play(env: dict, fault: Fault | None, seed: int) -> Outcome:
    """One schedule: the script, round after round, checked after each step."""
    rig = Rig(env, fault, seed)
    try:
        lease = rig.config.lease_seconds + 1
        bound = rig.config.in_flight_bound_seconds + 1
        for n in range(LOOP_ROUNDS if fault is not None and fault.always else ROUNDS):
            rig.run("sweeper", rig.sweep)
            rig.check("sweep")
            if n == 1:  # the breaker opens between the claim and the call: a hand-back
                with rig.injector.paused():
                    rig.breaker.open()
            rig.run("worker", rig.work)
            rig.check("work")
            if n == 1:
                with rig.injector.paused():
                    rig.breaker.close()
            rig.time_passes(lease)
            rig.run("reaper", rig.reap)
            rig.check("reap")
            if n >= 3:  # the doubts are past their in-flight bound: a human re-drives
                rig.time_passes(bound)
                rig.run("console", rig.redrive)
                rig.check("redrive")
        if fault is None or not fault.always:
            rig.check_settled()
    except Violation as violation:
        rig.outcome.violation = violation
    finally:
        rig.outcome.fired = rig.injector.fired
        rig.close()
        for table in ("attempts", "payment_events", "dead_letters"):
            env["conn"].execute(f"DELETE FROM {table}")
        # Named by due range: one partition locked, not every one.
        env["conn"].execute(
            "DELETE FROM payments WHERE due_at BETWEEN %(due_from)s AND %(due_to)s", rig.checker.due
        )
        env["redis"].delete(*env["redis"].keys(f"{env['config'].redis_namespace}*") or ["-"])
    return rig.outcome


def path_of(name: str, part: str) -> str:
    return PATHS.get(name) or PART_PATHS.get(part, part)


def schedules(baseline: Outcome, *, always: bool, paths: set[str], full: bool) -> list[Fault]:
    """Every boundary the fault-free run crossed on ``paths``: each occurrence
    (the first only unless ``full``) once, or each boundary as a crash loop."""
    found: list[Fault] = []
    for name, phase, n, part in baseline.trace:
        if path_of(name, part) not in paths:
            continue
        if always:
            fault = Fault(name, phase, 1, always=True)
        elif full or n == 1:
            fault = Fault(name, phase, n)
        else:
            continue
        if fault not in found:
            found.append(fault)
    return found


@pytest.fixture(params=EXECUTORS)
def env(conn, database_url, redis_url, config, request):
    config = config.with_overrides(retry_delays=(0.0, 0.0), lease_seconds=30)
    with make_pool(config, max_size=4, name="crash-anywhere") as pool:
        yield {
            "executor": request.param,
            "conn": conn,
            "pool": pool,
            "config": config,
            "redis_url": redis_url,
            "redis": redis_lib.Redis.from_url(redis_url),
        }


def explore(env, *, always: bool, paths: set[str], capsys) -> list[Outcome]:
    seed = int(os.environ.get("PAYCRON_FAULT_SEED", "20"))
    only = os.environ.get("PAYCRON_FAULT_SCHEDULE")
    started = time.monotonic()
    # A first fault-free run fills what the server shares between clients
    # (Redis's script cache: redis-py sends EVALSHA, then SCRIPT LOAD and
    # EVALSHA again when the script is new to the server), so the boundaries
    # found next are the ones every replay crosses.
    play(env, None, seed)
    baseline = play(env, None, seed)
    assert baseline.violation is None, f"seed {seed}, no fault: {baseline.violation}"
    full = os.environ.get("PAYCRON_FAULT_FULL") == "1"
    faults = (
        [Fault.parse(only)] if only else schedules(baseline, always=always, paths=paths, full=full)
    )
    outcomes = [play(env, fault, seed) for fault in faults]
    bad = [o for o in outcomes if o.violation is not None]
    with capsys.disabled():
        kind = "crash loops" if always else "single crashes"
        print(
            f"\ncrash anywhere, EXECUTOR={env['executor']} ({kind} on "
            f"{', '.join(sorted(paths))}): seed {seed}, "
            f"{len(faults)} schedules explored, {len(baseline.trace)} boundaries in the "
            f"fault-free run, {len(bad)} violations, {time.monotonic() - started:.1f} s"
        )
        parts = {(name, phase): part for name, phase, _, part in baseline.trace}
        per_path = Counter(path_of(f.name, parts.get((f.name, f.phase), "")) for f in faults)
        print("  schedules per path: " + ", ".join(f"{k}={v}" for k, v in sorted(per_path.items())))
        if os.environ.get("PAYCRON_FAULT_VERBOSE") == "1":
            print("  boundaries: " + ", ".join(sorted({f"{f.name}:{f.phase}" for f in faults})))
        for o in bad:
            print(f"  {o.fault}: {type(o.violation).__name__}: {o.violation}")
    assert all(o.fired for o in outcomes), [str(o.fault) for o in outcomes if not o.fired]
    if not only:  # every path asked for was crossed, so something was tried on each
        crossed = {path_of(name, part) for name, _, _, part in baseline.trace}
        assert paths <= crossed, paths - crossed
    return outcomes


def first_violation(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if o.violation is not None:
            seed = os.environ.get("PAYCRON_FAULT_SEED", "20")
            raise type(o.violation)(
                f"PAYCRON_FAULT_SEED={seed} PAYCRON_FAULT_SCHEDULE={o.fault}: {o.violation}"
            )


ALL_PATHS = {"claim", "start", "finish", "release", "reap", "lookup"}


@pytest.mark.timeout(600)
def test_a_crash_at_any_boundary_keeps_the_money_invariants(env, capsys):
    first_violation(explore(env, always=False, paths=ALL_PATHS, capsys=capsys))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "paths",
    [
        # Before parking looked a payment up first and counted only expiries
        # with a call in flight (docs/money-safety.md, "Parking after
        # repeated lease expiries"), the worker's crash loop parked payments
        # in doubt without a lookup or never sent, and the sweeper's parked
        # claims never started.
        pytest.param({"start", "finish"}, id="worker-crash-loop"),
        pytest.param({"claim"}, id="sweeper-crash-loop"),
        pytest.param({"release", "reap", "lookup"}, id="reaper-and-console-crash-loop"),
    ],
)
def test_a_crash_loop_at_any_boundary_keeps_the_money_invariants(env, paths, capsys):
    first_violation(explore(env, always=True, paths=paths, capsys=capsys))


def test_the_injector_fails_after_the_work_is_done(env, conn):
    """The harness's own proof: an "after" fault raises once the work is done
    (the statement committed, the COMMIT took effect, the Redis command ran);
    a "before" fault raises with nothing done. For ``asyncio``, the same of
    the async executor's pool and Redis client."""
    if env["executor"] == "asyncio":
        _async_injector_proof(env, conn)
        return

    def stored(fault: Fault, *, in_transaction: bool) -> bool:
        event = {"id": f"evt_{uuid.uuid4().hex}", "type": "probe", "data": {"object": {}}}
        injector = Injector(fault)
        with pytest.raises(psycopg.OperationalError):
            with FaultPool(env["pool"], injector).connection() as faulty:
                if in_transaction:
                    with faulty.transaction():
                        processor_events.store(faulty, processor=CARD, event=event)
                else:
                    processor_events.store(faulty, processor=CARD, event=event)
        assert injector.fired == 1
        found = conn.execute("SELECT 1 FROM gateway_events WHERE id = %s", (event["id"],))
        return found.fetchone() is not None

    assert stored(Fault("store_gateway_event", AFTER), in_transaction=False)
    assert not stored(Fault("store_gateway_event", BEFORE), in_transaction=False)
    assert stored(Fault("commit:store_gateway_event", AFTER), in_transaction=True)
    assert not stored(Fault("commit:store_gateway_event", BEFORE), in_transaction=True)

    key = f"{env['config'].redis_namespace}:probe"

    def pushed(fault: Fault) -> int:
        """How many pushes ran for one call (the caller sees an error, or
        redis-py sends the command again, as its retry settings say)."""
        env["redis"].delete(key)
        injector = Injector(fault)
        with contextlib.suppress(redis_lib.ConnectionError):
            faulty_redis(env["redis_url"], injector).rpush(key, "x")
        assert injector.fired == 1
        return env["redis"].llen(key)

    assert pushed(Fault("redis:rpush", AFTER)) >= 1  # it ran; its reply was lost
    assert pushed(Fault("redis:rpush", BEFORE)) <= 1  # never sent (perhaps sent again)
    env["redis"].delete(key)


def _async_injector_proof(env, conn) -> None:
    loop = LoopThread()
    config = env["config"]

    def stored(fault: Fault) -> bool:
        event_id = f"evt_{uuid.uuid4().hex}"
        params = {
            "id": event_id,
            "processor": CARD,
            "type": "probe",
            "intent_id": None,
            "payment_id": None,
            "payload": "{}",
        }
        injector = Injector(fault)

        async def store() -> None:
            pool = await make_async_pool(config, max_size=1, name="async-injector-proof")
            try:
                async with AsyncFaultPool(pool, injector).connection() as faulty:
                    await faulty.execute(q("store_gateway_event"), params)
            finally:
                await pool.close()

        with pytest.raises(psycopg.OperationalError):
            loop.run(store())
        assert injector.fired == 1
        found = conn.execute("SELECT 1 FROM gateway_events WHERE id = %s", (event_id,))
        return found.fetchone() is not None

    key = f"{config.redis_namespace}:probe"

    def pushed(fault: Fault) -> int:
        env["redis"].delete(key)
        injector = Injector(fault)

        async def push() -> None:
            client = faulty_async_redis(env["redis_url"], injector)
            try:
                with contextlib.suppress(redis_lib.ConnectionError):
                    await client.rpush(key, "x")
            finally:
                await client.aclose()

        loop.run(push())
        assert injector.fired == 1
        return env["redis"].llen(key)

    try:
        assert stored(Fault("store_gateway_event", AFTER))
        assert not stored(Fault("store_gateway_event", BEFORE))
        assert pushed(Fault("redis:rpush", AFTER)) >= 1  # it ran; its reply was lost
        assert pushed(Fault("redis:rpush", BEFORE)) <= 1  # never sent (perhaps sent again)
    finally:
        env["redis"].delete(key)
        loop.close()
