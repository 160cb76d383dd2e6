"""A newcomer's first hour, as the README tells it: from a fresh clone, the
one documented command (``./dev up``) starts the whole Procfile, and the
README's quick-start block, run as written, creates, reads, lists and
cancels payments, sees one complete, reads the events and verifies five
signed webhooks. Everything is stopped by process group at the end and no
process of the clone outlives the test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from devtools.procs import REPO_ROOT, free_port, wait_http
from tests.conftest import drop_database, dsn_for

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
MARK = "a test runs this block"


def quick_start_block(text: str) -> str:
    """The fenced ``sh`` block that follows the README's line saying a test runs it."""
    after = text[text.index(MARK) :]
    match = re.search(r"^```sh\n(.*?)^```", after, re.MULTILINE | re.DOTALL)
    assert match, "no sh block after the quick-start's sentence"
    return match.group(1)


def processes_in(directory: Path) -> list[int]:
    """Live processes whose working directory is inside ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == str(directory) or cwd.startswith(f"{directory}/"):
            found.append(int(entry.name))
    return found


@pytest.fixture
def clone(tmp_path):
    """A fresh clone of this checkout's committed state, with this test run's
    virtual environment as its ``.venv`` (installing one takes minutes: the
    packages are the same, pyproject.toml being the same file)."""
    target = tmp_path / "paycron"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(target)], check=True)
    # The working tree's files as they are now (the test runs before a commit too).
    for name in ("README.md", "dev", "Procfile", "Procfile.dev", "pyproject.toml"):
        (target / name).write_bytes((REPO_ROOT / name).read_bytes())
    (target / ".venv").symlink_to(Path(sys.prefix))
    return target


def test_the_first_hour_from_a_fresh_clone(clone, redis_url, tmp_path):
    database = f"paycron_test_first_hour_{uuid.uuid4().hex[:8]}"
    web_port, gateway_port, hook_port = free_port(), free_port(), free_port()
    env = {
        # Not PAYCRON_VENV either (CI sets it to .ci-venv): the clone's ./dev
        # must use its .venv, this run's environment, not install a new one.
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DATABASE_", "REDIS_")) and k != "PAYCRON_VENV"
        },
        "DATABASE_URL": dsn_for(database),  # ./dev up creates it
        "REDIS_URL": redis_url,
        "REDIS_NAMESPACE": f"paycron-test-{uuid.uuid4().hex[:8]}",
        "WEB_PORT": str(web_port),
        "GATEWAY_PORT": str(gateway_port),
        "GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
        # The clone's code, not the checkout's the virtual environment points at.
        "PYTHONPATH": str(clone),
    }
    up_log = tmp_path / "up.log"
    started = time.monotonic()
    with up_log.open("wb") as out:
        up = subprocess.Popen(
            ["./dev", "up"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(f"http://127.0.0.1:{web_port}/readyz", up, timeout=120)
        ready_after = time.monotonic() - started
        script = quick_start_block(README.read_text())
        walk = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=clone,
            env={**env, "API": f"http://127.0.0.1:{web_port}", "HOOK_PORT": str(hook_port)},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert walk.returncode == 0, (walk.stdout, walk.stderr, up_log.read_text()[-3000:])
        out = walk.stdout
        assert '"status":"PENDING"' in out and '"status":"CANCELLED"' in out
        assert '"status":"COMPLETED"' in out and '"outcome":"SUCCEEDED"' in out
        assert '"type":"payment.completed"' in out
        hooks = [line for line in out.splitlines() if "signature ok" in line]
        assert len(hooks) == 5 and "BAD SIGNATURE" not in out
        print(
            f"./dev up ready after {ready_after:.1f} s; the walk took "
            f"{time.monotonic() - started - ready_after:.1f} s"
        )
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)  # Ctrl-C, as a person stops it
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        deadline = time.monotonic() + 15
        while processes_in(clone) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_in(clone)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        drop_database(database)
    assert not left, f"processes outlived ./dev up: {left}"
