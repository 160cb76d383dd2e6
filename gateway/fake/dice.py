"""The seeded dice: every random choice the fake makes, reproducible from one seed."""

from __future__ import annotations

import math
import random
import statistics

from gateway.fake.faults import Faults

#: The statuses an injected server error picks from.
SERVER_ERROR_STATUSES = (500, 502, 503)
#: How many standard deviations of the underlying normal the 99th percentile
#: lies above the median (about 2.326).
Z_99 = statistics.NormalDist().inv_cdf(0.99)


class Dice:
    """Random choices from one seed (None: unseeded); the same seed, the same throws."""

    def __init__(self, seed: int | None) -> None:
        self._faults = random.Random(seed)
        # Latency has its own stream, so turning a latency distribution on
        # or off leaves the seed's sequence of faults as it was; and the
        # latencies drawn are the same values whatever order requests come in.
        self._latency = random.Random(None if seed is None else f"latency-{seed}")
        # Webhook deliveries (loss, duplicates, reordering) have theirs too.
        self._webhooks = random.Random(None if seed is None else f"webhooks-{seed}")

    def roll(self, rate: float) -> bool:
        """True with probability `rate`; the dice are only thrown when a fault is on."""
        return rate > 0 and self._faults.random() < rate

    def webhook_roll(self, rate: float) -> bool:
        """True with probability `rate`, from the webhook stream."""
        return rate > 0 and self._webhooks.random() < rate

    def webhook_delay_ms(self, most_ms: int) -> float:
        """A uniform extra delay in [0, most_ms] before a delivery (reordering)."""
        return self._webhooks.uniform(0, most_ms) if most_ms else 0.0

    def server_error_status(self) -> int:
        """The status of an injected server error."""
        return self._faults.choice(SERVER_ERROR_STATUSES)

    def latency_ms(self, faults: Faults) -> float:
        """How long a charge waits before its other faults apply."""
        if faults.latency_dist != "lognormal":
            return faults.latency_ms
        assert faults.latency_p50_ms is not None and faults.latency_p99_ms is not None
        return lognormal_ms(
            self._latency, faults.latency_p50_ms, faults.latency_p99_ms, faults.latency_cap_ms
        )


def lognormal_ms(rng: random.Random, p50: float, p99: float, cap: float | None) -> float:
    """One draw of the lognormal with median `p50` and 99th percentile `p99`, at most `cap`.

    ln(X) is normal with mean ln(p50), and ln(p99) lies Z_99 of its standard
    deviations above the mean.
    """
    sigma = math.log(p99 / p50) / Z_99
    drawn = rng.lognormvariate(math.log(p50), sigma)
    return drawn if cap is None else min(drawn, cap)
