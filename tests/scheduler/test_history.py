"""The history roller (scheduler/history.py, paycron/store/history.py):
each minute's row equals a direct count over attempts and dead letters,
rolling again never double counts, an unsettled minute is rolled again
once it settles, and the retention is kept."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from paycron.errors import ConfigError
from paycron.store import history
from paycron.store.db import make_pool
from scheduler.history import HistoryRoller
from tests.factories import add_dead_letter, insert_payment

#: Small windows keep each test to a few batches (the service's are 8 days).
RETENTION = timedelta(hours=2)
OUTCOMES = ["SUCCEEDED", "DECLINED", "RETRYABLE_ERROR", "AMBIGUOUS", "IN_FLIGHT", "RATE_LIMITED"]


def db_now(conn):
    return history.clock(conn)


def attempt(conn, payment, *, n: int, started_at, outcome: str) -> None:
    conn.execute(
        "INSERT INTO attempts (payment_id, attempt, gateway_key, started_at, finished_at, "
        "outcome, worker, due_at) VALUES (%s, %s, %s, %s, %s, %s, 'w', %s)",
        (
            payment["id"],
            n,
            f"{payment['id']}:{n}",
            started_at,
            None if outcome == "IN_FLIGHT" else started_at + timedelta(milliseconds=90),
            outcome,
            payment["due_at"],
        ),
    )


def seed(conn, now, count: int = 40) -> None:
    """Payments due over the last 90 minutes, each called once to three
    times with a spread of outcomes and lateness; a dead letter for every
    seventh, created at its last call."""
    for i in range(count):
        due = now - timedelta(minutes=90) + timedelta(seconds=131 * i)
        row = insert_payment(conn, due_at=due, status="PENDING")
        for n in range(1, 1 + i % 3 + 1):
            started = due + timedelta(seconds=(0.3 * i) + 45 * (n - 1))
            attempt(conn, row, n=n, started_at=started, outcome=OUTCOMES[(i + n) % len(OUTCOMES)])
        if i % 7 == 0:
            add_dead_letter(conn, row)
            conn.execute(
                "UPDATE dead_letters SET created_at = %s WHERE payment_id = %s",
                (started + timedelta(seconds=1), row["id"]),
            )


#: The rollup computed straight from the sources, one row per minute with anything in it.
DIRECT = """
WITH a AS (
    SELECT date_bin('1 minute', started_at, timestamptz '2000-01-01Z') AS minute,
           count(*) AS attempts,
           count(*) FILTER (WHERE attempt = 1) AS first_attempts,
           count(*) FILTER (WHERE outcome <> 'IN_FLIGHT') AS finished,
           count(*) FILTER (WHERE outcome IN ('SUCCEEDED', 'FOUND_BY_LOOKUP', 'RECONCILED'))
               AS completed,
           count(*) FILTER (WHERE outcome IN ('RETRYABLE_ERROR', 'AMBIGUOUS', 'RATE_LIMITED',
                                              'KEY_IN_USE', 'REJECTED', 'AUTH_FAILED'))
               AS processor_errors,
           round(coalesce(sum(extract(epoch FROM started_at - due_at))
                          FILTER (WHERE attempt = 1), 0)::numeric, 3) AS lateness
    FROM attempts WHERE started_at >= %(since)s AND started_at < %(until)s GROUP BY 1
), d AS (
    SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01Z') AS minute,
           count(*) AS dead_letters
    FROM dead_letters WHERE created_at >= %(since)s AND created_at < %(until)s GROUP BY 1
)
SELECT coalesce(a.minute, d.minute) AS minute, coalesce(attempts, 0) AS attempts,
       coalesce(first_attempts, 0) AS first_attempts, coalesce(finished, 0) AS finished,
       coalesce(completed, 0) AS completed, coalesce(processor_errors, 0) AS processor_errors,
       coalesce(lateness, 0) AS lateness, coalesce(dead_letters, 0) AS dead_letters
FROM a FULL JOIN d ON a.minute = d.minute
ORDER BY 1
"""

ROLLED = """
SELECT minute, attempts, first_attempts, finished, completed, processor_errors,
       round(lateness_sum_seconds::numeric, 3) AS lateness, dead_letters
