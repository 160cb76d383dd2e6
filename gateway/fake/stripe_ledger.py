"""The Stripe surface's ledger: intents, charges, refunds and events, and every
change to them.

Each change is one method here, which updates the objects in place, counts
itself and queues the events Stripe would send (`drain_events`). Listing is
newest first with Stripe's cursors over collections kept in creation order;
the search index is a history of snapshots, so a search sees each intent as
it was `lag` seconds ago. Nothing here knows HTTP.

Memory stays bounded by what the objects need: an intent's history holds
copies (shallow: objects change only by replacing top-level values) only of
versions a search can still see, so an intent unchanged for longer than the
lag costs none; the event log keeps the last `EVENTS_KEPT` events (Stripe
keeps 30 days of them).
"""

from __future__ import annotations

import dataclasses
import time
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from typing import Any

from gateway.fake import stripe_objects as objects
from gateway.fake.stripe_methods import (
    AUTHENTICATION_REQUIRED,
    GENERIC_DECLINE,
    Decline,
    Effect,
    MethodSpec,
)
from gateway.fake.stripe_objects import StripeObject
from gateway.fake.stripe_payment_methods import PaymentMethods

#: The metadata key the engine stores its payment id under (shown in `/_ledger`).
PAYMENT_ID_KEY = "paycron_payment_id"
#: The Stripe-Version events carry until a request names one.
DEFAULT_API_VERSION = "2026-10-28.endive"
#: Events `GET /v1/events` can still list: a run of 100,000 payments makes
#: 300,000, which would dwarf the ledger itself.
EVENTS_KEPT = 20_000


class Collection:
    """Objects of one kind in creation order, with an index per named field."""

    def __init__(self, *indexed: str) -> None:
        self._items: list[StripeObject | None] = []  # None: dropped (`drop_oldest`)
        self._start = 0  # the first position not dropped
        self._position: dict[str, int] = {}
        self._indexes: dict[str, defaultdict[Any, list[int]]] = {
            name: defaultdict(list) for name in indexed
        }

    def add(self, obj: StripeObject) -> None:
        position = len(self._items)
        self._position[obj["id"]] = position
        self._items.append(obj)
        for name, index in self._indexes.items():
            if obj.get(name) is not None:
                index[obj[name]].append(position)

    def get(self, object_id: str) -> StripeObject | None:
        position = self._position.get(object_id)
        return None if position is None else self._items[position]

    def __iter__(self) -> Iterator[StripeObject]:
        return (obj for obj in self._items[self._start :] if obj is not None)

    def __len__(self) -> int:
        return len(self._items) - self._start

    def newest_first(self) -> Iterator[StripeObject]:
        return (obj for obj in reversed(self._items[self._start :]) if obj is not None)

    def drop_oldest(self, keep: int) -> None:
        """Forget all but the newest `keep` objects (their positions stay taken)."""
        while len(self) > keep:
            obj = self._items[self._start]
            assert obj is not None
            del self._position[obj["id"]]
            self._items[self._start] = None
            self._start += 1

    def page(
        self,
        *,
        limit: int,
        starting_after: str | None = None,
        ending_before: str | None = None,
        where: dict[str, Any] | None = None,
        created: dict[str, int] | None = None,
    ) -> tuple[list[StripeObject], bool]:
        """One page, newest first: the objects matching `where` (field equality) and
        `created` (``gt``/``gte``/``lt``/``lte``), after or before a cursor's id
        (which must exist); and whether more lie beyond it."""
        where, created = where or {}, created or {}
        positions = self._candidates(where)

        def matches(obj: StripeObject) -> bool:
            return all(obj.get(name) == value for name, value in where.items()) and in_range(
                obj["created"], created
            )

        found: list[StripeObject] = []
        if ending_before is not None:  # the page just newer than the cursor
            start = bisect_right(positions, self._position[ending_before])
            for position in positions[start:]:
                obj = self._items[position]
                if obj is not None and matches(obj):
                    found.append(obj)
                    if len(found) > limit:
                        break
            return found[:limit][::-1], len(found) > limit
        stop = len(positions)
        if starting_after is not None:
            stop = bisect_left(positions, self._position[starting_after])
        floor = created.get("gte", created.get("gt"))
        for index in range(stop - 1, -1, -1):
            obj = self._items[positions[index]]
            if obj is None:
                break  # dropped, and so is everything older
            if floor is not None and obj["created"] < floor:
                break  # creation times never decrease along the collection
            if matches(obj):
                found.append(obj)
                if len(found) > limit:
                    break
        return found[:limit], len(found) > limit

    def _candidates(self, where: dict[str, Any]) -> Sequence[int]:
        """The positions worth looking at: an index's list if a filter has one."""
        for name, value in where.items():
            if name in self._indexes:
                return self._indexes[name].get(value, [])
        return range(len(self._items))


