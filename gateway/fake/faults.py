"""Fault settings: what goes wrong, and how often (`POST /_faults`).

Rates are probabilities in [0, 1]; durations are whole milliseconds. A
change is validated whole before anything is applied, so a typo in one
field never leaves a half-applied configuration behind.
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
    decline_rate: float = 0.0
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    timeout_sleep_ms: int = DEFAULT_TIMEOUT_SLEEP_MS
    charge_then_drop_rate: float = 0.0
    rate_limit_per_s: int | None = None


RATE_FIELDS = ("decline_rate", "error_rate", "timeout_rate", "charge_then_drop_rate")
MILLISECOND_FIELDS = ("latency_ms", "timeout_sleep_ms")
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
    if "rate_limit_per_s" in payload:
        value = payload["rate_limit_per_s"]
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidFaults("rate_limit_per_s must be a non-negative integer or null")
        changes["rate_limit_per_s"] = value or None
    return dataclasses.replace(Faults() if reset else current, **changes)


def seed_setting(payload: dict[str, Any], current: int | None) -> int | None:
    """The `seed` a `POST /_faults` body asks for (validated), else `current`."""
    if "seed" not in payload:
        return current
    seed = payload["seed"]
    if seed is not None and type(seed) is not int:
        raise InvalidFaults("seed must be an integer or null")
    return seed
