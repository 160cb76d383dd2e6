"""Times the database wrote are compared on the database's clock, never on
the app host's: a host whose clock runs fast would take a lookup's *none*
as conclusive inside the settle margin (and move the key while a call can
still land), or look up a payment whose key the processor still holds. The
app host here runs fifteen minutes fast (its ``datetime.now`` is skewed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from paycron.engine import dead_letters, execution, lookups
from paycron.errors import DeadLetterActionRefused
from paycron.processors.factory import build_processor
from paycron.store.clock import DatabaseClock, database_now
from paycron.store.db import make_pool
from tests.factories import insert_payment, park
from tests.inprocess import Engine
from tests.rows import attempts_of, payment

#: How far the app host's wall clock runs ahead of the database's.
SKEW = timedelta(minutes=15)


class FastHost(datetime):
    """``datetime`` on an app host whose clock runs SKEW fast."""

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) + SKEW


def test_a_redrive_on_a_fast_host_still_waits_for_the_bound(conn, config, gateway, monkeypatch):
    monkeypatch.setattr(lookups, "datetime", FastHost)
    bound = database_now(conn) + timedelta(minutes=10)  # on the host's clock: 5 min ago
    row = park(conn, in_doubt=True, calls_land_by=bound)
    adapter = build_processor(config)
    try:
        with pytest.raises(DeadLetterActionRefused, match="may still land"):
            dead_letters.redrive(conn, adapter, row["id"], actor="ops-ann")
    finally:
        adapter.close()
    again = payment(conn, row["id"])
    assert (again["status"], again["in_doubt"], again["key_generation"]) == ("FAILED", True, 1)


def test_a_fast_host_does_not_take_a_held_key_for_a_forgotten_one(
    conn, config, gateway, monkeypatch
):
    """In doubt for a while less than the key retention less the in-flight
    bound (on the database's clock): the processor still holds its key, so
    the payment is called under it, not looked up and moved to a new key."""
    monkeypatch.setattr(execution, "datetime", FastHost)
    keep = config.gateway_key_retention_seconds - config.in_flight_bound_seconds
    now = database_now(conn)
    row = insert_payment(
        conn,
        in_doubt=True,
        in_doubt_since=now - timedelta(seconds=keep) + timedelta(minutes=5),
        calls_land_by=now - timedelta(seconds=1),
    )
    engine = Engine(config)
    try:
        engine.drain()
    finally:
        engine.close()
    assert [a["outcome"] for a in attempts_of(conn, row["id"])] == ["SUCCEEDED"]
    assert gateway.charges_per_key() == {str(row["id"]): 1}  # under the key it held


def test_the_database_clock_is_read_again_and_carried_on_the_monotonic_clock(config):
    ticks = [100.0]
    pool = make_pool(config, max_size=1, name="clock-test")
    try:
        clock = DatabaseClock(pool, refresh_seconds=30, monotonic=lambda: ticks[0])
        first = clock.now()
        assert abs((first - datetime.now(UTC)).total_seconds()) < 5  # the same host here
        ticks[0] += 10  # carried forward, not read
        assert clock.now() - first == timedelta(seconds=10)
        ticks[0] += 60  # read again: the database's clock has moved on a little, not 70 s
        assert abs((clock.now() - datetime.now(UTC)).total_seconds()) < 5
    finally:
        pool.close()
