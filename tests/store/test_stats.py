"""``paycron stats``: the operator's health numbers, through the real CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from paycron.cli import main
from tests.factories import insert_payment


def stats(config, **env) -> dict:
    result = CliRunner().invoke(
        main,
        ["stats", "--json"],
        catch_exceptions=False,
        env={"DATABASE_URL": config.database_url, "REDIS_URL": config.redis_url, **env},
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_stats_count_the_backlog_and_payments_waiting_for_another_processor(conn, config):
    due = datetime.now(UTC) - timedelta(seconds=5)
    insert_payment(conn, due_at=due)
    insert_payment(conn, due_at=due, processor="fake", in_doubt=True)
    insert_payment(conn, due_at=due, processor="stripe", in_doubt=True)
    figures = stats(config)
    assert (figures["backlog"], figures["other_processor"]) == (3, 1)
    # configured for Stripe, the payment first called at the fake is the one waiting
    figures = stats(config, GATEWAY="stripe", STRIPE_API_KEY="sk_test_x")
    assert figures["other_processor"] == 1
