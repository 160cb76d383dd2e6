"""The one fake processor behind every HTTP surface: its state, and each charge's fate.

A surface (the card API of `card.py`, the Stripe-shaped `stripe_api.py`) parses its
own wire format, asks the processor to admit the request and to claim the
key, asks what befalls the charge (`fate`), and renders the answer in its
own format. The key store, the ledger, the faults, the dice and the
counters are shared, so every surface meets the same faults and the same
truth in `/_ledger` (the Stripe surface keeps its intents and charges in
`stripe_ledger`, beside the card ledger).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any

from gateway.fake.dice import Dice
from gateway.fake.errors import KeyInUse, KeyMismatch, RateLimited
from gateway.fake.faults import Faults, seed_setting, updated_faults
from gateway.fake.keys import KeyEntry, KeyStore
from gateway.fake.ledger import Charge, Ledger
from gateway.fake.stripe_ledger import StripeLedger

STAT_NAMES = (
    "charge_requests",
    # charge requests being answered now, and the most at once: the calls
    # a client really had in flight, whatever it counts itself
    "charges_in_progress",
    "charges_in_progress_max",
    "rate_limited",
    "declined",
    "errors",
    "timeouts",
    "dropped",
    "charges",
    "replays",
    "in_use",
    "key_mismatches",
    "refunds",
    # the Stripe surface's own
    "stored_errors",
    "auth_failures",
    "settled",
    "events",
    "deliveries",
    "delivery_failures",
    "events_lost",
)


class Outcome(enum.Enum):
    """What a charge request comes to."""

    CHARGE = "charge"  # charged; the answer is stored for the key
    CHARGE_THEN_DROP = "charge_then_drop"  # charged and stored, then the connection is closed
    DECLINE = "decline"  # a terminal decline, stored; not a charge
    SERVER_ERROR = "server_error"  # an injected 5xx: no charge, nothing stored
    UNAVAILABLE = "unavailable"  # the processor is down (503): no charge, nothing stored
    TIMEOUT = "timeout"  # the key was held for the timeout sleep: 504, no charge
    CHARGE_THEN_ERROR = "charge_then_error"  # charged, then a 500 that is stored (Stripe)


#: The counter each outcome adds to when it is decided (a charge counts when recorded).
OUTCOME_STATS = {
    Outcome.CHARGE_THEN_DROP: "dropped",
    Outcome.DECLINE: "declined",
    Outcome.SERVER_ERROR: "errors",
    Outcome.UNAVAILABLE: "errors",
    Outcome.TIMEOUT: "timeouts",
    Outcome.CHARGE_THEN_ERROR: "stored_errors",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Fate:
    """A charge's outcome, the HTTP status of a server error, and the latency it waited."""

    outcome: Outcome
    error_status: int = 503
    latency_ms: float = 0.0


CHARGE = Fate(Outcome.CHARGE)
CHARGE_THEN_DROP = Fate(Outcome.CHARGE_THEN_DROP)
DECLINE = Fate(Outcome.DECLINE)
UNAVAILABLE = Fate(Outcome.UNAVAILABLE)
TIMEOUT = Fate(Outcome.TIMEOUT)
CHARGE_THEN_ERROR = Fate(Outcome.CHARGE_THEN_ERROR)


class RateWindow:
    """Counts requests in the current one-second window (a fixed-window ceiling).

    Windows are wall-clock seconds, like most processors' published limits
    (and Dramatiq's window rate limiter), so a client pacing itself per
    wall-clock second is never refused."""

    def __init__(self) -> None:
        self._window = -1
        self._count = 0

    def allow(self, limit: int) -> bool:
        """Count one request; False if it is above `limit` for this second."""
        window = int(time.time())
        if window != self._window:
            self._window = window
            self._count = 0
        self._count += 1
        return self._count <= limit


