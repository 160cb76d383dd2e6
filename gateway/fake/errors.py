"""Every way the fake processor's core says no, one exception each.

The core (keys, ledger, faults) raises these without knowing how they look
on the wire; each HTTP surface maps every one of them to its own error
answer in one table (the card surface: `card.REFUSAL_ANSWERS`).
"""

from __future__ import annotations


class Refusal(Exception):
    """The root: the request is refused and nothing was charged or stored."""


class KeyInUse(Refusal):
    """The key's first request is still being processed (requests are serialized per key)."""


class KeyMismatch(Refusal):
    """The key was first used with another request body."""


class RateLimited(Refusal):
    """More requests this second than the configured ceiling."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} charge requests this second")
        self.limit = limit


class ChargeMissing(Refusal):
    """No charge has this id."""


class AlreadyRefunded(Refusal):
    """The charge was refunded already (under another key)."""


class RefundExceedsCharge(Refusal):
    """A refund larger than its charge."""


class InvalidFaults(Refusal):
    """A fault-settings change that is not valid; nothing was changed."""
