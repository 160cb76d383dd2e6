"""A processor the tests drive by hand, that remembers what every idempotency
key holds: the truth the engine cannot see.

:class:`ModelProcessor` implements the engine's processor interface
(:class:`paycron.processors.base.Gateway`) for either processor's name
(``fake``: the card processor; ``stripe``). A charge does what the test
planned for it (:class:`Plan`): an *effect* at the processor (a charge, a
decline, a bank debit still processing, a stored error, or nothing) and a
*wire answer* the caller gets back, which the processor's own adapter
classifies (:func:`paycron.processors.card.client.classify` and
:func:`paycron.processors.stripe.client.classify_error` /
:func:`~paycron.processors.stripe.client.classify_intent`), so every
``CallResult`` is one the real adapter returns. A key answered once replays
its answer (until the processor forgets it after the key retention); a call
under a key another call still holds gets a 409; a call may *hang* (the
test lands its effect, and later its answer, whenever it likes: a zombie).

Lookups, retrieves, refunds and the settlement report answer from the ledger,
and the test can make any of them fail. Nothing here talks to a network: the
adapters' wire handling is tested against the real services elsewhere
(tests/processors); this is the model's ledger behind the same interface.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import urllib3

from paycron.domain.enums import Outcome
from paycron.domain.processing import (
    FAILED,
    PROCESSING,
    REFUNDED,
    SUCCEEDED,
    CallResult,
    Charge,
    ChargeRequest,
    LookupRequest,
    Refund,
)
from paycron.errors import GatewayError
from paycron.processors.card.client import classify as classify_card
from paycron.processors.stripe.client import classify_error, classify_intent

CARD, STRIPE = "fake", "stripe"
PROCESSORS = (CARD, STRIPE)

#: What a call can do at the processor.
CHARGE, DECLINE, DEBIT, STORED_ERROR, NOTHING = (
    "charge",
    "decline",
    "debit",
    "stored_5xx",
    "nothing",
)

#: Every wire answer of each processor, by the effect that allows it. The
#: answer names say what came over the wire; ``classify`` below turns each
#: into the CallResult the processor's adapter makes of it.
ANSWERS: dict[str, dict[str, tuple[str, ...]]] = {
    CARD: {
        CHARGE: ("200", "200_no_id", "500", "timeout"),
        DECLINE: ("402", "500", "timeout"),
        DEBIT: (),  # the card processor answers at once
        STORED_ERROR: ("500",),
        NOTHING: ("429", "429_retry_after", "409", "500", "400", "refused", "timeout"),
    },
    STRIPE: {
        CHARGE: ("200_succeeded", "200_no_id", "500", "timeout"),
        DECLINE: (
            "402_card_declined",
            "402_try_again_later",
            "402_authentication_required",
            "200_requires_action",
            "200_requires_payment_method",
            "500",
            "timeout",
        ),
        DEBIT: ("200_processing", "timeout"),
        STORED_ERROR: ("500",),
        NOTHING: (
            "429",
            "400_rate_limit",
            "409_key_in_use",
            "409_lock_timeout",
            "400_invalid",
            "404_no_code",
            "401",
            "not_sent",
            "500",
            "timeout",
        ),
    },
}
#: Answers about nothing the processor did at all: the key stays unused.
TRANSPORT = {"timeout", "refused", "not_sent", "500"}
#: An absurd answer: a bank debit accepted under an id longer than any column holds.
LONG_ID = "200_processing_long_id"


def _card_response(status: int, body: dict | None = None, headers: dict | None = None):
    return urllib3.HTTPResponse(
        body=json.dumps(body or {}).encode(), status=status, headers=headers or {}
    )


def classify(processor: str, answer: str, intent_id: str | None) -> CallResult:
    """The CallResult the processor's adapter makes of ``answer``."""
    if answer == "timeout":  # sent, no answer: both adapters say the same
        return CallResult(Outcome.AMBIGUOUS, error_code="ReadTimeoutError", in_doubt=True)
    if processor == CARD:
        if answer == "refused":
            return CallResult(Outcome.RETRYABLE_ERROR, error_code="NewConnectionError")
        status, _, rest = answer.partition("_")
        if status == "200":
            body = {} if rest == "no_id" else {"id": intent_id, "status": "succeeded"}
            return classify_card(_card_response(200, body))
        if status == "402":
            return classify_card(_card_response(402, {"error": {"code": "card_declined"}}))
        if status == "429":
            headers = {"Retry-After": "120"} if rest == "retry_after" else {}
            return classify_card(_card_response(429, headers=headers))
        if status == "500" and rest == "replayed":
            return classify_card(_card_response(500, headers={"Idempotent-Replayed": "true"}))
        return classify_card(_card_response(int(status)))
    if answer == "not_sent":
        return CallResult(Outcome.RETRYABLE_ERROR, error_code="NewConnectionError")
    intent = {"id": intent_id, "object": "payment_intent"}
    errors = {
        "402_card_declined": (402, {"type": "card_error", "code": "card_declined"}),
        "402_try_again_later": (
            402,
            {"type": "card_error", "code": "card_declined", "decline_code": "try_again_later"},
        ),
        "402_authentication_required": (
            402,
            {"type": "card_error", "code": "authentication_required"},
        ),
        "429": (429, {"type": "invalid_request_error", "code": "rate_limit"}),
        "400_rate_limit": (400, {"type": "invalid_request_error", "code": "rate_limit"}),
        "409_key_in_use": (
            409,
            {"type": "invalid_request_error", "code": "idempotency_key_in_use"},
        ),
        "409_lock_timeout": (409, {"type": "invalid_request_error", "code": "lock_timeout"}),
        "400_invalid": (400, {"type": "invalid_request_error", "code": "parameter_invalid"}),
        "404_no_code": (404, {"type": "invalid_request_error"}),
        "401": (401, {"type": "invalid_request_error"}),
        "500": (500, {"type": "api_error"}),
        "500_replayed": (500, {"type": "api_error"}),
    }
    if answer in errors:
        status, error = errors[answer]
        if answer.startswith("402"):
            error = {**error, "payment_intent": intent}
        headers = {"Idempotent-Replayed": "true"} if answer == "500_replayed" else {}
        return classify_error(status, error, headers)
    statuses = {
        "200_succeeded": "succeeded",
        LONG_ID: "processing",
        "200_processing": "processing",
        "200_requires_action": "requires_action",
        "200_requires_payment_method": "requires_payment_method",
    }
    if answer == "200_no_id":
        return classify_intent({"status": "succeeded"})
    return classify_intent({**intent, "status": statuses[answer]})


