"""A model of the whole payment machine, driven against the real Postgres.

Hypothesis runs the engine's own code in random order, two processors side
by side (the card processor, ``fake``, and ``stripe``), each with its
sweeper, its worker (the real :class:`~paycron.engine.execution.Executor`),
its breaker (real, in Redis) and its gateway-event service; a reaper;
cancels; re-drives one by one and in bulk, refunds and dismissals from a
process configured for either processor; reconciliation; and time moving.

The processors are :class:`tests.model_processor.ModelProcessor`: a ledger
of what every idempotency key holds at each, answering each call with one
of its processor's wire answers as that processor's adapter classifies it,
replaying a key's answer, forgetting keys after the retention, and holding
a call open (a zombie whose effect lands, and whose answer comes, when the
model says). Bank debits stay processing until the model settles them;
their events are delivered late, twice, out of order or never.

Time moves by rewriting every stored time into the past (leases, run_at,
in-flight bounds, in-doubt times, polls, attempts' starts, events' next
tries) and moving the breakers' clocks and the processors' clock by as much:
the engine compares Postgres's ``now()`` and its own ``datetime.now`` with
those columns, so the two clocks move together. The processors', breakers'
and workers' clocks are stopped but for the model's moves, the policy's
jitter is drawn from the same seed in every sequence, and a hung call waits
for the model however long that takes: a sequence of choices must
meet the same state however slowly the machine runs it, or Hypothesis sees
its draws change (``FlakyStrategyDefinition``). Nor may an order the engine
leaves free decide which payment's call hangs or which plan a call gets: a
message holds its claims in the order the payments were created (not the
sweep's, by run_at), and a worker calls them in that order (not the order
Postgres returns its started rows in). Each sequence's sweepers start with
a full claim bucket, which no sequence empties.

After every step the money invariants of tests/money_invariants.py must
hold. The holes docs/money-safety.md closes each have a directed case
that turns on what reaches them, named by row:

- row 1: "A payment is asked about only at its own processor";
- row 2: "A release never hands back a started claim";
- rows 3 and 7: "Parking after repeated lease expiries" (3: the payment
  is looked up before it parks; 7: only an expiry with a call in flight
  counts, a claim never started goes back uncounted);
- row 4: "A doubt without a bound is never conclusive";
- row 5: "One absurd answer never loses its group";
- row 6: "A debit still processing is waited for, not dismissed".

Each found its hole on the code before the fixes (as an
``xfail(strict=True, raises=<its invariant>)`` until they merged) and must
pass now. The ``whole machine`` case turns everything on.

``PAYCRON_MODEL_EXAMPLES`` multiplies the examples (default 1: about a
minute for every case together in CI); ``PAYCRON_MODEL_SEED`` picks another
derandomised sequence; ``PAYCRON_MODEL_SHRINK=1`` shrinks a failure.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import pytest
import redis as redis_lib
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    rule,
)

from paycron.domain import policy
from paycron.domain.enums import CancelOutcome
from paycron.domain.processing import FAILED, PROCESSING, SUCCEEDED
from paycron.engine import dead_letters, execution
from paycron.engine.execution import Executor
from paycron.errors import DeadLetterActionRefused, GatewayError, NotFound
from paycron.limits.breaker import BreakerState, CircuitBreaker
from paycron.limits.pacing import ClaimPacer
from paycron.store import processor_events, transitions
from paycron.store.db import make_pool
from paycron.store.transitions import Claim
from reconciliation.run import reconcile_day
from scheduler.gateway_events import GatewayEventService
from scheduler.reaper import Reaper
from scheduler.sweeper import Sweeper, SweepSettings
from tests.factories import insert_payment
from tests.model_processor import (
    ANSWERS,
    CARD,
    CHARGE,
    DEBIT,
    DECLINE,
    LONG_ID,
    NOTHING,
    PROCESSORS,
    STORED_ERROR,
    STRIPE,
    ModelProcessor,
    Plan,
)
from tests.money_invariants import (
    EngineCrashed,
    MoneyChecker,
    Violation,
)
from tests.support import Clock

#: Tables a sequence empties when it ends (the next starts from nothing).
TABLES = (
    "attempts",
    "payment_events",
    "dead_letters",
    "refunds",
    "gateway_events",
    "reconciliation_items",
    "reconciliation_runs",
    "payments",
)
#: How far time moves in one step: a moment, past a lease (30 s), past the
#: in-flight bound (lease + timeout + settle margin = 632 s) and a poll,
#: an hour, and past the processors' key retention (a day).
TIME_STEPS = (45.0, 700.0, 90_000.0, 3600.0, 5.0)
#: Live payments at once: enough for groups and for claims to pick among several.
MAX_LIVE = 3
#: The effects a call may have at each processor.
EFFECTS = {
    CARD: (CHARGE, DECLINE, NOTHING, STORED_ERROR),
    STRIPE: (CHARGE, DECLINE, DEBIT, NOTHING, STORED_ERROR),
}
REDIS_ERRORS = (redis_lib.ConnectionError, redis_lib.TimeoutError)
#: Every (effect, answer) pair of each processor, in one list.
ALL_ANSWERS = {
    p: [(effect, answer) for effect in EFFECTS[p] for answer in ANSWERS[p][effect]]
    for p in PROCESSORS
}


@dataclass(frozen=True)
class Scenario:
    """Which operations a run may use: everything but the known holes'
    triggers, each of which a scenario turns on by itself."""

    name: str
    #: Re-drives and refunds from a console configured for the other processor
    #: than the payment's, event services and reconciliation from either
    #: (row 1).
    cross_processor: bool = False
    #: The broker takes a message but its reply is lost (the sweeper releases
    #: what a worker may already hold), and a duplicated message meets an
    #: open breaker (row 2).
    ambiguous_hand_backs: bool = False
    #: The reaper parks at this many lease expiries (rows 3 and 7); the
    #: whole-machine case never reaches it.
    max_lease_expiries: int = 1000
    #: Only claims whose call was in flight expire (row 3), or only claims
    #: never started (row 7); None: both.
    expire_only: str | None = None
    #: Rows in doubt from before the in-flight bound existed (row 4).
    legacy_rows: bool = False
    #: A charge answered with an id longer than any column holds (row 5).
    long_ids: bool = False
    #: An operator dismisses a letter when a refund says to (row 6).
    dismiss_on_advice: bool = False
    #: Messages may be lost (never delivered).
    lose_messages: bool = True
    #: Which processors' sweepers run (the others' payments are never claimed).
    sweepers: tuple[str, ...] = PROCESSORS
    #: The effects and wire answers calls draw from, where a case narrows them.
    effects: dict[str, tuple[str, ...]] | None = None
    answers: dict[str, tuple[str, ...]] | None = None
    #: Out of four: how often a lookup fails, and how often a worker's call hangs.
    lookup_failures: int = 1
    hangs: int = 1
    #: Whose lookups may fail (None: both processors').
    failing: tuple[str, ...] | None = None
    #: The rules a directed case runs (None: every rule).
    rules: frozenset[str] | None = None

    def allows(self, rule_name: str) -> bool:
        return self.rules is None or rule_name in self.rules

    #: Examples at PAYCRON_MODEL_EXAMPLES=1, and steps per example.
    examples: int = 60
    steps: int = 40


WHOLE = Scenario("whole machine", examples=20, steps=40)
#: What the directed cases narrow calls to: in doubt (a lost answer, a 5xx).
IN_DOUBT = {CHARGE: ("timeout", "500"), NOTHING: ("500", "timeout"), DEBIT: ("timeout",)}
ROW_BUDGET = {"examples": 30, "steps": 30}
#: The rules of the operators' and the engine's core loop.
ENGINE = {"sweep", "deliver", "time_passes", "reap"}
ZOMBIES = {"land", "answer"}
SCENARIOS = [
    pytest.param(WHOLE, id="whole-machine"),
    pytest.param(
        Scenario(
            "row 1",
            cross_processor=True,
            lose_messages=False,
            sweepers=(STRIPE,),
            effects={STRIPE: (CHARGE,)},
            answers=IN_DOUBT,
            lookup_failures=3,
            failing=(STRIPE,),
            hangs=0,
            rules=frozenset({"sweep", "deliver", "time_passes", "redrive", "redrive_all"}),
            examples=30,
            steps=50,
        ),
        id="row1-other-processor-lookup",
    ),
    pytest.param(
        Scenario("row 2", ambiguous_hand_backs=True, lose_messages=False, **ROW_BUDGET),
        id="row2-release-after-start",
    ),
    pytest.param(
        Scenario(
            "row 3",
            max_lease_expiries=2,
            expire_only="in_flight",
            lose_messages=False,
            hangs=3,
            rules=frozenset(ENGINE | ZOMBIES | {"create"}),
            examples=60,
            steps=40,
        ),
        id="row3-parked-without-lookup",
    ),
    pytest.param(
        Scenario(
            "row 4",
            legacy_rows=True,
            lose_messages=False,
            sweepers=(CARD,),
            effects={CARD: (CHARGE, NOTHING)},
            answers=IN_DOUBT,
            lookup_failures=3,
            rules=frozenset(ENGINE | ZOMBIES | {"create", "legacy_row", "redrive"}),
            **ROW_BUDGET,
        ),
        id="row4-missing-bound",
    ),
    pytest.param(
        Scenario(
            "row 5",
            long_ids=True,
            lose_messages=False,
            sweepers=(STRIPE,),
            effects={STRIPE: (DEBIT, CHARGE)},
            answers={DEBIT: ("200_processing", LONG_ID), CHARGE: ("200_succeeded",)},
            rules=frozenset({"create", "sweep", "deliver"}),
            **ROW_BUDGET,
        ),
        id="row5-absurd-answer",
    ),
    pytest.param(
        Scenario(
            "row 6",
            dismiss_on_advice=True,
            lose_messages=False,
            sweepers=(STRIPE,),
            effects={STRIPE: (DEBIT, NOTHING)},
            answers=IN_DOUBT,
            lookup_failures=2,
            rules=frozenset({"create", "sweep", "deliver", "refund", "debit_settles"}),
            examples=60,
            steps=40,
        ),
        id="row6-processing-debit-dismissed",
    ),
    pytest.param(
        Scenario("row 7", max_lease_expiries=2, expire_only="never_started", **ROW_BUDGET),
        id="row7-never-sent-parked",
    ),
]


@dataclass
class Message:
    """One message on a processor's queue."""

    claims: list[Claim]
    probe: bool
    deliveries: int = 0


