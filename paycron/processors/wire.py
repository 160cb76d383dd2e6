"""Rules every processor adapter reads a wire answer by: which connection
errors mean nothing was sent, how a ``Retry-After`` is honoured, and how an
untrusted error code is kept."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

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


#: A processor's object id (ch_…, pi_…, re_…): what we store, index and show.
MAX_ID_LENGTH = 255
_ID = re.compile(rf"[A-Za-z0-9_\-.:]{{1,{MAX_ID_LENGTH}}}")


#: What an id we do not keep becomes where the answer's outcome still counts
#: (a 200 whose charge id is absurd: the money moved, its id is not kept);
#: the same marker the store writes for text Postgres cannot hold.
UNUSABLE_ID = "unwritable_answer"


def processor_id(value: object) -> str | None:
    """``value`` if it is an id we keep as the processor's (letters, digits,
    ``_ - . :``, at most MAX_ID_LENGTH), else None: an answer naming its
    object otherwise is not believed."""
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def answered_id(value: object) -> str | None:
    """The id of an object the processor says it made: None when it named
    none (the answer is malformed), UNUSABLE_ID when it named one we do not
    keep (the outcome stands, the text goes)."""
    if not isinstance(value, str) or not value:
        return None
    return processor_id(value) or UNUSABLE_ID


#: The most of an answer we read: a charge, a lookup page or a refund is a
#: few KiB; a settlement report page a few MiB.
MAX_ANSWER_BYTES = 1 << 20
MAX_REPORT_BYTES = 64 << 20


class AnswerTooLarge(Exception):
    """The processor's answer went on past the bound: nothing of it is used."""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer read whole (within a bound): its status, headers, body."""

    status: int
    headers: Mapping[str, str]
    data: bytes


def read_bounded(response, limit: int = MAX_ANSWER_BYTES) -> Answer:
    """A urllib3 response opened with ``preload_content=False``, read to at
    most ``limit`` bytes (AnswerTooLarge beyond) and released."""
    try:
        if response.status < 200:
            # An interim answer (http.client skips only 100): the final one
            # is still on its way on this connection and must never be
            # read as the next request's.
            response.close()
        data = response.read(limit + 1)
        if len(data) > limit:
            raise AnswerTooLarge(f"the answer is larger than {limit} bytes")
    finally:
        response.release_conn()
    return Answer(response.status, response.headers, data)
