"""One absurd answer never loses its group (docs/money-safety.md).

A processor-side id longer than the 255 characters the schema allows
violates a CHECK (an IntegrityError, not a DataError), a NUL byte is a
DataError, a lone surrogate cannot be encoded at all; the group's outcomes
are then written one by one and the absurd one without its text, so its
neighbours' charges are recorded. Real Postgres; the outcomes are what the
workers hand to ``finish`` after their calls.
"""

from __future__ import annotations

import pytest

from paycron.domain import policy
from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult
from paycron.store import transitions
from tests.factories import insert_payment
from tests.rows import attempts_of, payment


@pytest.mark.parametrize(
    "absurd",
    [
        "pi_" + "x" * 300,  # longer than the schema allows: a CHECK
        "pi_\u0000x",  # a NUL byte: no Postgres text holds it
        "pi_\ud800x",  # a lone surrogate (JSON's "\\ud800" decodes to it): not UTF-8
    ],
    ids=["over-long", "nul", "lone-surrogate"],
)
def test_an_absurd_processor_id_does_not_lose_its_neighbours(engine, conn, config, absurd):
    rows = [insert_payment(conn, amount_minor=100 + i) for i in range(3)]
    [(claims, _)] = engine.sweep()
    held = transitions.start(engine.pool, claims, lease_seconds=config.lease_seconds)
    results = {
        rows[0]["id"]: CallResult(Outcome.SUCCEEDED, gateway_ref="ch_a"),
        rows[1]["id"]: CallResult(Outcome.SUBMITTED, gateway_ref=absurd),
        rows[2]["id"]: CallResult(Outcome.SUCCEEDED, gateway_ref="ch_c"),
    }
    done = [
        transitions.Finished(
            row,
            results[row["id"]],
            policy.decide(results[row["id"]], failures=0, in_doubt=False, config=config),
        )
        for row in held
    ]
    recorded = transitions.finish(engine.pool, done)
    assert sorted(r["moved"] for r in recorded) == [True, True, True]
    assert payment(conn, rows[0]["id"])["status"] == "COMPLETED"
    assert payment(conn, rows[2]["id"])["status"] == "COMPLETED"
    waiting = payment(conn, rows[1]["id"])
    assert waiting["status"] == "AWAITING_GATEWAY"
    assert waiting["gateway_intent_id"] == transitions.UNWRITABLE
    [attempt] = attempts_of(conn, rows[1]["id"])
    assert (attempt["outcome"], attempt["gateway_ref"]) == ("SUBMITTED", transitions.UNWRITABLE)


def test_an_over_long_id_to_confirm_again_is_dropped_not_the_outcome(engine, conn, config):
    """A retryable decline names the processor-side payment to confirm
    again; an absurd one is not kept, the decline is."""
    row = insert_payment(conn)
    [(claims, _)] = engine.sweep()
    [held] = transitions.start(engine.pool, claims, lease_seconds=config.lease_seconds)
    result = CallResult(
        Outcome.DECLINED,
        gateway_ref="pi_" + "y" * 300,
        error_code="try_again_later",
        retry_decline=True,
    )
    decision = policy.decide(result, failures=0, in_doubt=False, config=config)
    assert decision.confirm == result.gateway_ref
    [recorded] = transitions.finish(engine.pool, [transitions.Finished(held, result, decision)])
    after = payment(conn, row["id"])
    assert recorded["moved"] and (after["status"], after["key_generation"]) == ("PENDING", 2)
    assert after["gateway_intent_id"] is None
