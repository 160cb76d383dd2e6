"""A model of the payment state machine, driven against the real Postgres.

Hypothesis runs creates, claims, starts, finishes (every gateway answer,
through ``policy.decide`` as the executor does), zombie finishes, cancels,
lease expiries, reaps, re-drives and completions from the gateway in random
order. After every step each row must equal a plain-Python model of it and
the invariants at the bottom must hold.

The model's gateway keeps the truth the engine cannot see: what the gateway
holds for each payment's idempotency key (a charge, a decline or nothing).
A call's effect there is drawn first and its answer second, from the answers
that effect allows, so a timeout may hide a charge and a key answered once
replays that answer.

One assumption: a zombie's call has settled at the gateway by the time its
lease is reaped. The engine no longer needs it (a re-drive now waits for a
conclusive "none", past the calls' in-flight bound: tests/engine/test_dead_letters.py
and tests/engine/test_in_flight_bound.py), but this model does not yet model time,
key generations or the Stripe answers; a rewrite that does is in progress.

The CHECK constraints are Postgres's to enforce: a transition that would
break one raises, and the sequence fails with the CheckViolation.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from paycron.config import Config
from paycron.domain.enums import CancelOutcome, EventType, FailureReason, Outcome, Status
from paycron.domain.policy import decide
from paycron.engine.execution import look_up
from paycron.errors import GatewayError
from paycron.processors.card.client import CallResult, Charge
from paycron.store import transitions
from paycron.store.clock import database_now
from paycron.store.db import make_pool
from paycron.store.transitions import Claim, Finished
from tests.factories import insert_payment

# -- The one call each of cancel and reap_expired: adapt them here ------------------


def cancel(conn, payment_id: uuid.UUID, *, actor: str) -> CancelOutcome:
    """``transitions.cancel``: cancelled (now or before), or why not."""
    return transitions.cancel(conn, payment_id, actor=actor)


def reap(conn, config: Config) -> list[dict]:
    """``transitions.reap_expired``: the rows it moved (id, status, in_doubt)."""
    return transitions.reap_expired(conn, limit=100, config=config)


# -- The model's settings and gateway ------------------------------------------------

#: A budget of two calls (the first failure waits, so "not due yet" happens)
#: and parking at the 2nd lease expiry: both edges within a few steps.
CONFIG = Config(retry_delays=(600.0,), max_lease_expiries=2)
#: Never runs out by itself during a test: only the expire rule ends a lease.
LEASE_SECONDS = 300.0
#: Due a second ago (claimable now) three times in four, else in an hour.
DUE_NOW = st.sampled_from([True, True, True, False])
#: Due payments not yet terminal at once: enough for claims to pick among several.
#: A new one may be created whenever fewer are live, so a sequence never dead-ends.
MAX_LIVE = 3
PARKED = {FailureReason.RETRIES_EXHAUSTED, FailureReason.LEASE_EXPIRED_REPEATEDLY}
#: Attempt outcomes that say the gateway holds a charge.
CHARGE_OUTCOMES = {Outcome.SUCCEEDED, Outcome.FOUND_BY_LOOKUP, Outcome.RECONCILED}
#: The only ways out of a terminal status, and the step that may take each.
REOPENINGS = {
    (Status.FAILED, Status.PENDING): "redrive",
    (Status.FAILED, Status.COMPLETED): "complete",
}

#: A payment told to wait less than this may come due while a sequence runs
#: (a 429 without Retry-After, a 409): the model is not sure when it is due.
SOON_SECONDS = 60.0

NOTHING, CHARGED, DECLINED = "nothing", "charged", "declined"
#: What a call can do at the gateway, given what the key already holds
#: (None: never answered). A key answered once replays that answer.
EFFECTS = {
    None: (NOTHING, CHARGED, DECLINED),
    CHARGED: (NOTHING, CHARGED),
    DECLINED: (NOTHING, DECLINED),
}
#: The answers a call can get back, given what it did at the gateway.
ANSWERS = {
    CHARGED: ("succeeded", "http_503", "timeout"),
    DECLINED: ("declined", "http_503", "timeout"),
    NOTHING: (
        "rate_limited",
        "rate_limited_120s",
        "refused",
        "http_503",
        "timeout",
        "key_in_use",
        "not_sent",
    ),
}


def call_result(answer: str, payment_id: uuid.UUID) -> CallResult:
    """The CallResult HttpGateway returns for each answer (gateway_client.classify)."""
    if answer == "succeeded":
        return CallResult(Outcome.SUCCEEDED, gateway_ref=charge_ref(payment_id))
    if answer == "declined":
        return CallResult(Outcome.DECLINED, error_code="card_declined")
    if answer == "rate_limited":
        return CallResult(Outcome.RATE_LIMITED, error_code="rate_limited")
    if answer == "rate_limited_120s":
        return CallResult(Outcome.RATE_LIMITED, error_code="rate_limited", retry_after=120.0)
    if answer == "not_sent":  # the executor's own: the lease was too short to send it
        return CallResult(Outcome.NOT_SENT, error_code="lease_too_short")
    if answer == "refused":
        return CallResult(Outcome.RETRYABLE_ERROR, error_code="NewConnectionError")
    if answer == "http_503":
        return CallResult(Outcome.RETRYABLE_ERROR, error_code="http_503", in_doubt=True)
    if answer == "timeout":
        return CallResult(Outcome.AMBIGUOUS, error_code="ReadTimeoutError", in_doubt=True)
    assert answer == "key_in_use"
    return CallResult(Outcome.KEY_IN_USE, error_code="idempotency_key_in_use", in_doubt=True)


def one_or_any(likely: list, every: list) -> st.SearchStrategy:
    """One of ``likely`` half the time (when there are any), else one of ``every``:
    steps go where the state machine moves, without leaving the rest untried."""
    return st.sampled_from(likely) | st.sampled_from(every) if likely else st.sampled_from(every)


def charge_ref(payment_id: uuid.UUID) -> str:
    return f"ch_{payment_id.hex[:12]}"


@dataclass
class Payment:
    """What the model says one payments row holds, and what is around it."""

    id: uuid.UUID
    due_at: datetime
    due_now: bool
    status: Status = Status.PENDING
    attempt: int = 0
    failures: int = 0
    in_doubt: bool = False
    failure_reason: FailureReason | None = None
    lease_expiries: int = 0
    key_in_use: int = 0
    #: run_at pushed past now by a backoff, a 429 or a 409: for minutes
    #: (``waiting``), or for seconds (``soon``: it may be due by now, or not).
    waiting: bool = False
    soon: bool = False
    lease_forced: bool = False  # lease_until moved into the past
    key: str | None = None  # what the gateway holds for the key: the model's ledger
    attempts: dict[int, Outcome] = field(default_factory=dict)
    events: list[tuple[str, str, int]] = field(default_factory=list)
    dead_letter_open: bool = False
    #: The row's last write was a status change (so it carries its event's time).
    changed_last: bool = False

    def __repr__(self) -> str:  # what a failing sequence prints
        return (
            f"Payment({str(self.id)[:13]}, {self.status}, attempt={self.attempt}, "
            f"in_doubt={self.in_doubt}, key={self.key})"
        )

    def _repr_pretty_(self, printer, cycle):  # hypothesis prints draws with this hook
        printer.text(repr(self))

    @property
    def ready(self) -> bool:
        """Surely due: claim_due must take it (when its limit leaves room)."""
        return self.status is Status.PENDING and self.due_now and not self.waiting and not self.soon

    @property
    def maybe_ready(self) -> bool:
        """Perhaps due: claim_due may take it."""
        return self.ready or (self.status is Status.PENDING and self.soon)

    def changed(self, status: Status) -> None:
        """A status change, and the event it writes."""
        self.status = status
        self.events.append((EventType(f"payment.{status.lower()}"), status, self.attempt))
        self.changed_last = True


@dataclass
class Held:
    """One claim the model handed to a worker, and what became of it."""

    claim: Claim
    row: dict | None = None  # what start returned: the worker's snapshot
    finished: bool = False
    reaped: bool = False
    effect: str | None = None  # a reaped in-flight call's effect at the gateway

    def __repr__(self) -> str:
        return (
            f"Held({str(self.claim.payment_id)[:13]}, attempt={self.claim.attempt}, "
            f"started={self.row is not None}, reaped={self.reaped}, effect={self.effect})"
        )

    _repr_pretty_ = Payment._repr_pretty_


class ModelGateway:
    """Lookups by reference, answered from the model's ledger (or failing)."""

    def __init__(self, payments: dict[uuid.UUID, Payment], *, fails: bool):
        self.payments = payments
        self.fails = fails

    def find_charge(self, reference: str) -> Charge | None:
        if self.fails:
            raise GatewayError("gateway unreachable: the model says so")
        payment_id = uuid.UUID(reference)
        if self.payments[payment_id].key != CHARGED:
            return None
        return Charge(
            id=charge_ref(payment_id),
            reference=reference,
            amount=2500,
            currency="USD",
            status="succeeded",
        )


