"""Long work in turns, so one request does not hold its worker.

Under gunicorn's gevent worker (the Procfile's web) a request is a
greenlet, and a greenlet runs until it waits: a batch create's ~50 ms of
Python per 1,000 items (validating, hashing, dumping the answer) would
stop every other request of its worker for that long. :func:`in_turns`
does such work a slice at a time and lets the others run between two
slices. Without gevent (tests, the dev server) it just does the work.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Values worked on between two pauses: 25 items of a batch are 1-3 ms of
#: CPU, so another request waits at most that long for a turn, and the
#: batch pauses forty times per 1,000 items (a pause costs a few µs). A
#: single create waits for several turns (one per wait on Redis or the
#: database): beside an import (one batch in flight), their p99 was 79.5 ms
#: at 100 items a turn, 22 ms at 25, the import as fast (bench.batch_create).
TURN_SIZE = 25


def in_turns(values: Sequence[T], work: Callable[[Sequence[T]], list[R]]) -> list[R]:
    """``work(values)``, done :data:`TURN_SIZE` values at a time (``work``
    answers one result per value, in order); between two slices, the
    worker's other requests run."""
    if len(values) <= TURN_SIZE:
        return work(values)
    done: list[R] = []
    for start in range(0, len(values), TURN_SIZE):
        if start:
            pause()
        done.extend(work(values[start : start + TURN_SIZE]))
    return done


def pause() -> None:
    """Under gevent, let the other greenlets that can run do so now (gevent
    has patched the standard library in this process: gunicorn's gevent
    worker does, before it loads the app). Otherwise nothing."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        import gevent

        gevent.sleep(0)
