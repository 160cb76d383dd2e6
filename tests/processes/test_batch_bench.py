"""bench.batch_create in its smoke form, so the benchmark cannot rot: the
Procfile's web, a private database, every item answered 201 and every
payment stored (the harness exits non-zero otherwise)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.procs import REPO_ROOT


@pytest.mark.timeout(600)
def test_the_batch_benchmark_runs():
    result = subprocess.run(
        [sys.executable, "-m", "bench.batch_create", "--smoke"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for figure in ("COPY floor", "single creates at saturation", "batch import", "per batch"):
        assert figure in result.stdout
    assert "3000 payments stored: passed" in result.stdout
