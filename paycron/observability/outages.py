"""One line per failure kind per interval, with a count.

During an outage (Postgres or Redis down) a loop fails every few seconds;
a traceback each time buries the one line that says what is wrong. The
first failure of a kind is logged at once, on one line (its traceback only
at DEBUG); the next ones of that kind are counted and logged as one line
per interval with how many there were; the first success after failures
says so."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sentry_sdk
from sentry_sdk.integrations.logging import ignore_logger

from paycron.observability.sentry import redact_postgres_message

#: How often a continuing failure of one kind is logged again (with its count).
OUTAGE_LOG_SECONDS = 60.0

#: The one-line reports. Sentry gets the exception itself instead (with its
#: stack, scrubbed like every event), once per line, not this line as well.
OUTAGE_LOG = logging.getLogger("paycron.outages")
ignore_logger(OUTAGE_LOG.name)


def describe(exc: BaseException) -> str:
    """``exc`` on one line, without the data a database error may quote."""
    text = (
        redact_postgres_message(str(exc), exc)
        if type(exc).__module__.startswith("psycopg")
        else str(exc)
    )
    first = text.strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@dataclass
class _Kind:
    since: float  # when this kind was last logged
    count: int  # failures of this kind since then (not yet logged)
    line: str  # the latest of them, on one line


class FailureLog:
    """Failures of one loop (``what``), logged by kind (exception type)."""

    def __init__(
        self,
        what: str,
        log: logging.Logger = OUTAGE_LOG,
        *,
        interval: float = OUTAGE_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.log, self.interval, self.clock = what, log, interval, clock
        self._kinds: dict[str, _Kind] = {}
        self._failures = 0

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        self._failures += 1
        kind = type(exc).__name__
        line = describe(exc)
        seen = self._kinds.get(kind)
        if seen is None:
            self._kinds[kind] = _Kind(since=now, count=0, line=line)
            self.log.error("%s failed: %s", self.what, line)
            self.log.debug("%s failed", self.what, exc_info=exc)
            sentry_sdk.capture_exception(exc)
            return
        seen.count += 1
        seen.line = line
        if now - seen.since >= self.interval:
            self.log.error(
                "%s failed: %s (%d times in the last %.0fs)",
                self.what,
                line,
                seen.count,
                now - seen.since,
            )
            sentry_sdk.capture_exception(exc)
            seen.since, seen.count = now, 0

    def succeeded(self) -> None:
        if self._failures:
            self.log.warning("%s works again after %d failures", self.what, self._failures)
            self._failures = 0
            self._kinds.clear()
