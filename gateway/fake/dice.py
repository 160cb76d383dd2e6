"""The seeded dice: every random choice the fake makes, reproducible from one seed."""

from __future__ import annotations

import random

#: The statuses an injected server error picks from.
SERVER_ERROR_STATUSES = (500, 502, 503)


class Dice:
    """Random choices from one seed (None: unseeded); the same seed, the same throws."""

    def __init__(self, seed: int | None) -> None:
        self._faults = random.Random(seed)

    def roll(self, rate: float) -> bool:
        """True with probability `rate`; the dice are only thrown when a fault is on."""
        return rate > 0 and self._faults.random() < rate

    def server_error_status(self) -> int:
        """The status of an injected server error."""
        return self._faults.choice(SERVER_ERROR_STATUSES)