class FakeProcessor:
    """Keys, ledger, faults, dice and counters: the state every surface shares."""

    def __init__(self, *, retention_seconds: float, seed: int | None = None) -> None:
        self.keys = KeyStore(retention_seconds=retention_seconds)
        self.initial_seed = seed
        #: Called after every reset: a surface forgets its own state (timers, settings).
        self.reset_hooks: list[Callable[[], None]] = []
        self._start_afresh()

    def reset(self) -> None:
        """Forget the ledgers, the keys, the faults and the counters; reseed the dice."""
        self.keys.clear()
        self._start_afresh()
        for hook in self.reset_hooks:
            hook()

    def _start_afresh(self) -> None:
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self.ledger = Ledger()
        self.stripe_ledger = StripeLedger(self.stats)
        self.rate_window = RateWindow()
        self.faults = Faults()
        self.seed = self.initial_seed
        self.dice = Dice(self.seed)

    # ---- fault settings

    def configure(self, payload: dict[str, Any]) -> None:
        """Apply a `POST /_faults` body; `InvalidFaults` and no change if any of it is invalid."""
        faults = updated_faults(self.faults, payload)
        reset = payload.get("reset", False)
        seed = seed_setting(payload, self.initial_seed if reset else self.seed)
        if reset or "seed" in payload:
            self.dice = Dice(seed)
        self.faults, self.seed = faults, seed

    def settings(self) -> dict[str, Any]:
        """The fault settings and the seed, as JSON."""
        return {**dataclasses.asdict(self.faults), "seed": self.seed}

    # ---- a charge request, step by step

    def admit(self) -> None:
        """Count the request against the per-second ceiling; `RateLimited` above it."""
        limit = self.faults.rate_limit_per_s
        if limit and not self.rate_window.allow(limit):
            self.stats["rate_limited"] += 1
            raise RateLimited(limit)

    def claim(self, key: str, fingerprint: tuple[Any, ...]) -> KeyEntry:
        """`KeyStore.claim`, counting replays, conflicts and mismatches."""
        try:
            entry = self.keys.claim(key, fingerprint)
        except KeyInUse:
            self.stats["in_use"] += 1
            raise
        except KeyMismatch:
            self.stats["key_mismatches"] += 1
            raise
        if entry.answered:
            self.stats["replays"] += 1
        return entry

    async def fate(self, forced: Fate | None = None, *, stored_errors: bool = False) -> Fate:
        """What befalls a charge: `forced` (a surface's test input), else the faults decide.

        The charge waits its latency, then the fate is counted; a timeout
        then holds the caller (and so its key) for `timeout_sleep_ms`. Only
        a surface that stores 500s (`stored_errors`: Stripe) can draw
        `CHARGE_THEN_ERROR`.
        """
        fate = forced if forced is not None else self._draw(stored_errors)
        if fate.latency_ms:
            await asyncio.sleep(fate.latency_ms / 1000)
        stat = OUTCOME_STATS.get(fate.outcome)
        if stat is not None:
            self.stats[stat] += 1
        if fate.outcome is Outcome.TIMEOUT:
            await asyncio.sleep(self.faults.timeout_sleep_ms / 1000)
        return fate

    def _draw(self, stored_errors: bool = False) -> Fate:
        """Throw the dice of the current faults, in a fixed order, as the request arrives.

        Thrown on arrival rather than after the latency, a seed gives the
        same fates to the same sequence of requests however their latencies
        make them finish.
        """
        faults, dice = self.faults, self.dice
        latency_ms = dice.latency_ms(faults)
        if dice.roll(faults.timeout_rate):
            fate = TIMEOUT
        elif dice.roll(faults.error_rate):
            fate = Fate(Outcome.SERVER_ERROR, dice.server_error_status())
        elif dice.roll(faults.decline_rate):
            fate = DECLINE
        elif dice.roll(faults.charge_then_drop_rate):
            fate = CHARGE_THEN_DROP
        elif stored_errors and dice.roll(faults.error_after_charge_rate):
            fate = CHARGE_THEN_ERROR
        else:
            fate = CHARGE
        return dataclasses.replace(fate, latency_ms=latency_ms) if latency_ms else fate

    def record_charge(self, entry: KeyEntry, amount: int, currency: str, reference: str) -> Charge:
        """Enter a charge under the entry's key in the ledger."""
        charge = self.ledger.record_charge(
            key=entry.key, amount=amount, currency=currency, reference=reference
        )
        self.stats["charges"] += 1
        return charge

    def refund(self, charge_id: str, amount: int | None) -> dict[str, Any]:
        """`Ledger.refund`, counted."""
        refund = self.ledger.refund(charge_id, amount)
        self.stats["refunds"] += 1
        return refund
