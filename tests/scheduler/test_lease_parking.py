"""Parking after repeated lease expiries (issue 20, rows 3 and 7).

Only an expiry whose call was in flight counts toward ``MAX_LEASE_EXPIRIES``
(a claim that never got its attempt row made no call: a lost message or a
crash-looping deploy must not park every due payment). The expiry that
reaches the limit parks nothing by itself: the payment is claimed once more
and looked up instead of called; only then it parks, in doubt unless the
lookup was conclusive, with the documented ``failureReason`` and
``outcomeUnknown`` in its event. A late success of the hung call completes
a payment parked in doubt. Real Postgres, the fake gateway over HTTP.
"""

from __future__ import annotations

from paycron.store import transitions
from tests.factories import insert_payment
from tests.rows import attempts_of, payment


def expire(conn, payment_id):
    conn.execute(
        "UPDATE payments SET lease_until = now() - interval '1 second' WHERE id = %s",
        (payment_id,),
    )


def events(conn, payment_id) -> list[tuple[str, dict]]:
    return [
        (r["type"], r["data"])
        for r in conn.execute(
            "SELECT type, data FROM payment_events WHERE payment_id = %s ORDER BY id",
            (payment_id,),
        )
    ]


def started_call(engine, conn, **columns) -> tuple[dict, dict]:
    """A payment claimed and started (its attempt row IN_FLIGHT): the worker hangs."""
    row = insert_payment(conn, **columns)
    [(claims, _)] = engine.sweep()
    [held] = transitions.start(engine.pool, claims, lease_seconds=engine.config.lease_seconds)
    return row, held


def test_claims_that_never_got_an_attempt_row_never_park(engine, conn, gateway, config):
    row = insert_payment(conn)
    for _ in range(config.max_lease_expiries + 2):
        assert engine.sweep()  # claimed; the message is lost before any worker starts it
        expire(conn, row["id"])
        engine.reaper.run_once()
    after = payment(conn, row["id"])
    assert (after["status"], after["lease_expiries"], after["in_doubt"]) == ("PENDING", 0, False)
    assert attempts_of(conn, row["id"]) == [] and gateway.ledger() == []
    engine.drain()  # the workers are back: charged once
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert gateway.charges_per_key() == {str(row["id"]): 1}
