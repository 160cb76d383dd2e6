"""A worker's event loop (``EXECUTOR=asyncio``) is uvloop's: the process
that imports the worker's composition root makes its loops with uvloop's
policy; a threaded worker leaves asyncio's alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devtools.procs import REPO_ROOT

#: What a worker process's loop is made by, printed after ``dramatiq tasks``'s import.
PROBE = (
    "import asyncio, logging; logging.basicConfig(level=logging.INFO); import tasks.broker; "
    "print(type(asyncio.get_event_loop_policy().new_event_loop()).__module__.split('.')[0])"
)


@pytest.mark.parametrize(("executor", "loop"), [("asyncio", "uvloop"), ("threads", "asyncio")])
def test_a_worker_runs_the_async_executor_on_uvloop(config, executor, loop):
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "DATABASE_URL": config.database_url,
            "REDIS_URL": config.redis_url,
            "REDIS_NAMESPACE": config.redis_namespace,
            "EXECUTOR": executor,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [loop]
    assert f"event loop: {loop if executor == 'asyncio' else 'none'}" in result.stderr