FROM history_minutes
WHERE attempts > 0 OR dead_letters > 0
ORDER BY minute
"""


def test_each_minute_equals_a_direct_count_and_rolling_again_changes_nothing(conn):
    now = db_now(conn)
    seed(conn, now)
    counts = history.roll_up_pending(conn, retention=RETENTION, batch_minutes=25)
    until = history.floor_minute(now)
    assert counts.minutes == RETENTION // history.MINUTE and counts.batches == 5
    direct = conn.execute(DIRECT, {"since": until - RETENTION, "until": until}).fetchall()
    assert len(direct) > 30 and sum(r["dead_letters"] for r in direct) == 6
    assert conn.execute(ROLLED).fetchall() == direct
    # every minute has its row, zeros included
    assert conn.execute("SELECT count(*) AS n FROM history_minutes").fetchone()["n"] == 120
    # the lateness histogram holds every first attempt once
    assert conn.execute(
        "SELECT sum(first_attempts) AS n, sum((SELECT sum(b) FROM unnest(lateness_buckets) b)) AS b"
        " FROM history_minutes"
    ).fetchone() == {"n": sum(r["first_attempts"] for r in direct), "b": 40}

    # a whole range rolled again (a crash after the commit, a second roller):
    # the same rows, never twice the counts
    history.roll_up(conn, since=until - RETENTION, until=until)
    history.roll_up(conn, since=until - RETENTION, until=until)
    assert conn.execute(ROLLED).fetchall() == direct


def test_a_row_is_replaced_by_its_sources_never_added_to(conn):
    now = db_now(conn)
    minute = history.floor_minute(now) - timedelta(minutes=30)
    row = insert_payment(conn, due_at=minute, status="PENDING")
    attempt(conn, row, n=1, started_at=minute + timedelta(seconds=3), outcome="SUCCEEDED")
    history.roll_up(conn, since=minute, until=minute + history.MINUTE)
    attempt(conn, row, n=2, started_at=minute + timedelta(seconds=9), outcome="AMBIGUOUS")
    history.roll_up(conn, since=minute, until=minute + history.MINUTE)
    got = conn.execute(
        "SELECT attempts, first_attempts, completed, processor_errors, lateness_buckets "
        "FROM history_minutes WHERE minute = %s",
        (minute,),
    ).fetchone()
    assert got == {
        "attempts": 2,
        "first_attempts": 1,
        "completed": 1,
        "processor_errors": 1,
        # 3 s late: the bucket [2 s, 5 s) is the fourth
        "lateness_buckets": [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    }


def test_a_minute_rolled_before_it_settled_is_rolled_again_a_settled_one_is_not(conn):
    now = db_now(conn)
    recent = history.floor_minute(now) - timedelta(minutes=2)  # within the 5 minutes' settle
    old = history.floor_minute(now) - timedelta(minutes=40)
    fresh, settled = (insert_payment(conn, due_at=m, status="PENDING") for m in (recent, old))
    attempt(conn, fresh, n=1, started_at=recent + timedelta(seconds=1), outcome="IN_FLIGHT")
    attempt(conn, settled, n=1, started_at=old + timedelta(seconds=1), outcome="SUCCEEDED")
    history.roll_up_pending(conn, retention=RETENTION)
    rolled_at = conn.execute(
        "SELECT rolled_at FROM history_minutes WHERE minute = %s", (old,)
    ).fetchone()["rolled_at"]
    conn.execute("UPDATE attempts SET outcome = 'SUCCEEDED' WHERE payment_id = %s", (fresh["id"],))

    again = history.roll_up_pending(conn, retention=RETENTION)
    assert 0 < again.minutes <= history.DEFAULT_BATCH_MINUTES  # the unsettled tail only
    rows = {
        r["minute"]: r
        for r in conn.execute("SELECT minute, completed, rolled_at FROM history_minutes")
    }
    assert rows[recent]["completed"] == 1  # its late outcome is counted
    assert rows[old]["rolled_at"] == rolled_at  # a settled minute is left alone


def test_the_retention_is_kept_and_nothing_older_is_rolled(conn):
    now = db_now(conn)
    ancient = history.floor_minute(now) - RETENTION - timedelta(hours=3)
    conn.execute(
        "INSERT INTO history_minutes (minute, attempts, first_attempts, finished, completed, "
        "processor_errors, lateness_buckets, lateness_sum_seconds, dead_letters) "
        "VALUES (%s, 1, 1, 1, 1, 0, '{1}', 0, 0)",
        (ancient,),
    )
    row = insert_payment(conn, due_at=ancient, status="COMPLETED")
    attempt(conn, row, n=1, started_at=ancient, outcome="SUCCEEDED")
    counts = history.roll_up_pending(conn, retention=RETENTION)
    assert counts.pruned == 1
    oldest = conn.execute("SELECT min(minute) AS m, count(*) AS n FROM history_minutes").fetchone()
    assert oldest == {"m": history.floor_minute(now) - RETENTION, "n": 120}


def test_a_second_roller_skips_while_one_holds_the_lock(conn, database_url):
    from paycron.config import Config
    from paycron.store.db import connect

    with connect(Config(database_url=database_url)) as other, other.transaction():
        assert other.execute("SELECT pg_try_advisory_xact_lock(8, 0) AS held").fetchone()["held"]
        counts = history.roll_up_pending(conn, retention=RETENTION)
    assert counts.skipped and counts.minutes == 0
    assert conn.execute("SELECT count(*) AS n FROM history_minutes").fetchone()["n"] == 0


def test_the_service_rolls_a_weeks_retention_and_refuses_less(config):
    with pytest.raises(ConfigError):
        HistoryRoller(pool=None, retention=timedelta(days=6))  # type: ignore[arg-type]
    pool = make_pool(config, max_size=1, name="history-test")
    try:
        assert HistoryRoller.from_config(config, pool=pool).settle >= timedelta(
            seconds=2 * config.lease_seconds
        )
        roller = HistoryRoller(pool=pool, batch_minutes=2880)  # two days a batch: a quick test
        first = roller.run_once()
        assert first.minutes == history.DEFAULT_RETENTION // history.MINUTE
        assert roller.run_once().minutes <= 10  # then only the unsettled tail
        stop = threading.Event()
        stop.set()
        roller.run(stop)  # the loop returns at once when stopped
    finally:
        pool.close()
