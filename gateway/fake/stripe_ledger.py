"""The Stripe surface's ledger: intents, charges, refunds and events, and every
change to them.

Each change is one method here, which updates the objects in place, counts
itself and queues the events Stripe would send (`drain_events`). Listing is
newest first with Stripe's cursors over collections kept in creation order;
the search index is a history of snapshots, so a search sees each intent as
it was `lag` seconds ago. Nothing here knows HTTP.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from bisect import bisect_left, bisect_right
from collections import defaultdict
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

#: The metadata key the engine stores its payment id under (shown in `/_ledger`).
PAYMENT_ID_KEY = "paycron_payment_id"
#: The Stripe-Version events carry until a request names one.
DEFAULT_API_VERSION = "2026-10-28.endive"


class Collection:
    """Objects of one kind in creation order, with an index per named field."""

    def __init__(self, *indexed: str) -> None:
        self._items: list[StripeObject] = []
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
        return iter(self._items)

    def newest_first(self) -> Iterator[StripeObject]:
        return reversed(self._items)

    def page(
        self, *, limit: int, starting_after: str | None = None, ending_before: str | None = None,
        where: dict[str, Any] | None = None, created: dict[str, int] | None = None,
    ) -> tuple[list[StripeObject], bool]:
        """One page, newest first: the objects matching `where` (field equality) and
        `created` (``gt``/``gte``/``lt``/``lte``), after or before a cursor's id
        (which must exist); and whether more lie beyond it."""
        where, created = where or {}, created or {}
        positions = self._candidates(where)

        def matches(obj: StripeObject) -> bool:
            return (all(obj.get(name) == value for name, value in where.items())
                    and in_range(obj["created"], created))

        found: list[StripeObject] = []
        if ending_before is not None:  # the page just newer than the cursor
            start = bisect_right(positions, self._position[ending_before])
            for position in positions[start:]:
                obj = self._items[position]
                if matches(obj):
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
    return (("gt" not in bounds or value > bounds["gt"])
            and ("gte" not in bounds or value >= bounds["gte"])
            and ("lt" not in bounds or value < bounds["lt"])
            and ("lte" not in bounds or value <= bounds["lte"]))


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
        self.api_version = DEFAULT_API_VERSION
        self._outbox: list[StripeObject] = []
        self._last_created = 0
        self._method_of: dict[str, str] = {}  # intent id -> the method last confirmed with
        self._key_of: dict[str, str | None] = {}  # intent id -> the key that created it
        self._declined_once: set[str] = set()  # intents a once-only decline has hit
        self._history: dict[str, list[tuple[float, StripeObject]]] = {}

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
        self._changed(intent, "payment_intent.created", origin)
        return intent

    def confirm(
        self, intent: StripeObject, method_id: str, method: MethodSpec, origin: Origin, *,
        off_session: bool, declined: bool = False, advice_code: str | None = None,
    ) -> Attempt:
        """Confirm `intent` with a payment method whose charge reached the network;
        `declined`: the faults declined it whatever the method."""
        intent["payment_method"] = method_id
        self._method_of[intent["id"]] = method_id
        effect, decline = method.effect, method.decline
        if declined:
            effect, decline = Effect.DECLINE, GENERIC_DECLINE
        elif method.once and intent["id"] in self._declined_once:
            effect = Effect.SUCCEED
        if effect is Effect.AUTHENTICATE and not off_session:
            intent.update(status="requires_action", next_action={"type": "use_stripe_sdk"})
            self._changed(intent, "payment_intent.requires_action", origin)
            return Attempt(200, intent)
        charge = objects.charge(intent, method_id, method.charge_prefix, self.now())
        self.charges.add(charge)
        intent.update(latest_charge=charge["id"], next_action=None)
        if effect is Effect.SUCCEED:
            self._succeed(intent, charge, origin)
            return Attempt(200, intent)
        if effect is Effect.PROCESS:
            intent["status"] = "processing"
            self._changed(intent, "payment_intent.processing", origin, charge, "charge.pending")
            return Attempt(200, intent, processing=True)
        if method.once:
            self._declined_once.add(intent["id"])
        error = self._fail(intent, charge, decline or AUTHENTICATION_REQUIRED, method.type,
                           advice_code, origin, counted=declined)
        return Attempt(402, {"error": {**error, "payment_intent": copy.deepcopy(intent)}})

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
        intent.update(status="canceled", canceled_at=self.now(), cancellation_reason=reason,
                      next_action=None)
        self._changed(intent, "payment_intent.canceled", origin)

    def _succeed(self, intent: StripeObject, charge: StripeObject, origin: Origin) -> None:
        objects.succeed_charge(charge)
        intent.update(status="succeeded", amount_received=intent["amount"],
                      last_payment_error=None)
        self.stats["charges"] += 1
        self._changed(intent, "payment_intent.succeeded", origin, charge, "charge.succeeded")

    def _fail(self, intent: StripeObject, charge: StripeObject, decline: Decline,
              method_type: str, advice_code: str | None, origin: Origin,
              *, counted: bool = False) -> StripeObject:
        """Decline the charge; the intent waits for another payment method (Stripe
        clears `payment_method`: a new confirmation names one again). `counted`:
        the faults' decline was counted already."""
        objects.fail_charge(charge, decline)
        error = objects.payment_error(decline, charge["id"], charge["payment_method"],
                                      method_type, advice_code)
        intent.update(status="requires_payment_method", payment_method=None,
                      last_payment_error=error)
        if not counted:
            self.stats["declined"] += 1
        self._changed(intent, "payment_intent.payment_failed", origin, charge, "charge.failed")
        return error

    # ---- refunds

    def refund(self, charge: StripeObject, amount: int, reason: str | None,
               metadata: dict[str, str], origin: Origin) -> StripeObject:
        refund = objects.refund(charge, amount, reason, metadata, self.now())
        self.refunds.add(refund)
        charge["amount_refunded"] += amount
        charge["refunded"] = charge["amount_refunded"] == charge["amount"]
        self.stats["refunds"] += 1
        self._emit("charge.refunded", charge, origin)
        self._emit("refund.created", refund, origin)
        return refund

    # ---- events and search

    def _changed(self, intent: StripeObject, event_type: str, origin: Origin,
                 charge: StripeObject | None = None, charge_event: str | None = None) -> None:
        """Record a change of `intent` (and of its charge) for search and for events."""
        self._history.setdefault(intent["id"], []).append(
            (time.monotonic(), copy.deepcopy(intent))
        )
        if charge is not None and charge_event is not None:
            self._emit(charge_event, charge, origin)
        self._emit(event_type, intent, origin)

    def _emit(self, event_type: str, obj: StripeObject, origin: Origin) -> None:
        event = objects.event(
            event_type, obj, created=self.now(),
            api_version=origin.api_version or self.api_version,
            request_id=origin.request_id, idempotency_key=origin.idempotency_key,
        )
        self.events.add(event)
        self._outbox.append(event)
        self.stats["events"] += 1

    def drain_events(self) -> list[StripeObject]:
        """The events made since the last call, oldest first, to deliver."""
        events, self._outbox = self._outbox, []
        return events

    def searchable(self, lag_seconds: float) -> Iterator[StripeObject]:
        """Each intent as the search index sees it, newest first: as it was
        `lag_seconds` ago, or not at all if it is younger than that."""
        horizon = time.monotonic() - lag_seconds
        for intent in self.intents.newest_first():
            history = self._history[intent["id"]]
            for moment, snapshot in reversed(history):
                if moment <= horizon:
                    yield snapshot
                    break

    def method_of(self, intent_id: str) -> str | None:
        return self._method_of.get(intent_id)

    # ---- the oracle

    def entries(self) -> dict[str, list[dict[str, Any]]]:
        """Every intent, charge and refund, oldest first (the `/_ledger` Stripe section)."""
        return {
            "payment_intents": [{
                "id": intent["id"], "status": intent["status"], "amount": intent["amount"],
                "currency": intent["currency"], "customer": intent["customer"],
                "payment_method": self._method_of.get(intent["id"], intent["payment_method"]),
                "paycron_payment_id": intent["metadata"].get(PAYMENT_ID_KEY),
                "metadata": intent["metadata"], "latest_charge": intent["latest_charge"],
                "idempotency_key": self._key_of.get(intent["id"]), "created": intent["created"],
            } for intent in self.intents],
            "charges": [{
                "id": charge["id"], "payment_intent": charge["payment_intent"],
                "status": charge["status"], "amount": charge["amount"],
                "currency": charge["currency"], "customer": charge["customer"],
                "payment_method": charge["payment_method"],
                "paycron_payment_id": charge["metadata"].get(PAYMENT_ID_KEY),
                "refunded": charge["refunded"], "amount_refunded": charge["amount_refunded"],
                "created": charge["created"],
            } for charge in self.charges],
            "refunds": [{
                "id": refund["id"], "charge": refund["charge"],
                "payment_intent": refund["payment_intent"], "amount": refund["amount"],
                "status": refund["status"], "created": refund["created"],
            } for refund in self.refunds],
        }