@dataclass
class Intent:
    """One processor-side payment."""

    id: str
    key: str
    reference: str
    amount: int
    currency: str
    status: str
    created: float  # model time
    charged: bool = False  # money moved at some time (also since refunded)

    def as_charge(self) -> Charge:
        return Charge(
            id=self.id,
            reference=self.reference,
            amount=self.amount,
            currency=self.currency,
            status=self.status,
            idempotency_key=self.key,
            created_at=datetime.now(UTC),
        )


@dataclass
class KeyEntry:
    """What a key holds: the intent it made and the answer it replays."""

    intent: str | None
    answer: str
    created: float


@dataclass
class Plan:
    """What one charge call does: ``effect`` at the processor and ``answer``
    back. A hanging plan blocks the caller until :meth:`ModelProcessor.land`
    and :meth:`ModelProcessor.answer` (a zombie's call)."""

    effect: str
    answer: str
    hang: bool = False
    # -- filled in as the call runs
    request: ChargeRequest | None = None
    landed: bool = False
    result: CallResult | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    started: float = 0.0  # model time the call was sent
    intent: str | None = None  # the processor-side payment it made or used


class ModelProcessor:
    """One processor's ledger behind the engine's processor interface."""

    def __init__(self, name: str, clock, *, retention_seconds: float, long_ids: bool = False):
        self.name = name
        self.clock = clock  # model time (seconds)
        self.retention_seconds = retention_seconds
        self.long_ids = long_ids
        self.intents: dict[str, Intent] = {}
        self.keys: dict[str, KeyEntry] = {}
        self.busy: set[str] = set()
        self.plans: dict[str, deque[Plan]] = defaultdict(deque)
        #: Where a call's plan comes from when none was queued for its payment.
        self.next_plan: Callable[[str], Plan] | None = None
        self.fail_lookups = False
        self.fail_refunds = False
        self.asked: set[str] = set()  # references looked up (cleared by the test)
        self.calls = 0
        self.reached: set[str] = set()  # (effect, answer) labels reached
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def close(self) -> None:
        pass

    # -- the ledger

    def charged(self, reference: str) -> list[Intent]:
        return [i for i in self.intents.values() if i.reference == reference and i.charged]

    def holds(self, reference: str, *statuses: str) -> list[Intent]:
        return [
            i for i in self.intents.values() if i.reference == reference and i.status in statuses
        ]

    def forget_old_keys(self) -> None:
        """The processor keeps a key for the retention, then forgets it."""
        now = self.clock()
        for key, entry in list(self.keys.items()):
            if now - entry.created >= self.retention_seconds:
                del self.keys[key]

    def _new_id(self) -> str:
        n = next(self._ids)
        prefix = "pi" if self.name == STRIPE else "ch"
        return f"{prefix}_{self.name}_{n:06d}"

    def settle(self, intent_id: str, status: str) -> None:
        """A bank debit settles at the processor (succeeded or failed)."""
        intent = self.intents[intent_id]
        assert intent.status == PROCESSING
        intent.status = status
        intent.charged = status == SUCCEEDED

    # -- the interface

    def charge(self, request: ChargeRequest, *, timeout: float | None = None) -> CallResult:
        with self._lock:
            self.calls += 1
            queued = self.plans[request.reference]
            plan = queued.popleft() if queued or self.next_plan is None else None
            plan = plan or self.next_plan(request.reference)
            plan.request, plan.started = request, self.clock()
            if request.idempotency_key in self.busy:
                # Another call holds the key right now: both processors say 409.
                plan.effect = NOTHING
                plan.answer = "409" if self.name == CARD else "409_key_in_use"
                plan.hang = False
            if not plan.hang:
                self._land(plan)
                return self._answer(plan)
            self.busy.add(request.idempotency_key)
        plan.entered.set()
        # Only the model ends a hang (the call's answer, or the sequence's
        # teardown), never the wall clock: a bound here let a slow run answer
        # the call by itself mid-sequence, so the same choices met another
        # database and Hypothesis saw the draws change
        # (FlakyStrategyDefinition). A model that forgets to release a hung
        # call hangs its test until the test's timeout.
        plan.released.wait()
        with self._lock:
            self.busy.discard(request.idempotency_key)
            if not plan.landed:
                self._land(plan)
            return self._answer(plan)

    def land(self, plan: Plan) -> None:
        """A hung call's effect happens at the processor now (its answer is still to come)."""
        with self._lock:
            if not plan.landed:
                self._land(plan)

    def release(self, plan: Plan) -> None:
        plan.released.set()

    def _land(self, plan: Plan) -> None:
        """Apply ``plan``'s effect to the ledger and fix its answer."""
        request = plan.request
        plan.landed = True
        self.forget_old_keys()
        entry = self.keys.get(request.idempotency_key)
        if entry is not None and plan.answer not in ("409", "409_key_in_use"):
            # The key was answered before: the processor replays that answer
            # (a transport failure still hides it).
            plan.effect = "replay"
            if plan.answer not in TRANSPORT:
                plan.answer = entry.answer
            self.reached.add(f"{self.name}: replay {plan.answer}")
            return
        confirming = plan.effect in (CHARGE, DECLINE, DEBIT)
        if request.confirm and confirming and request.confirm in self.intents:
            intent = self.intents[request.confirm]
            # A retried decline confirms the same intent again: it succeeds at most once.
            if intent.status == FAILED and plan.effect == CHARGE:
                intent.status, intent.charged = SUCCEEDED, True
            elif intent.status == FAILED and plan.effect == DEBIT:
                intent.status = PROCESSING
            stored = plan.answer if plan.answer not in TRANSPORT else self._definitive(plan.effect)
            self.keys[request.idempotency_key] = KeyEntry(intent.id, stored, self.clock())
            plan.intent = intent.id
            self.reached.add(f"{self.name}: confirm {plan.effect} {plan.answer}")
            return
        plan.intent = None
        if plan.effect in (CHARGE, DECLINE, DEBIT):
            status = {CHARGE: SUCCEEDED, DECLINE: FAILED, DEBIT: PROCESSING}[plan.effect]
            intent_id = self._new_id()
            if plan.answer.endswith("long_id"):
                intent_id = intent_id + "_" + "x" * 300
            self.intents[intent_id] = Intent(
                intent_id,
                request.idempotency_key,
                request.reference,
                request.amount,
                request.currency.upper(),
                status,
                self.clock(),
                charged=status == SUCCEEDED,
            )
            plan.intent = intent_id
            stored = plan.answer if plan.answer not in TRANSPORT else self._definitive(plan.effect)
            self.keys[request.idempotency_key] = KeyEntry(intent_id, stored, self.clock())
        elif plan.effect == STORED_ERROR:
            self.keys[request.idempotency_key] = KeyEntry(None, "500_replayed", self.clock())
        self.reached.add(f"{self.name}: {plan.effect} {plan.answer}")

    def _definitive(self, effect: str) -> str:
        """The answer a key replays for an effect whose first answer was lost."""
        if self.name == CARD:
            return {CHARGE: "200", DECLINE: "402"}[effect]
        return {CHARGE: "200_succeeded", DECLINE: "402_card_declined", DEBIT: "200_processing"}[
            effect
        ]

    def _answer(self, plan: Plan) -> CallResult:
        intent_id = plan.intent
        if plan.effect == "replay":
            entry = self.keys.get(plan.request.idempotency_key)
            intent_id = entry.intent if entry else None
        plan.result = classify(self.name, plan.answer, intent_id)
        return plan.result

    def find_charges(self, request: LookupRequest) -> list[Charge]:
        self.asked.add(request.reference)
        if self.fail_lookups:
            raise GatewayError("the model's processor is unreachable")
        return [i.as_charge() for i in self.intents.values() if i.reference == request.reference]

    def retrieve(self, charge_id: str) -> Charge:
        if self.fail_lookups:
            raise GatewayError("the model's processor is unreachable")
        if charge_id not in self.intents:
            raise GatewayError(f"no such payment at {self.name}: {charge_id}")
        return self.intents[charge_id].as_charge()

    def refund(self, charge: Charge) -> Refund:
        if self.fail_refunds:
            raise GatewayError("the model's processor is unreachable")
        intent = self.intents.get(charge.id)
        if intent is None:
            raise GatewayError(f"no such charge at {self.name}: {charge.id}")
        if intent.status == SUCCEEDED:
            intent.status = REFUNDED
        return Refund(
            id=f"re_{charge.id}", amount=intent.amount, idempotency_key=f"refund:{charge.id}"
        )

    def settlement_report(self, day: date) -> list[Charge]:
        if self.fail_lookups:
            raise GatewayError("the model's processor is unreachable")
        return [i.as_charge() for i in self.intents.values()]
