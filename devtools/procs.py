"""Starting and stopping paycron's own processes from Python: the demo, the
benchmarks and the crash tests run the Procfile's commands this way.

The commands are read from the ``Procfile`` itself, so there is one source
of them: a harness substitutes the Procfile's variables (``${PORT:-8000}``)
and may give an option the Procfile sets another value (a benchmark's
``--threads``), but never spells a command of its own.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROCFILE = REPO_ROOT / "Procfile"
#: The development Procfile: the production processes plus the fake processor.
PROCFILE_DEV = REPO_ROOT / "Procfile.dev"

#: ``${NAME}`` or ``${NAME:-default}``, as the shell expands them.
_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


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
        # refused, reset, a half-written answer, or an HTTPError (up, not yet ready)
        with contextlib.suppress(OSError, http.client.HTTPException):
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
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

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        with (self.logdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=REPO_ROOT,
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            stop(proc)


# -- the Procfile's commands ----------------------------------------------------


def parse_procfile(text: str) -> dict[str, str]:
    """``{process type: command line}`` of a Procfile's ``name: command`` lines."""
    commands = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            commands[name.strip()] = command.strip()
    return commands


@cache
def procfile(path: Path = PROCFILE) -> dict[str, str]:
    return parse_procfile(path.read_text())


def expand(command: str, variables: dict[str, object]) -> str:
    """``command`` with each ``${NAME:-default}`` replaced by ``variables[NAME]``
    (a None value, or none given, leaves the Procfile's default)."""

    def value(match: re.Match) -> str:
        name, default = match.groups()
        if variables.get(name) is not None:
            return str(variables[name])
        if default is None:
            raise KeyError(f"the Procfile's ${{{name}}} has no default: give it a value")
        return default

    return _VARIABLE.sub(value, command)


def set_option(args: list[str], option: str, value: object) -> list[str]:
    """``args`` with the value after ``option`` replaced. Only an option the
    Procfile already sets: a harness changes a setting, not the command."""
    if option not in args:
        raise ValueError(f"the Procfile's command sets no {option}: {shlex.join(args)}")
    changed = list(args)
    changed[changed.index(option) + 1] = str(value)
    return changed


def procfile_args(name: str, *, path: Path = PROCFILE, **variables: object) -> list[str]:
    """The Procfile's ``name`` command as arguments to this interpreter
    (``python -m X`` stays ``-m X``; a console script such as ``gunicorn``
    becomes ``-m gunicorn``): children run in this virtual environment
    whether or not its ``bin/`` is on ``PATH``."""
    args = shlex.split(expand(procfile(path)[name], variables))
    if args[0] in ("python", "python3"):
        return args[1:]
    return ["-m", args[0], *args[1:]]


def gateway_args(port: int) -> list[str]:
    """The fake gateway (``Procfile.dev``'s ``gateway``) on ``port``."""
    return procfile_args("gateway", path=PROCFILE_DEV, GATEWAY_PORT=port)


def web_args(port: int, workers: int | None = None, threads: int | None = None) -> list[str]:
    """The Procfile's web command on 127.0.0.1:``port`` (the Procfile binds
    0.0.0.0 for a platform's router; a harness listens on loopback only).

    ``workers`` is ``WEB_CONCURRENCY`` (default 2 x cores + 1, gunicorn's
    guidance); ``threads`` also sets ``--worker-connections``, so each worker
    holds only the connections it is serving: the rest wait in the listen
    backlog, where a crashing worker cannot take them down with it. A
    SIGKILLed worker loses its in-flight requests; more, smaller workers lose
    fewer (bench.api_churn: 6.9 failures per 10,000 requests with 3 x 4
    threads, 1.4 with 5 x 4 and --worker-connections).
    """
    args = procfile_args("web", PORT=port, WEB_CONCURRENCY=workers)
    args = set_option(args, "--bind", f"127.0.0.1:{port}")
    if threads is not None:
        args = set_option(set_option(args, "--threads", threads), "--worker-connections", threads)
    return args


def worker_args(processes: int | None = None, threads: int | None = None) -> list[str]:
    """The Procfile's Dramatiq worker, with other process and thread counts if given."""
    args = procfile_args("worker")
    if processes is not None:
        args = set_option(args, "--processes", processes)
    if threads is not None:
        args = set_option(args, "--threads", threads)
    return args


def scheduler_args() -> list[str]:
    return procfile_args("scheduler")
