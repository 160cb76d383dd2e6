"""Starting and stopping paycron's own processes from Python: the demo, the
benchmarks and the crash tests run the real Procfile commands this way."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen | None = None, *, timeout: float = 30.0) -> None:
    """Until ``url`` answers 200; fails fast if ``proc`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} at start-up")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


def stop(proc: subprocess.Popen, *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal a process and everything it started (its own session), and reap it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


class ProcessGroup:
    """``python <args>`` children from the repository root, each in its own
    session, logging to ``logdir/<name>.log``, stopped together."""

    def __init__(self, logdir: Path, env: dict[str, str] | None = None):
        self.logdir = Path(logdir)
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        with (self.logdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT,
                                    env={**self.env, **(env or {})}, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            stop(proc)


#: The Procfile's commands, as ``python`` arguments.
def gateway_args(port: int) -> list[str]:
    return ["-m", "gateway.fake", "--port", str(port)]


def web_args(port: int, workers: int = 5, threads: int = 4) -> list[str]:
    """The Procfile's web command (keep in step with it).

    2 x cores + 1 workers (gunicorn's guidance; WEB_CONCURRENCY in the
    Procfile) of 4 threads, each holding only the connections it is serving
    (``--worker-connections`` = threads): the rest wait in the listen
    backlog, where a crashing worker cannot take them down with it. A
    SIGKILLed worker loses its in-flight requests; more, smaller workers lose
    fewer (bench.api_churn: 6.9 failures per 10,000 requests with 3 x 4
    threads, 1.4 with 5 x 4 and --worker-connections).
    """
    return ["-m", "gunicorn", "--no-control-socket", "--worker-class", "gthread",
            "--workers", str(workers), "--threads", str(threads),
            "--worker-connections", str(threads), "--keep-alive", "0",
            "--bind", f"127.0.0.1:{port}", "web:create_app()"]


def worker_args(processes: int = 1, threads: int = 8) -> list[str]:
    return ["-m", "dramatiq", "tasks", "--processes", str(processes), "--threads", str(threads)]


SCHEDULER_ARGS = ["-m", "scheduler"]
