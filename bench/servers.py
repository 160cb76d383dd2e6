"""Private Postgres and Redis servers a harness may kill and restart.

Never the machine's shared servers: the soak restarts Postgres with an
``immediate`` shutdown and Redis losing everything in it. Postgres comes
from the system's binaries, run as the ``postgres`` OS user (``initdb``
refuses root); Redis from the system's ``redis-server``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from devtools.procs import free_port


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PrivatePostgres:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="paycron-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres",
                                     "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                   f"-c unix_socket_directories={self.dir} -c shared_buffers=256MB")
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(self.data), "-o", options,
                                     "-l", str(self.dir / "server.log"), "-w", "start"]),
                       check=True, capture_output=True)
        self.wait()

    def wait(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError("private Postgres did not come up")

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode,
                                     "-w", "stop"]), capture_output=True)

    def restart_immediate(self) -> None:
        """Crash-stop (no checkpoint) and start again: recovery replays the WAL."""
        self.stop("immediate")
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private Redis did not come up")

    def restart_empty(self) -> None:
        """Kill it (nothing is persisted) and start a fresh, empty one."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.start()

    def destroy(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
