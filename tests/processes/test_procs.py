"""The harness's commands are the Procfile's: read from it, not copied."""

from __future__ import annotations

import shlex

import pytest

from devtools import procs


def procfile_line(name: str, path=procs.PROCFILE, **values: str) -> list[str]:
    """The Procfile's ``name`` line, split, with ``${VAR:-default}`` written
    out by hand: ``values[VAR]`` or the default."""
    for line in path.read_text().splitlines():
        if line.startswith(f"{name}:"):
            command = line.split(":", 1)[1]
            for variable, default in (
                ("PORT", "8000"),
                ("WEB_CONCURRENCY", "5"),
                ("GATEWAY_PORT", "9090"),
            ):
                command = command.replace(
                    f"${{{variable}:-{default}}}", values.get(variable, default)
                )
            return shlex.split(command)
    raise AssertionError(f"no {name} in the Procfile")


def as_module(argv: list[str]) -> list[str]:
    """How the harness runs a Procfile command under its own interpreter."""
    return argv[1:] if argv[0] == "python" else ["-m", *argv]


@pytest.mark.parametrize("name", ["web", "worker", "scheduler"])
def test_each_command_is_the_procfiles_run_under_this_interpreter(name):
    assert procs.procfile_args(name) == as_module(procfile_line(name))


def test_production_runs_the_engine_and_its_release_step_only():
    """No fake processor in production: it lives in Procfile.dev."""
    assert list(procs.parse_procfile(procs.PROCFILE.read_text())) == [
        "release",
        "web",
        "scheduler",
        "worker",
    ]
    assert procs.procfile()["release"] == "paycron migrate"


def test_the_development_procfile_runs_productions_commands_and_the_fake():
    """Procfile.dev differs from the Procfile only in where the web listens
    and how many processes run, plus the fake gateway; the release step is
    ``./dev up``'s (honcho would stop everything when it exits)."""
    dev = procs.parse_procfile(procs.PROCFILE_DEV.read_text())
    assert set(dev) == {"web", "scheduler", "worker", "gateway"}
    sized = {"--workers", "--bind", "--processes"}
    for name in ("web", "scheduler", "worker"):
        prod = shlex.split(procs.procfile()[name])
        here = shlex.split(dev[name])
        assert len(prod) == len(here)
        differ = [prod[i - 1] for i, (a, b) in enumerate(zip(prod, here, strict=True)) if a != b]
        assert set(differ) <= sized, (name, differ)
    web = procs.procfile_args("web", path=procs.PROCFILE_DEV)
    assert web[web.index("--bind") + 1] == "127.0.0.1:8000"


def test_the_web_command_takes_the_port_and_concurrency_the_harness_wants():
    expected = as_module(procfile_line("web", PORT="8123", WEB_CONCURRENCY="3"))
    expected[expected.index("--bind") + 1] = "127.0.0.1:8123"  # loopback, not 0.0.0.0
    assert procs.web_args(8123, workers=3) == expected
    assert procs.web_args(8123)[procs.web_args(8123).index("--workers") + 1] == "5"


def test_the_web_command_with_other_threads_keeps_one_connection_per_thread():
    args = procs.web_args(8123, threads=2)
    assert args[args.index("--threads") + 1] == args[args.index("--worker-connections") + 1] == "2"


def test_worker_and_gateway_change_only_the_options_asked_for():
    worker = as_module(procfile_line("worker"))
    changed = procs.worker_args(1, 4)
    assert [(a, b) for a, b in zip(worker, changed, strict=True) if a != b] == [
        ("2", "1"),
        ("8", "4"),
    ]
    assert procs.worker_args() == worker
    gateway = procs.gateway_args(9191)
    dev_gateway = as_module(procfile_line("gateway", procs.PROCFILE_DEV))
    assert gateway[:-1] == dev_gateway[:-1] and gateway[-1] == "9191"
    assert procs.scheduler_args() == ["-m", "scheduler"]


def test_a_procfile_is_parsed_and_expanded_as_a_shell_would():
    parsed = procs.parse_procfile(
        "# comment\n\nweb: serve --port ${PORT:-80} ${EXTRA}\nworker:run --n 2\n"
    )
    assert parsed == {"web": "serve --port ${PORT:-80} ${EXTRA}", "worker": "run --n 2"}
    assert procs.expand("serve --port ${PORT:-80}", {}) == "serve --port 80"
    assert procs.expand("serve --port ${PORT:-80}", {"PORT": 81}) == "serve --port 81"
    assert procs.expand("serve --port ${PORT:-80}", {"PORT": None}) == "serve --port 80"
    with pytest.raises(KeyError, match="EXTRA"):
        procs.expand(parsed["web"], {})


def test_an_option_the_procfile_does_not_set_is_refused():
    with pytest.raises(ValueError, match="--keep-alive"):
        procs.set_option(procs.worker_args(), "--keep-alive", 5)
