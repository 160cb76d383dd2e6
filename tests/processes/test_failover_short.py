"""The failover harness's short form, as CI runs it: the whole Procfile on a
private primary with a synchronous standby; the primary SIGKILLed during a
spike and API load, the standby promoted; the harness exits non-zero on any
violated promise (see bench/failover.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.procs import REPO_ROOT


@pytest.mark.timeout(420)
def test_the_short_failover_keeps_every_promise():
    result = subprocess.run(
        [sys.executable, "-m", "bench.failover", "--short"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "failover (sync) took" in result.stdout and "passed" in result.stdout
