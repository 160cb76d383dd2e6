"""The fake's core in-process: the latency dice, the refusal tables, and its isolation."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys

import pytest

from gateway.fake import card, controls, errors
from gateway.fake.dice import Dice, lognormal_ms
from gateway.fake.faults import Faults
from gateway.fake.processor import FakeProcessor, Outcome

DRAWS = 20_000


def test_lognormal_draws_have_the_asked_median_and_p99() -> None:
    rng = random.Random(1)
    draws = [lognormal_ms(rng, 300, 2000, None) for _ in range(DRAWS)]
    cuts = statistics.quantiles(draws, n=100)
    assert cuts[49] == pytest.approx(300, rel=0.03)
    assert cuts[98] == pytest.approx(2000, rel=0.08)
    assert min(draws) > 0


def test_the_cap_cuts_only_the_tail() -> None:
    rng = random.Random(2)
    draws = [lognormal_ms(rng, 300, 2000, 2000) for _ in range(DRAWS)]
    assert max(draws) == 2000
    capped = sum(draw == 2000 for draw in draws) / DRAWS
    assert 0.005 < capped < 0.015  # the 1% beyond the 99th percentile
    assert statistics.median(draws) == pytest.approx(300, rel=0.03)


def test_a_median_equal_to_the_p99_is_a_constant() -> None:
    rng = random.Random(3)
    assert all(lognormal_ms(rng, 250, 250, None) == pytest.approx(250) for _ in range(100))


def test_dice_draw_the_fixed_latency_or_the_distribution() -> None:
    assert Dice(1).latency_ms(Faults(latency_ms=40)) == 40
    lognormal = Faults(
        latency_ms=40, latency_dist="lognormal", latency_p50_ms=100, latency_p99_ms=900
    )
    first, second = Dice(9), Dice(9)
    drawn = [first.latency_ms(lognormal) for _ in range(50)]
    assert [second.latency_ms(lognormal) for _ in range(50)] == drawn
    assert len(set(drawn)) == 50 and 40 not in drawn


def test_latency_draws_do_not_move_the_fault_dice() -> None:
    lognormal = Faults(latency_dist="lognormal", latency_p50_ms=100, latency_p99_ms=900)
    plain, busy = Dice(4), Dice(4)
    rolls = [plain.roll(0.5) for _ in range(100)]
    interleaved = []
    for _ in range(100):
        busy.latency_ms(lognormal)
        interleaved.append(busy.roll(0.5))
    assert interleaved == rolls


def test_every_refusal_has_one_answer_on_the_surfaces() -> None:
    refusals = set(errors.Refusal.__subclasses__())
    answered = set(card.REFUSAL_ANSWERS) | set(controls.REFUSAL_ANSWERS)
    assert answered == refusals
    assert not set(card.REFUSAL_ANSWERS) & set(controls.REFUSAL_ANSWERS)


def test_the_fake_imports_nothing_of_the_engine() -> None:
    engine = ("paycron", "web", "tasks", "scheduler", "reconciliation", "bench", "tests")
    probe = (
        "import sys, gateway.fake.__main__, gateway.fake.app; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({engine!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_stripe_surface_does_not_use_the_stripe_sdk() -> None:
    """The stub is the server the SDK is tested against: sharing its code would hide drift."""
    probe = "import sys, gateway.fake.app; print('stripe' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_webhook_dice_do_not_move_the_fault_dice() -> None:
    plain, busy = Dice(5), Dice(5)
    rolls = [plain.roll(0.5) for _ in range(100)]
    interleaved = []
    for _ in range(100):
        busy.webhook_roll(0.5)
        busy.webhook_delay_ms(100)
        interleaved.append(busy.roll(0.5))
    assert interleaved == rolls


def test_the_error_after_charge_fault_is_drawn_only_for_a_surface_that_stores_500s() -> None:
    processor = FakeProcessor(retention_seconds=60, seed=1)
    processor.configure({"error_after_charge_rate": 1.0})
    assert processor._draw(stored_errors=False).outcome is Outcome.CHARGE
    assert processor._draw(stored_errors=True).outcome is Outcome.CHARGE_THEN_ERROR
