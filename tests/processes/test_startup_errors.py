"""A person's mistake at start gets one line naming the setting and exit
status 2, never a traceback: in the CLI and in each Procfile process. And a
process whose schema is behind waits, saying "run `paycron migrate`", then
starts once it is applied."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from devtools.procs import REPO_ROOT, procfile_args, stop
from paycron.config import Config
from paycron.store.db import connect
from paycron.store.migrate import migrate
from tests.conftest import create_database, drop_database

pytestmark = pytest.mark.slow

PAYCRON = str(Path(sys.executable).with_name("paycron"))
#: Nothing listens there.
DEAD_POSTGRES = "postgresql://paycron:s3cret@127.0.0.1:9/paycron"
DEAD_REDIS = "redis://127.0.0.1:9/0"


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        args,
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    ours = [line for line in result.stderr.splitlines() if line.startswith("paycron")]
    assert ours, result.stderr
    for needle in needles:
        assert needle in ours[0], ours[0]
    assert "s3cret" not in result.stderr  # a DSN's password is never printed
    return ours[0]


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        ({}, ["DATABASE_URL is not set"]),
        ({"DATABASE_URL": DEAD_POSTGRES}, ["DATABASE_URL", "127.0.0.1:9/paycron"]),
        ({"DATABASE_URL": "not a dsn"}, ["DATABASE_URL"]),
        ({"DATABASE_URL": DEAD_POSTGRES, "LEASE_SECONDS": "soon"}, ["LEASE_SECONDS='soon'"]),
    ],
)
def test_the_cli_says_which_setting_in_one_line(env, needles):
    result = run([PAYCRON, "migrate"], env)
    line = assert_one_line(result, *needles)
    assert result.stderr.strip() == line  # nothing else


def test_a_secret_setting_is_named_but_not_shown():
    result = run([PAYCRON, "stats"], {"SENTRY_DSN": "x", "METRICS_TOKEN": "short-s3cret"})
    assert_one_line(result, "METRICS_TOKEN")


def module_args(name: str) -> list[str]:
    return [sys.executable, *procfile_args(name)]


@pytest.mark.parametrize("name", ["scheduler", "worker", "web"])
@pytest.mark.parametrize(
    ("setting", "needle"),
    [("DATABASE_URL", "DATABASE_URL"), ("REDIS_URL", "REDIS_URL")],
)
def test_each_process_stops_with_one_line_naming_the_setting(
    name, setting, needle, database_url, redis_url
):
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "WEB_CONCURRENCY": "1"}
    env[setting] = DEAD_POSTGRES if setting == "DATABASE_URL" else DEAD_REDIS
    result = run(module_args(name), env)
    assert_one_line(result, f"paycron {name}:", needle)


@pytest.fixture
def unmigrated():
    name = f"paycron_test_unmigrated_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    yield url
    drop_database(name)


@pytest.mark.parametrize("name", ["scheduler", "worker"])
def test_a_process_waits_for_pending_migrations_then_starts(name, unmigrated, redis_url, tmp_path):
    log = tmp_path / f"{name}.log"
    env = {
        **os.environ,
        "DATABASE_URL": unmigrated,
        "REDIS_URL": redis_url,
        "REDIS_NAMESPACE": f"paycron-test-{uuid.uuid4().hex[:8]}",
    }
    args = procfile_args(name)
    if name == "worker":
        args = [*args[:3], "--processes", "1", "--threads", "2"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "run `paycron migrate`" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        # One line per check (10 s apart; the worker's arrive through Dramatiq's
        # buffered pipe, so maybe several at once), each the same one line.
        waiting = [line for line in log.read_text().splitlines() if "paycron migrate" in line]
        assert all("waiting (checking every 10s)" in line for line in waiting), waiting
        with connect(Config(database_url=unmigrated)) as conn:
            migrate(conn)
        # It starts within one interval (10 s) of the migration; nothing failed meanwhile.
        started = {"scheduler": "scheduler started", "worker": "ready for action"}[name]
        deadline = time.monotonic() + 40
        while started not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert "Traceback" not in log.read_text()
    finally:
        stop(proc)
