"""The fake's core in-process: the refusal tables, and its isolation."""

from __future__ import annotations

import subprocess
import sys

from gateway.fake import card, controls, errors


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
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
