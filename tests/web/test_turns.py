"""web.turns: long work done a slice at a time, the worker's other requests
running between two slices under gevent (the Procfile's worker)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from devtools.procs import REPO_ROOT
from web.turns import TURN_SIZE, in_turns


def test_the_work_is_done_in_slices_in_order():
    slices: list[list[int]] = []

    def work(part):
        slices.append(list(part))
        return [value * 2 for value in part]

    values = list(range(TURN_SIZE * 3 + 7))
    assert in_turns(values, work) == [value * 2 for value in values]
    assert [len(part) for part in slices] == [TURN_SIZE, TURN_SIZE, TURN_SIZE, 7]
    assert in_turns([], work) == []


def test_under_gevent_other_greenlets_run_between_two_slices():
    """A greenlet that counts while it may run: it runs between every two
    slices of pure CPU work (without the pauses, not once)."""
    script = textwrap.dedent(
        """
        from gevent import monkey

        monkey.patch_all()

        import gevent

        from web.turns import TURN_SIZE, in_turns

        ticks = 0

        def ticker():
            global ticks
            while True:
                ticks += 1
                gevent.sleep(0)

        gevent.spawn(ticker)
        gevent.sleep(0)
        seen = []

        def work(part):
            seen.append(ticks)
            return [sum(range(2000)) for _ in part]

        in_turns(list(range(TURN_SIZE * 10)), work)
        print(len(set(seen)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["10"]  # the counter moved before each of the 10 slices
