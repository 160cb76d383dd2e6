"""Fault settings: what goes wrong, how often, and how slowly (`POST /_faults`).

Rates are probabilities in [0, 1]; durations are whole milliseconds. A
change is validated whole, then the settings it produces are checked
together, before anything is applied: a typo in one field never leaves a
half-applied configuration behind.

Latency is ``latency_dist`` ``"fixed"`` (every charge waits ``latency_ms``)
or ``"lognormal"``: a real processor's shape, most answers near the median
``latency_p50_ms`` and a long tail through ``latency_p99_ms``, cut at
``latency_cap_ms`` if set. The lognormal fields are kept while the
distribution is fixed, so switching back and forth needs one field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.fake.errors import InvalidFaults

#: A "timeout" sleeps far longer than any sane client waits, so the client
#: gives up first and sees a timeout, not our 504.
DEFAULT_TIMEOUT_SLEEP_MS = 30_000


@dataclasses.dataclass(frozen=True, slots=True)
class Faults:
    """The settings; the defaults inject nothing."""

    latency_ms: int = 0
    latency_dist: str = "fixed"
    latency_p50_ms: int | None = None
    latency_p99_ms: int | None = None
    latency_cap_ms: int | None = None
    decline_rate: float = 0.0
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    timeout_sleep_ms: int = DEFAULT_TIMEOUT_SLEEP_MS
    charge_then_drop_rate: float = 0.0
    rate_limit_per_s: int | None = None
    #: Stripe surface only: execute the charge, then answer 500 and store that
    #: 500 for the key (Stripe replays a 500 that happened after execution began).
    error_after_charge_rate: float = 0.0


RATE_FIELDS = (
    "decline_rate",
    "error_rate",
    "timeout_rate",
    "charge_then_drop_rate",
    "error_after_charge_rate",
)
MILLISECOND_FIELDS = ("latency_ms", "timeout_sleep_ms")
#: Durations that may be unset (null); zero is refused, as no distribution has it.
OPTIONAL_MILLISECOND_FIELDS = ("latency_p50_ms", "latency_p99_ms", "latency_cap_ms")
LATENCY_DISTRIBUTIONS = ("fixed", "lognormal")
FAULT_FIELDS = frozenset(field.name for field in dataclasses.fields(Faults))
#: The other keys a `POST /_faults` body may hold (applied by the processor).
CONTROL_FIELDS = frozenset({"reset", "seed"})


def _is_number(value: Any) -> bool:
    """A JSON number that is not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def updated_faults(current: Faults, payload: dict[str, Any]) -> Faults:
    """The settings after applying a `POST /_faults` body, or `InvalidFaults`."""
    unknown = set(payload) - FAULT_FIELDS - CONTROL_FIELDS
    if unknown:
        raise InvalidFaults(f"unknown fault settings: {', '.join(sorted(unknown))}")
    reset = payload.get("reset", False)
    if not isinstance(reset, bool):
        raise InvalidFaults("reset must be a boolean")
    changes: dict[str, Any] = {}
    for name in RATE_FIELDS:
        if name in payload:
            value = payload[name]
            if not _is_number(value) or not 0 <= value <= 1:
                raise InvalidFaults(f"{name} must be a probability between 0 and 1")
            changes[name] = float(value)
    for name in MILLISECOND_FIELDS:
        if name in payload:
            value = payload[name]
            if type(value) is not int or value < 0:
                raise InvalidFaults(f"{name} must be a non-negative integer")
            changes[name] = value
    for name in OPTIONAL_MILLISECOND_FIELDS:
        if name in payload:
            value = payload[name]
            if value is not None and (type(value) is not int or value <= 0):
                raise InvalidFaults(f"{name} must be a positive integer or null")
            changes[name] = value
    if "latency_dist" in payload:
        value = payload["latency_dist"]
        if value not in LATENCY_DISTRIBUTIONS:
            raise InvalidFaults(f"latency_dist must be one of: {', '.join(LATENCY_DISTRIBUTIONS)}")
        changes["latency_dist"] = value
    if "rate_limit_per_s" in payload:
        value = payload["rate_limit_per_s"]
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidFaults("rate_limit_per_s must be a non-negative integer or null")
        changes["rate_limit_per_s"] = value or None
    faults = dataclasses.replace(Faults() if reset else current, **changes)
    _check_latency(faults)
    return faults


def _check_latency(faults: Faults) -> None:
    """`InvalidFaults` unless the latency settings describe one distribution."""
    p50, p99, cap = faults.latency_p50_ms, faults.latency_p99_ms, faults.latency_cap_ms
    if faults.latency_dist == "lognormal" and (p50 is None or p99 is None):
        raise InvalidFaults("latency_dist lognormal needs latency_p50_ms and latency_p99_ms")
    if p50 is not None and p99 is not None and p99 < p50:
        raise InvalidFaults("latency_p99_ms must be at least latency_p50_ms")
    if cap is not None and p99 is not None and cap < p99:
        raise InvalidFaults(
            "latency_cap_ms must be at least latency_p99_ms (a lower cap moves the 99th percentile)"
        )


def seed_setting(payload: dict[str, Any], current: int | None) -> int | None:
    """The `seed` a `POST /_faults` body asks for (validated), else `current`."""
    if "seed" not in payload:
        return current
    seed = payload["seed"]
    if seed is not None and type(seed) is not int:
        raise InvalidFaults("seed must be an integer or null")
    return seed
