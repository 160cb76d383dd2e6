"""The slow lane's groups (tests/conftest.py): ``--dist loadgroup`` keeps a
group's tests in one process, and every group names tests that exist (a
renamed file would quietly let two soaks run at once again)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SLOW_LANE_GROUPS, pytest_xdist_make_scheduler

ROOT = Path(__file__).resolve().parents[2]


class Options:
    """What a scheduler reads of pytest's config."""

    def __init__(self, dist: str):
        self.values = {"dist": dist, "tx": ["popen", "popen"]}

    def getvalue(self, name: str):
        return self.values[name]


def test_loadgroup_keeps_a_groups_tests_together_and_spreads_the_rest():
    scheduler = pytest_xdist_make_scheduler(config=Options("loadgroup"), log=None)
    unit = scheduler._split_scope
    soak = unit("tests/processes/test_soak_short.py::test_the_short_soak_keeps_every_promise")
    assert soak == unit("tests/processes/test_failover_short.py::test_the_short_failover")
    assert soak == unit("tests/processes/test_bench_smoke.py::test_bench_smoke[slowloris]")
    browser = unit("tests/processes/test_console_browser.py::test_refund_and_dismiss")
    assert browser == unit("tests/processes/test_console_bulk_browser.py::test_a_bulk_refund")
    assert browser != soak
    # Any other test is a unit of its own, the bench smokes' other cases too.
    alone = [
        "tests/processes/test_bench_smoke.py::test_bench_smoke[latency]",
        "tests/processes/test_bench_smoke.py::test_bench_smoke[throughput]",
        "tests/processes/test_crash.py::test_a_worker_sigkilled_mid_call_loses_nothing",
    ]
    assert len({unit(nodeid) for nodeid in alone} | {soak, browser}) == len(alone) + 2


@pytest.mark.parametrize("dist", ["load", "loadfile", "no"])
def test_other_distributions_are_xdists_own(dist):
    assert pytest_xdist_make_scheduler(config=Options(dist), log=None) is None


@pytest.mark.parametrize("nodeid", sorted(SLOW_LANE_GROUPS))
def test_each_group_names_tests_that_exist(nodeid):
    path, _, test = nodeid.partition("::")
    assert (ROOT / path).is_file(), path
    if test:
        name, _, case = test.partition("[")
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), test
        if case:
            assert f'"{case.rstrip("]")}"' in source, test