@dataclass
class Hung:
    """A worker whose call hangs at the processor (a zombie once reaped)."""

    processor: str
    plan: Plan
    message: Message
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)


class PaymentMachine(RuleBasedStateMachine):
    """The engine's parts against one database, checked after every step."""

    def __init__(self, env: dict, scenario: Scenario, reached: Counter, steps: list[int]):
        super().__init__()
        self.scenario = scenario
        self.reached = reached
        self.steps = steps
        self.conn = env["conn"]
        self.pool = env["pool"]
        self.redis = env["redis"]
        self.offset = 0.0  # how far model time has moved
        self.started = time.time()  # the model's clocks stand still but for time_passes
        # The policy's jitter (a 409's or 429's wait times 1 to 1.5) from the
        # same sequence every time: whether a jittered wait is over after a
        # time step must not change between two runs of the same choices.
        policy._RNG.seed(0)
        self.clocks = {p: Clock() for p in PROCESSORS}
        self.configs = env["configs"]
        self.processors = {
            p: ModelProcessor(
                p,
                self.model_now,
                retention_seconds=self.configs[p].gateway_key_retention_seconds,
                long_ids=scenario.long_ids,
            )
            for p in PROCESSORS
        }
        self.breakers = {
            p: CircuitBreaker(self.redis, self.configs[p], clock=self.clocks[p]) for p in PROCESSORS
        }
        for breaker in self.breakers.values():
            breaker.close()
        self.executors = {
            p: Executor(
                config=self.configs[p],
                pool=self.pool,
                gateway=self.processors[p],
                breaker=self.breakers[p],
                call_limiter=None,
                worker=f"model-{p}",
                # The lease is measured on the model's clock: a worker hung
                # while time moved on sends nothing more once its lease is over.
                clock=self.model_now,
            )
            for p in PROCESSORS
        }
        self.queues: dict[str, list[Message]] = {p: [] for p in PROCESSORS}
        self.sweepers = {p: self._sweeper(p) for p in PROCESSORS}
        cfg = self.configs[CARD].with_overrides(max_lease_expiries=scenario.max_lease_expiries)
        self.reaper = Reaper(config=cfg, pool=self.pool)
        self.events_services = {
            p: GatewayEventService(
                config=self.configs[p], pool=self.pool, gateway=self.processors[p], concurrency=1
            )
            for p in PROCESSORS
        }
        self.hung: list[Hung] = []
        self.outbox: list[tuple[str, dict]] = []
        self.event_ids = iter(range(1, 1_000_000))
        self.ids: list[uuid.UUID] = []
        self.checker = MoneyChecker(self.processors)
        for processor in self.processors.values():
            # A call no plan was drawn for (a hung group's stale first claim)
            # goes out and is never answered.
            processor.next_plan = lambda reference: Plan(NOTHING, "timeout")
        self.step = "init"
        self.count = 0
        #: The rows as the last check read them: what the preconditions look at.
        self.snapshot: dict[uuid.UUID, dict] = {}
        self.leases_may_pass = False
        self.events_stored = 0
        self.opened: set[str] = set()  # breakers this sequence opened
        self.cursor: dict[str, int] = {}  # where each processor's answers are
        #: The database's now() when the last check ended: what a step wrote is newer.
        self.checked_at = datetime.now(UTC)

    # -- the parts

    def model_now(self) -> float:
        return self.started + self.offset

    def _sweeper(self, processor: str) -> Sweeper:
        config = self.configs[processor]

        def enqueue(claims, probe):
            self._enqueue(processor, list(claims), probe)

        # A bucket of its own for each sequence, full: it refills on Redis's
        # clock, so one that earlier sequences drained would grant as many
        # claims as the machine's speed let it refill. A sequence takes at
        # most 3 a sweep, 50 steps: the 750 it holds grant every sweep its
        # whole batch.
        bucket = config.with_overrides(redis_namespace=f"{config.redis_namespace}:{uuid.uuid4()}")
        return Sweeper(
            settings=SweepSettings.from_config(config),
            pool=self.pool,
            pacer=ClaimPacer(self.redis, bucket),
            breaker=self.breakers[processor],
            enqueue=enqueue,
        )

    def teardown(self):
        for hung in self.hung:  # let every zombie finish before the rows go
            hung.plan.released.set()
            hung.thread.join(10)
        for service in self.events_services.values():
            service.calls.shutdown()
        for table in TABLES[:-1]:
            self.conn.execute(f"DELETE FROM {table}")
        # Named by due range: one partition locked, not every one.
        self.conn.execute(
            "DELETE FROM payments WHERE due_at BETWEEN %(due_from)s AND %(due_to)s",
            self.checker.due,
        )
        self.steps.append(self.count)
        for processor in self.processors.values():
            for label in processor.reached:
                self.reached[f"answer {label}"] += 1

    # -- helpers

    def _draw_plan(self, data, processor: str, *, hang: bool = False) -> Plan:
        if self.scenario.effects is None and self.scenario.answers is None:
            # Every (effect, answer) of the processor in turn, from a drawn
            # start, a drawn stride apart: each sequence meets most of them.
            pairs = ALL_ANSWERS[processor]
            if processor not in self.cursor:
                self.cursor[processor] = data.draw(st.integers(0, len(pairs) - 1), label="start")
            self.cursor[processor] += data.draw(st.integers(1, 3), label="stride")
            effect, answer = pairs[self.cursor[processor] % len(pairs)]
            return Plan(effect, answer, hang=hang)
        effects = (self.scenario.effects or EFFECTS)[processor]
        effect = data.draw(st.sampled_from(effects), label="effect")
        answers = (self.scenario.answers or ANSWERS[processor])[effect]
        answer = data.draw(st.sampled_from(answers), label="answer")
        return Plan(effect, answer, hang=hang)

    def _plan_for(self, data, processor: str, claims: list[Claim], *, hang_first: bool) -> list:
        plans = []
        for i, claim in enumerate(claims):
            plan = self._draw_plan(data, processor, hang=hang_first and i == 0)
            self.processors[processor].plans[str(claim.payment_id)].append(plan)
            plans.append(plan)
        return plans

    def _discard(self, processor: str, plans: list[Plan]) -> None:
        """Plans of calls never made (stale claims, lookups instead) go."""
        for plan in plans:
            if plan.request is None:
                for queue in self.processors[processor].plans.values():
                    if plan in queue:
                        queue.remove(plan)

    def _execute(self, processor: str, claims: list[Claim], probe: bool) -> None:
        """The worker's unit of work, as the dispatcher runs it: a crash is a bug."""
        try:
            counts = self.executors[processor].execute(claims, probe=probe)
        except Exception as exc:
            raise EngineCrashed(f"the executor raised {type(exc).__name__}: {exc}") from exc
        if counts.released:
            self.reached["breaker hand-back"] += 1
        if counts.stale:
            self.reached["stale claim dropped"] += 1
        for name in counts.outcomes:
            self.reached[f"outcome {name}"] += 1
        if counts.looked_up:
            self.reached["executor lookup"] += 1

    def _spawn_hung(self, data, processor: str, message: Message) -> Hung | None:
        """A worker takes the message in a thread; its first call hangs."""
        # Only the first claim's plan now: the others' when the call answers
        # (no other worker may take them meanwhile).
        plans = self._plan_for(data, processor, message.claims[:1], hang_first=True)
        hung = Hung(processor, plans[0], message, threading.Thread(daemon=True))

        def run():
            try:
                self.executors[processor].execute(message.claims, probe=message.probe)
            except BaseException as exc:  # reported by the step that joins it
                hung.errors.append(exc)

        hung.thread = threading.Thread(target=run, daemon=True)
        hung.thread.start()
        while not hung.plan.entered.wait(0.01):
            if not hung.thread.is_alive():  # stale, released or a crash: no call
                hung.thread.join()
                self._discard(processor, plans)
                if hung.errors:
                    raise EngineCrashed(f"the executor raised {hung.errors[0]!r}")
                return None
        self.hung.append(hung)
        self.reached["call hangs"] += 1
        return hung

    def _enqueue(self, processor: str, claims: list[Claim], probe: bool) -> None:
        mode = self._enqueue_mode
        if mode == "refused":
            self.reached["enqueue refused"] += 1
            raise redis_lib.ConnectionError("the broker refused (the model)")
        # The sweeper hands its claims over oldest run_at first. A new
        # payment's run_at is its due_at, a second before its create; a
        # retried one's is when its answer was written: which is older
        # depends on how fast the steps in between ran, not on the choices.
        # The first claim's call is the one that hangs, and plans are drawn
        # in the claims' order: the message holds them in creation order.
        claims = sorted(claims, key=lambda claim: self.ids.index(claim.payment_id))
        message = Message(claims, probe)
        self.queues[processor].append(message)
        if mode == "lost_reply":
            # Delivered, and a worker took it before the sweeper heard nothing back.
            self.reached["enqueue reply lost"] += 1
            message.deliveries += 1
            self._spawn_hung(self._data, processor, message)
            raise redis_lib.ConnectionError("the broker's reply was lost (the model)")

    def _payments(self) -> list[uuid.UUID]:
        return list(self.ids)

    def _lookup_gateway(self, data, payment_id: uuid.UUID) -> str:
        """Which process acts: its own processor's, or (row 1) either."""
        processor = self.conn.execute(
            "SELECT processor FROM payments WHERE id = %(id)s "
            "AND due_at BETWEEN %(due_from)s AND %(due_to)s",
            {"id": payment_id, **self.checker.due},
        ).fetchone()["processor"]
        if processor is None:
            return data.draw(st.sampled_from(PROCESSORS), label="acting process's processor")
        if self.scenario.cross_processor:  # the console runs with the other processor's settings
            return next(p for p in PROCESSORS if p != processor)
        return processor

    def _fail_lookups(self, data) -> None:
        failures = self.scenario.lookup_failures
        fails = data.draw(
            st.sampled_from([False] * (4 - failures) + [True] * failures), label="lookups fail"
        )
        for p in self.processors.values():
            p.fail_lookups = fails and (
                self.scenario.failing is None or p.name in self.scenario.failing
            )

    def _rows(self, sql: str, params=None) -> list[dict]:
        return self.conn.execute(sql, params or {}).fetchall()

    def _note(self, name: str) -> None:
        self.step = name
        self.count += 1
        self.reached[name] += 1

    # -- creating and claiming

    @initialize(n=st.integers(1, 3))
    def create_some(self, n):
        for _ in range(n):
            self.create()

    def create(self, data=None):
        self._note("create")
        row = insert_payment(self.conn, due_at=datetime.now(UTC) - timedelta(seconds=1))
        self.ids.append(row["id"])

    def _live(self) -> int:
        if not self.ids:
            return 0
        return self.conn.execute(
            "SELECT count(*) AS n FROM payments WHERE status NOT IN ('COMPLETED', 'FAILED', "
            "'CANCELLED') AND due_at BETWEEN %(due_from)s AND %(due_to)s",
            self.checker.due,
        ).fetchone()["n"]

    def _with(self, *statuses: str) -> list[uuid.UUID]:
        rows = self.snapshot
        return [pid for pid in self.ids if pid in rows and rows[pid]["status"] in statuses]

    def sweep(self, data):
        processor = data.draw(st.sampled_from(self.scenario.sweepers), label="sweeper")
        modes = ["ok"] * 5 + ["refused"]
        if self.scenario.ambiguous_hand_backs:
            modes += ["lost_reply", "lost_reply"]
        self._enqueue_mode = data.draw(st.sampled_from(modes), label="enqueue")
        self._data = data
        self._note("sweep")
        try:
            counts = self.sweepers[processor].run_once()
        except REDIS_ERRORS:
            self.reached["sweep: enqueue failed, released"] += 1
            return
        except Violation:
            raise
        except Exception as exc:
            raise EngineCrashed(f"the sweeper raised {exc!r}") from exc
        if counts.probe:
            self.reached["sweep: probe"] += 1

    def deliver(self, data):
        """A worker takes a message: once, or it stays queued (delivered again)."""
        processor = data.draw(st.sampled_from([p for p in PROCESSORS if self.queues[p]]))
        queue = self.queues[processor]
        message = data.draw(st.sampled_from(queue), label="message")
        breaker_closed = self.breakers[processor].state() is BreakerState.CLOSED
        duplicate = data.draw(st.booleans(), label="duplicated")
        if message.deliveries and not breaker_closed and not self.scenario.ambiguous_hand_backs:
            duplicate = False
            queue.remove(message)
            self._note("deliver: duplicate dropped while the breaker is open")
            return
        if not duplicate:
            queue.remove(message)
        if message.deliveries:
            self.reached["duplicated message"] += 1
        message.deliveries += 1
        hangs = self.scenario.hangs
        hang = data.draw(st.sampled_from([False] * (4 - hangs) + [True] * hangs), label="hangs")
        self._fail_lookups(data)
        if hang:
            self._note("deliver: worker hangs")
            self._spawn_hung(data, processor, message)
            return
        self._note("deliver")
        plans = self._plan_for(data, processor, message.claims, hang_first=False)
        try:
            self._execute(processor, message.claims, message.probe)
        finally:
            self._discard(processor, plans)

    def lose_message(self, data):
        self._note("message lost")
        processor = data.draw(st.sampled_from([p for p in PROCESSORS if self.queues[p]]))
        self.queues[processor].pop(0)

    # -- hung calls

    def land(self, data):
        """A hung call reaches the processor (its caller still waits)."""
        self._note("hung call lands")
        hung = data.draw(st.sampled_from([h for h in self.hung if not h.plan.landed]))
        self.processors[hung.processor].land(hung.plan)

    def answer(self, data):
        """A hung call's answer comes back: its worker finishes (late, maybe a zombie)."""
        self._note("hung call answers")
        hung = data.draw(st.sampled_from(self.hung), label="hung")
        self.hung.remove(hung)
        self._fail_lookups(data)
        rest = self._plan_for(data, hung.processor, hung.message.claims[1:], hang_first=False)
        hung.plan.released.set()
        hung.thread.join(20)
        self._discard(hung.processor, rest)
        if hung.thread.is_alive():
            raise EngineCrashed("a worker never finished after its call answered")
        if hung.errors:
            raise EngineCrashed(f"the executor raised {hung.errors[0]!r}") from hung.errors[0]

    # -- the breaker

    def breaker_opens(self, data):
        """Calls failed: the breaker opens (workers hand their claims back)."""
        self._note("breaker opens")
        processor = data.draw(st.sampled_from([p for p in PROCESSORS if p not in self.opened]))
        self.breakers[processor].open()
        self.opened.add(processor)

    def breaker_closes(self, data):
        """A probe succeeded (or an operator closed it)."""
        self._note("breaker closes")
        processor = data.draw(st.sampled_from(sorted(self.opened)))
        self.breakers[processor].close()
        self.opened.discard(processor)

    # -- time and the reaper

    def _time_matters(self) -> bool:
        """Something waits for time: a lease, a retry, a bound, a poll, a zombie."""
        return bool(self.hung) or any(
            row["status"] in ("PROCESSING", "AWAITING_GATEWAY")
            or (row["status"] == "PENDING" and row["waiting"])
            or row["in_doubt"]
            for row in self.snapshot.values()
        )

    def time_passes(self, data):
        seconds = data.draw(st.sampled_from(TIME_STEPS), label="seconds")
        self._note(f"time passes {seconds:.0f}s")
        bound = self.configs[CARD].in_flight_bound_seconds
        for hung in self.hung:
            # No call lands later than its in-flight bound.
            if not hung.plan.landed and self.model_now() + seconds >= hung.plan.started + bound:
                self.processors[hung.processor].land(hung.plan)
        expire = self.scenario.expire_only
        if expire and seconds >= self.configs[CARD].lease_seconds:
            # The scenario lets only one kind of claim expire: renew the others.
            kept = "NOT EXISTS" if expire == "in_flight" else "EXISTS"
            self.conn.execute(
                "UPDATE payments p SET lease_until = lease_until + make_interval(secs => %(s)s) "
                "WHERE due_at BETWEEN %(due_from)s AND %(due_to)s "
                f"AND status = 'PROCESSING' AND {kept} (SELECT FROM attempts a "
                "WHERE a.payment_id = p.id AND a.attempt = p.attempt AND a.outcome = 'IN_FLIGHT')",
                {"s": seconds, **self.checker.due},
            )
        self._shift_stored_times(timedelta(seconds=seconds))
        self.offset += seconds
        self.leases_may_pass = self.leases_may_pass or seconds >= self.configs[CARD].lease_seconds
        for clock in self.clocks.values():
            clock.advance(seconds)

    def _shift_stored_times(self, delta: timedelta) -> None:
        """Every stored time ``delta`` into the past (a negative one: into the future)."""
        shift = {"d": delta, **self.checker.due}
        self.conn.execute(
            """
            UPDATE payments SET lease_until = lease_until - %(d)s,
                run_at = greatest(due_at, run_at - %(d)s),
                calls_land_by = calls_land_by - %(d)s,
                in_doubt_since = in_doubt_since - %(d)s,
                next_poll_at = next_poll_at - %(d)s,
                awaiting_since = awaiting_since - %(d)s
            WHERE due_at BETWEEN %(due_from)s AND %(due_to)s
            """,
            shift,
        )
        self.conn.execute("UPDATE attempts SET started_at = started_at - %(d)s", shift)
        self.conn.execute(
            "UPDATE gateway_events SET next_attempt_at = next_attempt_at - %(d)s", shift
        )

    def reap(self, data=None):
        self._note("reap")
        self.leases_may_pass = False
        try:
            counts = self.reaper.run_once()
        except Exception as exc:
            raise EngineCrashed(f"the reaper raised {exc!r}") from exc
        if counts.reaped:
            self.reached["reaped"] += 1
        if counts.parked:
            self.reached["parked: lease expired repeatedly"] += 1
        self.checker.check_reaped(self.conn, self.ids)

    # -- the payer

    def cancel(self, data):
        """The payer cancels: mostly a payment that was called already (a
        fresh one is the plain case), now and then any."""
        self._note("cancel")
        called = [pid for pid in self._with("PENDING") if self.snapshot[pid]["attempt"]]
        payment = data.draw(
            st.sampled_from(called or self._with("PENDING")) | st.sampled_from(self.ids),
            label="payment",
        )
        outcome = transitions.cancel(self.conn, payment, actor="alice")
        self.reached[f"cancel: {outcome}"] += 1
        assert isinstance(outcome, CancelOutcome)

    # -- operators

    def _open_letters(self) -> list[uuid.UUID]:
        return [
            r["payment_id"]
            for r in self._rows(
                "SELECT payment_id FROM dead_letters WHERE resolution IS NULL ORDER BY id"
            )
        ]

    def redrive(self, data):
        payment = data.draw(st.sampled_from(self._open_letters()), label="payment")
        processor = self._lookup_gateway(data, payment)
        self._fail_lookups(data)
        self._note("redrive")
        self._redrive_one(processor, payment)

    def _redrive_one(self, processor: str, payment: uuid.UUID) -> None:
        try:
            result = dead_letters.redrive(
                self.conn,
                self.processors[processor],
                payment,
                actor="ops",
                poll_seconds=self.configs[processor].gateway_poll_seconds,
            )
        except (DeadLetterActionRefused, GatewayError, NotFound) as refused:
            self.reached[f"redrive refused: {str(refused)[:30]}"] += 1
            self.reached[f"redrive by {processor} refused: {str(refused)[:40]}"] += 1
            return
        self.reached[f"redrive: {result.action}"] += 1
        self.reached[f"redrive by {processor}: {result.action}"] += 1

    def redrive_all(self, data):
        """The console's re-drive of a selection: every open letter, one process
        (configured for each payment's processor, or with row 1 for the other)."""
        self._note("bulk redrive")
        self._fail_lookups(data)
        for payment in self._open_letters():
            self._redrive_one(self._lookup_gateway(data, payment), payment)

    def refund(self, data):
        payment = data.draw(st.sampled_from(self._open_letters()), label="payment")
        processor = self._lookup_gateway(data, payment)
        self._fail_lookups(data)
        self._note("refund")
        try:
            result = dead_letters.refund(
                self.conn, self.processors[processor], payment, actor="ops"
            )
        except (DeadLetterActionRefused, GatewayError, NotFound) as refused:
            self.reached["refund refused"] += 1
            if self.scenario.dismiss_on_advice and "dismiss it" in str(refused):
                # The operator does what the console says.
                dead_letters.dismiss(self.conn, payment, actor="ops", note="no charge")
                self.checker.dismissed_on_advice.add(payment)
                self.reached["dismissed on advice"] += 1
            return
        self.reached[f"refund: {result.action}"] += 1

    def _unrecorded_charges(self) -> bool:
        return any(
            self.snapshot.get(uuid.UUID(i.reference), {}).get("status") != "COMPLETED"
            for p in self.processors.values()
            for i in p.intents.values()
            if i.charged
        )

    def reconcile(self, data):
        processor = data.draw(st.sampled_from(PROCESSORS), label="reconciling processor")
        self._fail_lookups(data)
        self._note("reconcile")
        gateway = self.processors[processor]
        if gateway.fail_lookups:
            return  # the report could not be fetched: the run does not start
        report = gateway.settlement_report(date.today())
        result = reconcile_day(
            self.conn, datetime.now(UTC).date(), report, source="gateway", gateway=gateway
        )
        if result.counts().get("repaired"):
            self.reached["reconciliation repaired"] += 1

    def legacy_row(self, data):
        """A row in doubt from before the in-flight bound was kept (migration 008)."""
        self._note("legacy row")
        self.conn.execute(
            "UPDATE payments SET calls_land_by = NULL WHERE in_doubt AND id = %(id)s "
            "AND due_at BETWEEN %(due_from)s AND %(due_to)s",
            {"id": data.draw(st.sampled_from(self._bounded_doubts())), **self.checker.due},
        )

    # -- bank debits and their events

    def _bounded_doubts(self) -> list[uuid.UUID]:
        """Payments in doubt whose in-flight bound is kept."""
        return [
            pid for pid in self.ids if pid in self.snapshot and self.snapshot[pid]["bounded_doubt"]
        ]

    def _debits(self) -> list[tuple[str, str]]:
        return [
            (p.name, i.id)
            for p in self.processors.values()
            for i in p.intents.values()
            if i.status == PROCESSING
        ]

    def debit_settles(self, data):
        """A bank debit settles at the processor; it sends its event."""
        succeeded = data.draw(st.sampled_from([True, False]), label="succeeded")
        self._note("debit settles")
        processor, intent = data.draw(st.sampled_from(self._debits()), label="debit")
        self.processors[processor].settle(intent, SUCCEEDED if succeeded else FAILED)
        kind = "payment_intent.succeeded" if succeeded else "payment_intent.payment_failed"
        reference = self.processors[processor].intents[intent].reference
        for event_type in ("payment_intent.processing", kind):  # both may come, in any order
            self.outbox.append(
                (
                    processor,
                    {
                        "id": f"evt_{next(self.event_ids)}",
                        "type": event_type,
                        "data": {
                            "object": {"id": intent, "metadata": {"paycron_payment_id": reference}}
                        },
                    },
                )
            )

    def event_arrives(self, data):
        """One event from the outbox, any of them (reordered), once, twice or never."""
        fate = data.draw(st.sampled_from(["delivered", "delivered", "twice", "lost"]))
        self._note(f"event {fate}")
        processor, event = data.draw(st.sampled_from(self.outbox), label="event")
        self.outbox.remove((processor, event))
        for _ in range({"delivered": 1, "twice": 2, "lost": 0}[fate]):
            processor_events.store(self.conn, processor=processor, event=event)
            self.events_stored += 1

    def gateway_events(self, data):
        """The event service applies stored events and polls waiting payments."""
        # Only Stripe's debits wait for the processor: its service, or (row 1)
        # the card processor's, asking the wrong processor.
        processor = (
            data.draw(st.sampled_from(PROCESSORS), label="event service's processor")
            if self.scenario.cross_processor
            else STRIPE
        )
        self._fail_lookups(data)
        self._note("gateway events")
        try:
            counts = self.events_services[processor].run_once()
        except Exception as exc:
            raise EngineCrashed(f"the event service raised {exc!r}") from exc
        self.events_stored = 0
        if counts.settled:
            self.reached["settled by event or poll"] += 1

    @rule(data=st.data())
    def step(self, data):
        """One operation, drawn from those whose time has come (and that the
        case runs), weighted towards the engine's own loop."""
        ready = [
            name
            for name, when in OPERATIONS.items()
            if self.scenario.allows(name) and when(self)
            for _ in range(WEIGHTS.get(name, 1))
        ]
        if not ready:
            self._note("nothing happens")
            return
        getattr(self, data.draw(st.sampled_from(ready), label="operation"))(data)

    # -- the invariants

    @invariant()
    def money(self):
        if self.ids:
            # A wait shorter than the model's smallest time step (a 429, a 409)
            # is made that step: only the model's time makes it pass, so a
            # sequence does the same however fast the machine runs it. That
            # includes a wait this step wrote (its run_at after its
            # updated_at) which a slow step outlived already.
            self.conn.execute(
                "UPDATE payments SET run_at = now() + make_interval(secs => %(s)s) "
                "WHERE status = 'PENDING' "
                "AND (run_at > now() OR (updated_at > %(checked)s AND run_at > updated_at)) "
                "AND run_at < now() + make_interval(secs => %(s)s) "
                "AND due_at BETWEEN %(due_from)s AND %(due_to)s",
                {"s": min(TIME_STEPS), "checked": self.checked_at, **self.checker.due},
            )
            self.snapshot = self.checker.check(self.conn, self.ids, step=self.step)
        self.checked_at = self.conn.execute("SELECT now() AS t").fetchone()["t"]


