"""The crash soak's short form, as CI runs it: real processes on a private
Postgres and Redis, killed and restarted while payments fall due; the
harness exits non-zero on any violated promise (see bench/soak.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.procs import REPO_ROOT


@pytest.mark.timeout(600)
def test_the_short_soak_keeps_every_promise():
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--short"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "soak took" in result.stdout and "passed" in result.stdout


@pytest.mark.timeout(600)
def test_the_short_soak_through_stripe_keeps_every_promise():
    """The same chaos through the Stripe SDK against the stub: bank debits
    that settle later by signed events (some lost, duplicated, reordered)
    or by polling, stored 500s, declines Stripe advises retrying."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--short", "--gateway", "stripe"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "soak took" in result.stdout and "passed" in result.stdout
    assert "bank debits: 0 waited" not in result.stdout
