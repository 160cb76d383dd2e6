"""Every benchmark command runs: each ``python -m bench.<name> --smoke``
(seconds, a tiny N; its figures mean nothing) must exit 0 and print its
report, so a benchmark that can no longer run fails CI instead of rotting
until someone needs its figures. A new module under bench/ with a ``main``
must be listed here (or be covered by a test of its own)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import time

import pytest

from devtools.procs import REPO_ROOT

BENCH = REPO_ROOT / "bench"

#: bench module -> (a line its report prints, what it needs beyond the core:
#: a Python module of an extra, or a program on PATH).
SMOKE = {
    "adapter_cpu": ("ms CPU per charge", ()),
    "api_churn": ("requests sent", ()),
    "api_saturation": ("(the durable floor)", ("wrk",)),
    "console_pages": (" median ", ()),
    "create_customer": ("creates of each kind", ()),
    "executor_cpu": ("ms CPU per payment", ()),
    "fairness": ("case smoke", ()),
    "gateway_events_burst": ("applier:", ()),
    "gateway_throughput": ("requests/s", ()),
    "latency": ("max per key", ()),
    "leader_finding": ("found the leader", ("patroni", "etcd")),
    "latency_compare": ("ratio paycron / pgqueuer", ("pgqueuer", "asyncpg", "aiohttp")),
    "list_filter": ("ratio filtered/unfiltered", ()),
    "midnight_spike": ("drain (spike -> all terminal)", ()),
    "pgqueuer_compare": ("ratio paycron / pgqueuer", ("pgqueuer", "asyncpg")),
    "steady_state": ("lateness p50 / p99 / max", ()),
    "sweep_history": ("ratio history / fresh", ()),
    "throughput": ("ratio paycron / raw", ()),
    "prompt_start": ("due -> claimed", ()),
    "slowloris": ("slow held", ()),
}
#: Benchmarks whose short form CI already runs in a test of its own.
COVERED_ELSEWHERE = {
    "batch_create": "tests/processes/test_batch_bench.py",
    "soak": "tests/processes/test_soak_short.py",
    "failover": "tests/processes/test_failover_short.py",
}
#: Commands under bench/ that measure nothing: a tool the harnesses use.
NOT_BENCHMARKS = {
    "patroni": "starts a Patroni cluster and waits for Ctrl-C (tests/processes/test_patroni.py)",
}


def bench_commands() -> set[str]:
    """Modules under bench/ that are commands (define ``main``)."""
    found = set()
    for path in BENCH.glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            found.add(path.stem)
    return found


def test_every_bench_command_has_a_smoke_run():
    assert bench_commands() == set(SMOKE) | set(COVERED_ELSEWHERE) | set(NOT_BENCHMARKS)
    for name in bench_commands() - set(NOT_BENCHMARKS):
        text = (BENCH / f"{name}.py").read_text()
        assert re.search(r"parse_args\(\s*parser", text) or '"--smoke"' in text, (
            f"bench/{name}.py: no --smoke (bench.harness.parse_args, or its own flag)"
        )


#: Needs that are programs on PATH, not Python modules.
PROGRAMS = {"wrk", "patroni", "etcd"}


def missing(needs: tuple[str, ...]) -> list[str]:
    return [
        need
        for need in needs
        if (shutil.which(need) if need in PROGRAMS else importlib.util.find_spec(need)) is None
    ]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_bench_smoke(name):
    expected, needs = SMOKE[name]
    if lacking := missing(needs):
        pytest.skip(
            f"bench.{name} needs {', '.join(lacking)} (pip install -e '.[bench]'; apt-get "
            "install wrk patroni etcd-server)"
        )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--smoke"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    print(f"bench.{name} --smoke: {time.monotonic() - started:.1f} s")
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip(), result.stderr[-3000:]
    assert expected in result.stdout, result.stdout[-3000:]