#: Each payment with everything the invariants look at, in one round trip.
ROWS_WITH_HISTORY = """
SELECT p.*,
       (SELECT coalesce(jsonb_object_agg(a.attempt, a.outcome), '{}') FROM attempts a
        WHERE a.payment_id = p.id) AS attempts,
       (SELECT coalesce(jsonb_agg(jsonb_build_array(e.type, e.status, e.attempt) ORDER BY e.id),
                        '[]')
        FROM payment_events e WHERE e.payment_id = p.id) AS events,
       (SELECT e.created_at FROM payment_events e
        WHERE e.payment_id = p.id AND e.type <> 'attempt.finished'
        ORDER BY e.id DESC LIMIT 1) AS last_change_at,
       EXISTS (SELECT FROM dead_letters d WHERE d.payment_id = p.id AND d.resolution IS NULL)
           AS dead_letter_open
FROM payments p WHERE p.id = ANY(%(ids)s) AND p.due_at = ANY(%(dues)s)
"""


# -- The machine ---------------------------------------------------------------------


class PaymentMachine(RuleBasedStateMachine):
    """The transitions against one database connection (and a pool for the
    executor's two calls), each step checked against the model."""

    def __init__(self, conn, pool, reached: Counter):
        super().__init__()
        self.reached = reached  # how often each branch worth reaching was reached
        self.conn = conn
        self.pool = pool
        self.payments: dict[uuid.UUID, Payment] = {}
        self.held: list[Held] = []
        self.seen: dict[uuid.UUID, tuple[Status, int]] = {}
        self.step = "init"

    def teardown(self):
        # The next sequence starts from an empty schedule: claim_due takes any due row.
        if self.payments:
            ids = list(self.payments)
            for table in ("attempts", "payment_events", "dead_letters"):
                self.conn.execute(f"DELETE FROM {table} WHERE payment_id = ANY(%s)", (ids,))
            self.conn.execute(
                "DELETE FROM payments WHERE id = ANY(%s) AND due_at = ANY(%s)",
                (ids, [p.due_at for p in self.payments.values()]),
            )

    def _keys(self) -> dict:
        return {"ids": list(self.payments), "dues": [p.due_at for p in self.payments.values()]}

    def _rows(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict]:
        keys = {"ids": ids, "dues": [self.payments[i].due_at for i in ids]}
        return {r["id"]: r for r in self.conn.execute(ROWS_WITH_HISTORY, keys)}

    @staticmethod
    def _decide(held: Held, result: CallResult):
        """The executor's decision, from the row its worker started with."""
        return decide(
            result,
            failures=held.row["failures"],
            in_doubt=held.row["in_doubt"],
            key_in_use=held.row["key_in_use"],
            config=CONFIG,
        )

    def _draw_call(self, data, payment: Payment) -> str:
        """One call's effect at the gateway; the key remembers a definitive one."""
        effect = data.draw(st.sampled_from(EFFECTS[payment.key]), label="effect")
        if effect != NOTHING:
            payment.key = effect
        return effect

    def _with_lookup(self, data, done: Finished) -> Finished:
        """The executor's lookup before parking a payment exhausted in doubt."""
        if not done.decision.needs_lookup:
            return done
        gateway = ModelGateway(self.payments, fails=data.draw(st.booleans(), label="lookup fails"))
        return look_up(gateway, done, now=database_now(self.conn))

    def _current(self, held: Held) -> bool:
        payment = self.payments[held.claim.payment_id]
        return payment.status is Status.PROCESSING and payment.attempt == held.claim.attempt

    def _holder(self, payment: Payment) -> Held:
        return next(
            h
            for h in self.held
            if h.claim.payment_id == payment.id and h.claim.attempt == payment.attempt
        )

    # -- rules ------------------------------------------------------------------------

    @initialize(due_now=st.lists(DUE_NOW, min_size=1, max_size=3))
    def create_some(self, due_now):
        for one in due_now:
            self.create(one)

    @precondition(
        lambda self: (
            sum(p.due_now and not p.status.terminal for p in self.payments.values()) < MAX_LIVE
        )
    )
    @rule(due_now=DUE_NOW)
    def create(self, due_now):
        self.step = "create"
        # Due a second ago (claimable now) or in an hour (cancellable, never claimed).
        offset = timedelta(seconds=-1) if due_now else timedelta(hours=1)
        row = insert_payment(self.conn, due_at=datetime.now(UTC) + offset)
        self.payments[row["id"]] = Payment(row["id"], row["due_at"], due_now)

    @precondition(lambda self: any(p.ready for p in self.payments.values()))
    @rule(limit=st.integers(min_value=1, max_value=3))
    def claim(self, limit):
        self.step = "claim"
        ready = {p.id for p in self.payments.values() if p.ready}
        maybe = {p.id for p in self.payments.values() if p.maybe_ready}
        claims = transitions.claim_due(self.conn, limit=limit, lease_seconds=LEASE_SECONDS)
        claimed = {c.payment_id for c in claims}
        # Which ones depends on run_at order (one payer: oldest first); how many does not.
        assert claimed <= maybe, (claims, maybe)
        assert min(limit, len(ready)) <= len(claims) <= min(limit, len(maybe)), (claims, ready)
        for c in claims:
            payment = self.payments[c.payment_id]
            assert c.attempt == payment.attempt + 1
            payment.attempt = c.attempt
            payment.lease_forced = payment.soon = False
            payment.changed(Status.PROCESSING)
            self.held.append(Held(c))

    @precondition(lambda self: any(h.row is None and self._current(h) for h in self.held))
    @rule(data=st.data())
    def start(self, data):
        """A message's claims started (also stale claims and duplicated messages)."""
        self.step = "start"
        fresh = [h for h in self.held if h.row is None and self._current(h)]
        group = data.draw(
            st.lists(one_or_any(fresh, self.held), min_size=1, max_size=2, unique_by=id),
            label="group",
        )
        fenced = [h for h in group if self._current(h)]
        expected = {h.claim.payment_id for h in fenced if h.row is None}
        rows = transitions.start(
            self.pool, [h.claim for h in group], lease_seconds=LEASE_SECONDS, worker="model"
        )
        assert {r["id"] for r in rows} == expected, (group, rows)
        for h in fenced:  # the fence renews the lease, also for a duplicate
            payment = self.payments[h.claim.payment_id]
            payment.lease_forced = False
            payment.changed_last = False
        for row in rows:
            held = next(h for h in fenced if h.claim.payment_id == row["id"])
            payment = self.payments[row["id"]]
            assert (row["attempt"], row["failures"], row["in_doubt"], row["key_in_use"]) == (
                payment.attempt,
                payment.failures,
                payment.in_doubt,
                payment.key_in_use,
            )
            held.row = row
            payment.attempts[row["attempt"]] = Outcome.IN_FLIGHT

    @precondition(
        lambda self: any(h.row and not h.finished and self._current(h) for h in self.held)
    )
    @rule(data=st.data())
    def finish(self, data):
        """The holders of current attempts call the gateway and record the outcomes."""
        self.step = "finish"
        holders = [h for h in self.held if h.row and not h.finished and self._current(h)]
        group = data.draw(
            st.lists(st.sampled_from(holders), min_size=1, max_size=2, unique_by=id),
            label="holders",
        )
        done = []
        for held in group:
            payment = self.payments[held.claim.payment_id]
            effect = self._draw_call(data, payment)
            answer = data.draw(st.sampled_from(ANSWERS[effect]), label="answer")
            result = call_result(answer, payment.id)
            done.append(
                self._with_lookup(data, Finished(held.row, result, self._decide(held, result)))
            )
        recorded = {r["id"]: r for r in transitions.finish(self.pool, done)}
        rows = self._rows([d.row["id"] for d in done])
        for held, item in zip(group, done, strict=True):
            payment, decision = self.payments[held.claim.payment_id], item.decision
            assert recorded[payment.id]["recorded"] and recorded[payment.id]["moved"]
            held.finished = True
            payment.attempts[held.claim.attempt] = item.result.outcome
            payment.failures, payment.in_doubt = decision.failures, decision.in_doubt
            payment.failure_reason = decision.failure_reason
            payment.key_in_use = decision.key_in_use
            if decision.status is Status.PENDING:
                # Back after exactly the decided delay (never before it is due).
                row = rows[payment.id]
                wait = timedelta(seconds=decision.delay)
                assert abs(
                    row["run_at"] - max(row["due_at"], row["updated_at"] + wait)
                ) <= timedelta(microseconds=1), (row, decision)
                payment.soon = 0 < decision.delay < SOON_SECONDS
                payment.waiting = decision.delay >= SOON_SECONDS
            payment.changed(decision.status)
            self.reached[f"finish: {item.result.outcome} -> {decision.status}"] += 1
            if decision.failure_reason is FailureReason.RETRIES_EXHAUSTED:
                payment.dead_letter_open = True
                self.reached["parked: retries exhausted"] += 1

    @precondition(lambda self: any(h.row and not h.finished and h.reaped for h in self.held))
    @rule(data=st.data())
    def zombie_finish(self, data):
        """A worker whose lease was reaped (and maybe re-claimed) finishes late."""
        self.step = "zombie_finish"
        zombies = [h for h in self.held if h.row and not h.finished and h.reaped]
        held = data.draw(st.sampled_from(zombies), label="zombie")
        payment = self.payments[held.claim.payment_id]
        answer = data.draw(st.sampled_from(ANSWERS[held.effect]), label="answer")
        result = call_result(answer, payment.id)
        done = self._with_lookup(data, Finished(held.row, result, self._decide(held, result)))
        [row] = transitions.finish(self.pool, [done])
        # The real outcome is kept on its own attempt row; the status is not its to move.
        assert row["recorded"] and not row["moved"], row
        self.reached["zombie finish"] += 1
        if payment.status is Status.PROCESSING:
            self.reached["zombie finish over a re-claim"] += 1
        held.finished = True
        payment.attempts[held.claim.attempt] = done.result.outcome
        payment.events.append((EventType.ATTEMPT_FINISHED, "UNCHANGED", held.claim.attempt))
        if (
            payment.status is Status.FAILED
            and payment.in_doubt
            and done.result.outcome is Outcome.SUCCEEDED
        ):
            # A late success completes a payment parked in doubt.
            payment.in_doubt, payment.failure_reason = False, None
            payment.dead_letter_open = False
            payment.changed(Status.COMPLETED)
            self.reached["zombie finish: late success completes"] += 1

    @precondition(
        lambda self: any(p.status is Status.PENDING and p.attempt for p in self.payments.values())
    )
    @rule(data=st.data(), actor=st.sampled_from(["alice"] * 7 + ["bob"]))
    def cancel(self, data, actor):
        """The payer cancels (now and then another payer tries: it does not exist for them).
        Mostly payments back at PENDING after a call: a fresh one is the plain case."""
        self.step = "cancel"
        retried = [p for p in self.payments.values() if p.status is Status.PENDING and p.attempt]
        payment = data.draw(one_or_any(retried, list(self.payments.values())), label="payment")
        expected = {
            Status.PENDING: CancelOutcome.OUTCOME_IN_DOUBT
            if payment.in_doubt
            else CancelOutcome.CANCELLED,
            Status.PROCESSING: CancelOutcome.ALREADY_PROCESSING,
            Status.COMPLETED: CancelOutcome.ALREADY_COMPLETED,
            Status.FAILED: CancelOutcome.ALREADY_FAILED,
            Status.CANCELLED: CancelOutcome.CANCELLED,
        }[payment.status]
        if actor != "alice":  # another payer's payment does not exist for them
            expected = CancelOutcome.NOT_FOUND
        assert cancel(self.conn, payment.id, actor=actor) is expected
        self.reached[f"cancel: {expected}"] += 1
        if expected is CancelOutcome.CANCELLED and payment.status is Status.PENDING:
            payment.changed(Status.CANCELLED)

    @precondition(
        lambda self: any(
            p.status is Status.PROCESSING and not p.lease_forced for p in self.payments.values()
        )
    )
    @rule(data=st.data())
    def expire_lease(self, data):
        """Time passes for one lease: moved into the past in SQL, no sleeping."""
        self.step = "expire_lease"
        live = [
            p
            for p in self.payments.values()
            if p.status is Status.PROCESSING and not p.lease_forced
        ]
        payment = data.draw(st.sampled_from(live), label="payment")
        self.conn.execute(
            "UPDATE payments SET lease_until = now() - interval '1 second' "
            "WHERE id = %s AND due_at = %s AND status = 'PROCESSING'",
            (payment.id, payment.due_at),
        )
        payment.lease_forced = True

    @precondition(
        lambda self: any(
            p.status is Status.PROCESSING and p.lease_forced for p in self.payments.values()
        )
    )
    @rule(data=st.data())
    def reap(self, data):
        self.step = "reap"
        rows = {r["id"]: r for r in reap(self.conn, CONFIG)}
        expired = [
            p for p in self.payments.values() if p.status is Status.PROCESSING and p.lease_forced
        ]
        assert set(rows) == {p.id for p in expired}, rows
        for payment in expired:
            holder = self._holder(payment)
            holder.reaped = True
            in_flight = holder.row is not None and not holder.finished
            if in_flight:
                payment.attempts[payment.attempt] = Outcome.LEASE_EXPIRED
                # The zombie's call has reached the gateway (or never will).
                holder.effect = self._draw_call(data, payment)
            payment.in_doubt = payment.in_doubt or in_flight
            # Only an expiry of a call in flight counts; the limit-th one is
            # looked up on its next claim, the one after parks (in doubt).
            payment.lease_expiries += in_flight
            if in_flight and payment.lease_expiries > CONFIG.max_lease_expiries:
                payment.failure_reason = FailureReason.LEASE_EXPIRED_REPEATEDLY
                payment.dead_letter_open = True
                payment.changed(Status.FAILED)
                self.reached["parked: lease expired repeatedly"] += 1
            else:
                payment.changed(Status.PENDING)
            assert rows[payment.id]["in_doubt"] == payment.in_doubt
            if in_flight:
                self.reached["reaped in flight: in doubt"] += 1

    @precondition(
        lambda self: any(
            (p.waiting or p.soon) and p.status is Status.PENDING for p in self.payments.values()
        )
    )
    @rule()
    def retry_time_passes(self):
        """Every backoff, 429 and 409 wait runs out (run_at moved back to due_at in SQL)."""
        self.step = "retry_time_passes"
        self.conn.execute(
            "UPDATE payments SET run_at = due_at WHERE id = ANY(%(ids)s) "
            "AND due_at = ANY(%(dues)s) AND status = 'PENDING'",
            self._keys(),
        )
        for payment in self.payments.values():
            payment.waiting = payment.soon = False

    def _complete(self, payment: Payment, outcome: Outcome) -> None:
        moved = transitions.complete_from_gateway(
            self.conn, payment.id, outcome=outcome, gateway_ref=charge_ref(payment.id), actor="ops"
        )
        assert moved == (payment.status in (Status.FAILED, Status.PENDING))
        if moved:
            self.reached["completed from the gateway"] += 1
            payment.attempt += 1
            payment.attempts[payment.attempt] = outcome
            payment.in_doubt, payment.failure_reason = False, None
            payment.dead_letter_open = False
            payment.changed(Status.COMPLETED)

    @precondition(lambda self: any(p.status is Status.FAILED for p in self.payments.values()))
    @rule(data=st.data())
    def redrive(self, data):
        """A human re-drive, as dead_letters.redrive does it: a lookup first."""
        payment = data.draw(st.sampled_from(list(self.payments.values())), label="payment")
        if payment.key == CHARGED:
            self.step = "complete"
            self._complete(payment, Outcome.FOUND_BY_LOOKUP)
            return
        self.step = "redrive"
        moved = transitions.redrive(self.conn, payment.id, actor="ops")
        assert moved == (payment.status is Status.FAILED and payment.failure_reason in PARKED)
        if moved:
            self.reached["re-driven"] += 1
            payment.failures = payment.lease_expiries = payment.key_in_use = 0
            payment.in_doubt, payment.failure_reason = False, None
            payment.waiting = payment.soon = payment.dead_letter_open = False
            payment.changed(Status.PENDING)

    @precondition(lambda self: any(p.key == CHARGED for p in self.payments.values()))
    @rule(data=st.data(), outcome=st.sampled_from([Outcome.FOUND_BY_LOOKUP, Outcome.RECONCILED]))
    def complete_from_gateway(self, data, outcome):
        """A lookup or the settlement report finds the charge."""
        self.step = "complete"
        charged = [p for p in self.payments.values() if p.key == CHARGED]
        self._complete(data.draw(st.sampled_from(charged), label="payment"), outcome)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def rows_match_the_model(self):
        """Every row equals its model, and the invariants hold, after every step."""
        if not self.payments:
            return
        rows = self._rows(list(self.payments))
        for pid, payment in self.payments.items():
            row = rows[pid]
            status = Status(row["status"])
            # The model's status (and counters) equal the row's.
            assert (
                status,
                row["attempt"],
                row["failures"],
                row["in_doubt"],
                row["failure_reason"],
                row["lease_expiries"],
                row["key_in_use"],
            ) == (
                payment.status,
                payment.attempt,
                payment.failures,
                payment.in_doubt,
                payment.failure_reason,
                payment.lease_expiries,
                payment.key_in_use,
            ), (pid, row)
            attempts = {int(n): o for n, o in row["attempts"].items()}
            assert attempts == payment.attempts, (pid, attempts)
            assert row["dead_letter_open"] == payment.dead_letter_open, pid
            # At most one live lease: a PROCESSING row has one, and only its
            # current attempt may have a call in flight.
            assert (status is Status.PROCESSING) == (row["lease_until"] is not None), row
            in_flight = [n for n, o in attempts.items() if o == Outcome.IN_FLIGHT]
            assert in_flight in ([], [row["attempt"]]), (pid, attempts)
            assert not in_flight or status is Status.PROCESSING, row
            # CANCELLED is never charged, and never was in doubt.
            if status is Status.CANCELLED:
                assert payment.key != CHARGED, pid
                assert not CHARGE_OUTCOMES & set(attempts.values()), attempts
                assert not row["in_doubt"], row
            # Every status change has its event, written in the same transaction
            # (now() is the transaction's start: the event's time is the row's).
            assert [tuple(e) for e in row["events"]] == payment.events, (pid, row["events"])
            if payment.changed_last:
                assert row["last_change_at"] == row["updated_at"], row
            # The attempt counter never decreases; terminal stays terminal but
            # for a re-drive and a charge found at the gateway.
            before, attempt_before = self.seen.get(pid, (Status.PENDING, 0))
            assert row["attempt"] >= attempt_before, (pid, attempt_before, row)
            if before.terminal and status is not before:
                assert REOPENINGS.get((before, status)) == self.step, (before, status, self.step)
            self.seen[pid] = (status, row["attempt"])


#: Branches every run must reach (each is reached dozens of times at these
#: settings): a run that never got there checked nothing about them.
MUST_REACH = {
    "zombie finish",
    "zombie finish over a re-claim",
    "reaped in flight: in doubt",
    "cancel: CANCELLED",
    "cancel: OUTCOME_IN_DOUBT",
    "finish: SUCCEEDED -> COMPLETED",
    "finish: DECLINED -> FAILED",
    "finish: RATE_LIMITED -> PENDING",
    "finish: KEY_IN_USE -> PENDING",
    "finish: NOT_SENT -> PENDING",
    "parked: retries exhausted",
    "parked: lease expired repeatedly",
    "completed from the gateway",
    "re-driven",
}


@pytest.fixture
def pool(database_url):
    with make_pool(Config(database_url=database_url), max_size=2, name="model") as p:
        yield p


@pytest.mark.timeout(900)  # a failure is shrunk against the database: up to ~5 minutes
def test_the_payment_state_machine_keeps_its_invariants(conn, pool):
    reached: Counter = Counter()
    run_state_machine_as_test(
        lambda: PaymentMachine(conn, pool, reached),
        settings=settings(
            max_examples=400,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    assert MUST_REACH <= set(reached), sorted(reached.items())
