"""Rules every processor adapter reads a wire answer by: which connection
errors mean nothing was sent, how a ``Retry-After`` is honoured, and how an
untrusted error code is kept."""

from __future__ import annotations

import math
from collections.abc import Mapping

import urllib3

#: The request never left us: the processor cannot have executed it.
NOT_SENT = (
    urllib3.exceptions.NewConnectionError,
    urllib3.exceptions.ConnectTimeoutError,
    urllib3.exceptions.EmptyPoolError,
)

#: A decline code is a short machine token; anything longer is not one.
MAX_ERROR_CODE_LENGTH = 64

#: A Retry-After is honoured within these bounds (seconds): a processor that
#: says 0 must not be hammered, one that says a year must not park the schedule.
RETRY_AFTER_BOUNDS = (1.0, 3600.0)


def error_code_of(value: object) -> str:
    """The processor's error code as we store it: its text is untrusted (it
    reaches payers' attempts and operators' terminals), so printable ASCII
    without spaces, every other character as ``_``, at most
    MAX_ERROR_CODE_LENGTH; ``declined`` when there is no such text."""
    if not isinstance(value, str):
        return "declined"
    code = "".join(c if "!" <= c <= "~" else "_" for c in value[:MAX_ERROR_CODE_LENGTH])
    return code if code.strip("_") else "declined"


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """A 429's ``Retry-After`` in seconds, clamped to RETRY_AFTER_BOUNDS;
    None when absent or absurd (not a number, infinite, NaN, negative)."""
    try:
        seconds = float((headers or {}).get("Retry-After") or "")
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    low, high = RETRY_AFTER_BOUNDS
    return min(max(seconds, low), high)