def in_range(value: int, bounds: dict[str, int]) -> bool:
    """Whether `value` lies within Stripe range filter `bounds`."""
    return (
        ("gt" not in bounds or value > bounds["gt"])
        and ("gte" not in bounds or value >= bounds["gte"])
        and ("lt" not in bounds or value < bounds["lt"])
        and ("lte" not in bounds or value <= bounds["lte"])
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    """The API request a change came from (None for settlements), as events name it."""

    request_id: str | None = None
    idempotency_key: str | None = None
    api_version: str | None = None


AUTOMATIC = Origin()


@dataclasses.dataclass(slots=True)
class Attempt:
    """A confirmation's answer: the HTTP status and body, and whether it waits to settle."""

    status: int
    body: StripeObject
    processing: bool = False


class StripeLedger:
    """Every Stripe object the surface made, and what became of it."""

    def __init__(self, stats: dict[str, int] | None = None) -> None:
        self.stats = stats if stats is not None else defaultdict(int)
        self.intents = Collection("customer")
        self.charges = Collection("customer", "payment_intent")
        self.refunds = Collection("payment_intent", "charge")
        self.events = Collection("type")
        self.payment_methods = PaymentMethods(self.now)
        self.api_version = DEFAULT_API_VERSION
        #: How far the search index lags (the surface's setting; prunes the history).
        self.search_lag_seconds = 60.0
        self._outbox: list[StripeObject] = []
        self._last_created = 0
        self._method_of: dict[str, str] = {}  # intent id -> the method last confirmed with
        self._key_of: dict[str, str | None] = {}  # intent id -> the key that created it
        self._declined_once: set[str] = set()  # intents a once-only decline has hit
        #: Each intent's versions, oldest first: (when, a copy), the last (when, None)
        #: standing for the intent as it is now.
        self._history: dict[str, list[tuple[float, StripeObject | None]]] = {}
        self._copies: deque[tuple[float, str]] = deque()  # (changed at, intent id)

    def now(self) -> int:
        """Unix seconds, never less than the last creation time (lists rely on it)."""
        self._last_created = max(self._last_created, int(time.time()))
        return self._last_created

    # ---- payment intents

    def create_intent(self, origin: Origin, **fields: Any) -> StripeObject:
        """A new intent (`stripe_objects.payment_intent`'s fields), not yet confirmed."""
        intent = objects.payment_intent(created=self.now(), **fields)
        self.intents.add(intent)
        self._key_of[intent["id"]] = origin.idempotency_key
        self._history[intent["id"]] = [(time.monotonic(), None)]
        self._forget_hidden_versions(time.monotonic())
        self._emit("payment_intent.created", intent, origin)
        return intent

    def confirm(
        self,
        intent: StripeObject,
        method_id: str,
        method: MethodSpec,
        origin: Origin,
        *,
        off_session: bool,
        declined: bool = False,
        advice_code: str | None = None,
    ) -> Attempt:
        """Confirm `intent` with a payment method whose charge reached the network;
        `declined`: the faults declined it whatever the method."""
        self._method_of[intent["id"]] = method_id
        effect, decline = method.effect, method.decline
        if declined:
            effect, decline = Effect.DECLINE, GENERIC_DECLINE
        elif method.once and intent["id"] in self._declined_once:
            effect = Effect.SUCCEED
        if effect is Effect.AUTHENTICATE and not off_session:
            self._change(
                intent,
                {
                    "payment_method": method_id,
                    "status": "requires_action",
                    "next_action": {"type": "use_stripe_sdk"},
                },
                "payment_intent.requires_action",
                origin,
            )
            return Attempt(200, intent)
        charge = objects.charge(intent, method_id, method.charge_prefix, self.now())
        self.charges.add(charge)
        attempted = {
            "payment_method": method_id,
            "latest_charge": charge["id"],
            "next_action": None,
        }
        if effect is Effect.SUCCEED:
            self._succeed(intent, charge, origin, attempted)
            return Attempt(200, intent)
        if effect is Effect.PROCESS:
            self._change(
                intent,
                {**attempted, "status": "processing"},
                "payment_intent.processing",
                origin,
                charge,
                "charge.pending",
            )
            return Attempt(200, intent, processing=True)
        if method.once:
            self._declined_once.add(intent["id"])
        error = self._fail(
            intent,
            charge,
            decline or AUTHENTICATION_REQUIRED,
            method.type,
            advice_code,
            origin,
            attempted,
            counted=declined,
        )
        return Attempt(402, {"error": {**error, "payment_intent": dict(intent)}})

    def settle(self, intent: StripeObject, method: MethodSpec) -> None:
        """A processing bank debit ends: succeeded, or failed (`method.settles`)."""
        charge = self.charges.get(intent["latest_charge"])
        assert charge is not None and intent["status"] == "processing"
        self.stats["settled"] += 1
        if method.settles:
            self._succeed(intent, charge, AUTOMATIC)
        else:
            assert method.decline is not None
            self._fail(intent, charge, method.decline, method.type, None, AUTOMATIC)

    def cancel(self, intent: StripeObject, reason: str | None, origin: Origin) -> None:
        self._change(
            intent,
            {
                "status": "canceled",
                "canceled_at": self.now(),
                "cancellation_reason": reason,
                "next_action": None,
            },
            "payment_intent.canceled",
            origin,
        )

    def _succeed(
        self,
        intent: StripeObject,
        charge: StripeObject,
        origin: Origin,
        changes: dict[str, Any] | None = None,
    ) -> None:
        objects.succeed_charge(charge)
        self.stats["charges"] += 1
        self._change(
            intent,
            {
                **(changes or {}),
                "status": "succeeded",
                "amount_received": intent["amount"],
                "last_payment_error": None,
            },
            "payment_intent.succeeded",
            origin,
            charge,
            "charge.succeeded",
        )

    def _fail(
        self,
        intent: StripeObject,
        charge: StripeObject,
        decline: Decline,
        method_type: str,
        advice_code: str | None,
        origin: Origin,
        changes: dict[str, Any] | None = None,
        *,
        counted: bool = False,
    ) -> StripeObject:
        """Decline the charge; the intent waits for another payment method (Stripe
        clears `payment_method`: a new confirmation names one again). `counted`:
        the faults' decline was counted already."""
        objects.fail_charge(charge, decline)
        error = objects.payment_error(
            decline, charge["id"], charge["payment_method"], method_type, advice_code
        )
        if not counted:
            self.stats["declined"] += 1
        self._change(
            intent,
            {
                **(changes or {}),
                "status": "requires_payment_method",
                "payment_method": None,
                "last_payment_error": error,
            },
            "payment_intent.payment_failed",
            origin,
            charge,
            "charge.failed",
        )
        return error

    # ---- refunds

    def refund(
        self,
        charge: StripeObject,
        amount: int,
        reason: str | None,
        metadata: dict[str, str],
        origin: Origin,
    ) -> StripeObject:
        refund = objects.refund(charge, amount, reason, metadata, self.now())
        self.refunds.add(refund)
        charge["amount_refunded"] += amount
        charge["refunded"] = charge["amount_refunded"] == charge["amount"]
        self.stats["refunds"] += 1
        self._emit("charge.refunded", charge, origin)
        self._emit("refund.created", refund, origin)
        return refund

    # ---- events and search

    def _change(
        self,
        intent: StripeObject,
        changes: dict[str, Any],
        event_type: str,
        origin: Origin,
        charge: StripeObject | None = None,
        charge_event: str | None = None,
    ) -> None:
        """Change `intent` (every change of an intent comes through here), keep what
        the search index still shows of it, and emit the events of the change."""
        now = time.monotonic()
        history = self._history[intent["id"]]
        moment, snapshot = history[-1]
        if snapshot is None:  # the version that was live: keep a copy before it changes
            history[-1] = (moment, dict(intent))
        intent.update(changes)
        history.append((now, None))
        self._copies.append((now, intent["id"]))
        self._forget_hidden_versions(now)
        if charge is not None and charge_event is not None:
            self._emit(charge_event, charge, origin)
        self._emit(event_type, intent, origin)

    def _forget_hidden_versions(self, now: float) -> None:
        """Drop the versions no search can see any more: all before the newest one
        older than the lag (the queue holds intents whose history has copies)."""
        horizon = now - self.search_lag_seconds
        while self._copies and self._copies[0][0] <= horizon:
            _, intent_id = self._copies.popleft()
            history = self._history[intent_id]
            while len(history) > 1 and history[1][0] <= horizon:
                del history[0]

    def _emit(self, event_type: str, obj: StripeObject, origin: Origin) -> None:
        event = objects.event(
            event_type,
            obj,
            created=self.now(),
            api_version=origin.api_version or self.api_version,
            request_id=origin.request_id,
            idempotency_key=origin.idempotency_key,
        )
        self.events.add(event)
        self.events.drop_oldest(EVENTS_KEPT)
        self._outbox.append(event)
        self.stats["events"] += 1

    def drain_events(self) -> list[StripeObject]:
        """The events made since the last call, oldest first, to deliver."""
        events, self._outbox = self._outbox, []
        return events

    def searchable(self) -> Iterator[StripeObject]:
        """Each intent as the search index sees it, newest first: as it was
        `search_lag_seconds` ago, or not at all if it is younger than that."""
        horizon = time.monotonic() - self.search_lag_seconds
        for intent in self.intents.newest_first():
            for moment, snapshot in reversed(self._history[intent["id"]]):
                if moment <= horizon:
                    yield intent if snapshot is None else snapshot
                    break

    def method_of(self, intent_id: str) -> str | None:
        return self._method_of.get(intent_id)

    # ---- the oracle

    def entries(self) -> dict[str, list[dict[str, Any]]]:
        """Every intent, charge and refund, oldest first (the `/_ledger` Stripe section)."""
        return {
            "payment_intents": [
                {
                    "id": intent["id"],
                    "status": intent["status"],
                    "amount": intent["amount"],
                    "currency": intent["currency"],
                    "customer": intent["customer"],
                    "payment_method": self._method_of.get(intent["id"], intent["payment_method"]),
                    "paycron_payment_id": intent["metadata"].get(PAYMENT_ID_KEY),
                    "metadata": intent["metadata"],
                    "latest_charge": intent["latest_charge"],
                    "idempotency_key": self._key_of.get(intent["id"]),
                    "created": intent["created"],
                }
                for intent in self.intents
            ],
            "charges": [
                {
                    "id": charge["id"],
                    "payment_intent": charge["payment_intent"],
                    "status": charge["status"],
                    "amount": charge["amount"],
                    "currency": charge["currency"],
                    "customer": charge["customer"],
                    "payment_method": charge["payment_method"],
                    "paycron_payment_id": charge["metadata"].get(PAYMENT_ID_KEY),
                    "refunded": charge["refunded"],
                    "amount_refunded": charge["amount_refunded"],
                    "created": charge["created"],
                }
                for charge in self.charges
            ],
            "refunds": [
                {
                    "id": refund["id"],
                    "charge": refund["charge"],
                    "payment_intent": refund["payment_intent"],
                    "amount": refund["amount"],
                    "status": refund["status"],
                    "created": refund["created"],
                }
                for refund in self.refunds
            ],
        }