#: Every operation the model runs, and when it may: one rule draws among the
#: ready ones (so a case that runs only a few never idles on disabled rules).
OPERATIONS = {
    "deliver": lambda m: any(m.queues.values()),
    "sweep": lambda m: bool(m._with("PENDING")),
    "time_passes": lambda m: m._time_matters(),
    "reap": lambda m: m.leases_may_pass and bool(m._with("PROCESSING")),
    "answer": lambda m: bool(m.hung),
    "land": lambda m: any(not h.plan.landed for h in m.hung),
    "cancel": lambda m: any(m.snapshot[p]["attempt"] for p in m._with("PENDING")),
    "lose_message": lambda m: m.scenario.lose_messages and any(m.queues.values()),
    "breaker_opens": lambda m: any(m.queues.values()) and len(m.opened) < len(PROCESSORS),
    "breaker_closes": lambda m: bool(m.opened),
    "redrive": lambda m: bool(m._open_letters()),
    "redrive_all": lambda m: bool(m._open_letters()),
    "refund": lambda m: bool(m._open_letters()),
    "reconcile": lambda m: m._unrecorded_charges(),
    "legacy_row": lambda m: m.scenario.legacy_rows and bool(m._bounded_doubts()),
    "debit_settles": lambda m: bool(m._debits()),
    "event_arrives": lambda m: bool(m.outbox),
    "gateway_events": lambda m: bool(m.events_stored or m._with("AWAITING_GATEWAY")),
    "create": lambda m: m._live() < MAX_LIVE,
}
#: The engine's own loop comes round more often than an operator.
WEIGHTS = {"deliver": 3, "time_passes": 2, "reap": 2, "answer": 2}

#: Branches the whole-machine case must reach at the CI budget, whatever the
#: seed: a run that never got there checked nothing about them. The rest
#: (operators' actions, debits and their events, breaker hand-backs, every
#: answer) is reached as the seed and budget allow: PAYCRON_MODEL_VERBOSE=1
#: prints what was, and the directed cases reach their own.
MUST_REACH = {
    "sweep",
    "deliver",
    "deliver: worker hangs",
    "duplicated message",
    "enqueue refused",
    "stale claim dropped",
    "reaped",
    "outcome SUCCEEDED",
    "outcome DECLINED",
    "outcome AMBIGUOUS",
    "outcome RETRYABLE_ERROR",
}


def _start_in_claims_order(pool, claims, **kwargs) -> list[dict]:
    """:func:`transitions.start`, its rows in the claims' order.

    ``start_attempts`` has no ORDER BY: its rows come back in whatever order
    Postgres's plan yields, which changes from one run of the same choices
    to the next, and the executor calls them in that order. The model hangs
    the first claim's call and draws the others' plans when it answers:
    called in another order, the same choices hang another payment's call
    (or none) and send the others with no plan drawn."""
    order = {claim.payment_id: i for i, claim in enumerate(claims)}
    return sorted(transitions.start(pool, claims, **kwargs), key=lambda row: order[row["id"]])


@pytest.fixture
def env(conn, database_url, redis_url, config, monkeypatch):
    monkeypatch.setattr(execution, "start", _start_in_claims_order)
    configs = {
        CARD: config.with_overrides(
            gateway=CARD,
            retry_delays=(0.0, 0.0),  # three calls: budgets run out within a sequence
            redis_namespace=f"{config.redis_namespace}:card",
        ),
        STRIPE: config.with_overrides(
            gateway=STRIPE,
            stripe_api_key="sk_test_model",
            retry_delays=(0.0, 0.0),
            redis_namespace=f"{config.redis_namespace}:stripe",
        ),
    }
    with make_pool(configs[CARD], max_size=6, name="model") as pool:
        yield {
            "conn": conn,
            "pool": pool,
            "redis": redis_lib.Redis.from_url(redis_url),
            "configs": configs,
        }


def _settings(scenario: Scenario) -> settings:
    scale = float(os.environ.get("PAYCRON_MODEL_EXAMPLES", "1"))
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("PAYCRON_MODEL_SHRINK") == "1":
        phases.append(Phase.shrink)
    return settings(
        max_examples=max(1, round(scenario.examples * scale)),
        stateful_step_count=scenario.steps,
        deadline=None,
        database=None,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_payment_machine_keeps_its_money_invariants(env, scenario, capsys):
    reached: Counter = Counter()
    steps: list[int] = []
    started = time.monotonic()
    chosen = int(os.environ.get("PAYCRON_MODEL_SEED", "20"))
    test = get_state_machine_test(
        lambda: PaymentMachine(env, scenario, reached, steps), settings=_settings(scenario)
    )
    try:
        seed(chosen)(test)()
    finally:
        with capsys.disabled():
            print(
                f"\nmodel [{scenario.name}]: seed {chosen}, {len(steps)} sequences, "
                f"{sum(steps)} steps in {time.monotonic() - started:.1f} s"
            )
            every = {
                f"answer {p}: {e} {a}"
                for p in PROCESSORS
                for e, ans in ANSWERS[p].items()
                for a in ans
            }
            print(f"  answers reached: {len(every & set(reached))} of {len(every)}")
            if os.environ.get("PAYCRON_MODEL_VERBOSE") == "1":
                print("  reached: " + ", ".join(f"{k}={v}" for k, v in sorted(reached.items())))
    if scenario is WHOLE:
        missed = MUST_REACH - set(reached)
        assert not missed, (missed, sorted(reached.items()))
