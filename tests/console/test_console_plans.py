"""Every console query is bounded and rides an index, and every one on
payments is pruned at plan time to the days it names (a statement pruned
only at run time plans and locks every day partition).

Plans are read with sequential scans priced out (``enable_seqscan = off``):
on the tests' few rows a scan would be cheapest anyway, so this asks
whether an index *can* answer the query, which is what holds at volume.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from paycron.sql import q
from paycron.store import partitions
from tests.factories import insert_payment, park
from tests.store.test_schema import scanned_partitions
from web.console import deliveries as console_deliveries
from web.console import history as console_history
from web.console import reads
from web.console.reads import QUERIES

NOW = datetime.now(UTC)
HOUR_AGO = NOW - timedelta(hours=1)
TODAY = NOW.date()


def plan(conn, name: str, params: dict, *, ddl: str | None = None) -> str:
    with conn.transaction(force_rollback=True):
        if ddl:
            conn.execute(ddl)
        conn.execute("SET LOCAL enable_seqscan = off")
        return "\n".join(
            r["QUERY PLAN"] for r in conn.execute("EXPLAIN (COSTS OFF) " + QUERIES[name], params)
        )


def due_bounds(day, days: int = 1):
    return {
        "due_from": partitions.day_start(day),
        "due_to": partitions.day_start(day + timedelta(days=days)),
    }


#: The payments filter's fields, each NULL for any.
DUE_FILTERS = {
    "after": uuid.UUID(int=0),
    "scan": 2000,
    "limit": 50,
    "status": None,
    "failure_reason": None,
    "in_doubt": None,
    "processor": None,
}
#: A bulk cancel's filters beyond payer and due range, each NULL for any.
PENDING_FILTERS = {"scan": 1001, "failure_reason": None, "in_doubt": None, "processor": None}
#: The dead-letters filter's fields.
LETTER_PAGE = {
    "after_created_at": "-infinity",
    "after_id": 0,
    "limit": 51,
    "before": NOW,
    "payer": None,
    "reason": None,
}


#: query -> (its parameters, the index its plan must use)
CASES = {
    "lateness_histogram": (
        {"edges": [0.5, 1.0], "since": HOUR_AGO, "until": NOW},
        r"attempts_started_idx",
    ),
    "claims_per_minute": ({"since": HOUR_AGO, "until": NOW}, r"attempts_started_idx"),
    # the due window as an id range: the day's primary key, not its heap
    "due_per_minute": (
        {
            "since": HOUR_AGO,
            "until": NOW,
            "id_from": reads.id_floor(HOUR_AGO),
            "id_to": reads.id_floor(NOW),
        },
        r"Index Only Scan using payments_p\d+_pkey",
    ),
    "payments_due": (
        {**due_bounds(TODAY), **DUE_FILTERS, "status": "FAILED"},
        r"Index Scan using payments_p\d+_pkey",
    ),
    # a bulk cancel's preview reads only PENDING rows: either partial index of
    # them (payments_sweep_idx, payments_fair_idx) holds nothing else
    "pending_due": (
        {**due_bounds(TODAY, days=31), **PENDING_FILTERS, "processor": "fake"},
        r"Index Scan using payments_p\d+_(payer_)?run_at_idx",
    ),
    "pending_of_payer": (
        {**due_bounds(TODAY), **PENDING_FILTERS, "payer": "acme", "in_doubt": False},
        r"Index Scan using payments_p\d+_payer_run_at_idx",
    ),
    "payments_by_keys": ({"ids": [uuid.uuid4()], "due_ats": [NOW]}, r"payments_p\d+_pkey"),
    "events_of": ({"id": uuid.uuid4(), "limit": 200}, r"payment_events_payment_idx"),
    "refund_of": ({"id": uuid.uuid4()}, r"refunds_pkey"),
    "open_letters_page": (LETTER_PAGE, r"Index Scan using dead_letters_open_age_idx"),
    "open_letters_of_payer": (
        {**LETTER_PAGE, "payer": "acme"},
        r"Index Scan using dead_letters_open_payer_idx",
    ),
    "open_letters_of_reason": (
        {**LETTER_PAGE, "reason": "LEASE_EXPIRED_REPEATEDLY"},
        r"Index Scan using dead_letters_open_reason_idx",
    ),
    "parked_in_doubt": (
        {"now": NOW, "limit": 50},
        r"Index Scan using payments_p\d+_due_at_id_idx"
        r"(.|\n)*dead_letters_open_\w*idx",
    ),
    "reconciliation_runs_page": (
        {"before_id": 2**62, "limit": 51, "day_before": None, "mismatches_only": False},
        r"Index Scan Backward using reconciliation_runs_pkey",
    ),
    "reconciliation_run": ({"id": 1}, r"reconciliation_runs_pkey"),
    "reconciliation_items_page": (
        {"run_id": 1, "after_id": 0, "limit": 51},
        r"reconciliation_items_run_idx",
    ),
    "webhook_backlog_page": (
        {
            "after_actor": "",
            "after_created_at": "-infinity",
            "after_id": uuid.UUID(int=0),
            "count_cap": 1001,
            "limit": 51,
            "payer": None,
        },
        r"webhook_endpoints_actor_idx(.|\n)*payment_events_feed_idx(.|\n)*"
        r"webhook_deliveries_pkey",
    ),
}


def test_every_console_query_has_a_case():
    assert set(QUERIES) == set(CASES) | {"awaiting_gateway"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_query_rides_an_index(conn, name):
    params, index = CASES[name]
    text = plan(conn, name, params)
    assert "Seq Scan" not in text, text
    assert re.search(index, text), text
    if name not in ("events_of", "refund_of", "reconciliation_run", "payments_by_keys"):
        assert "Limit" in text or "Aggregate" in text, text  # bounded


def test_awaiting_gateway_rides_the_attention_index(conn):
    params = {"now": NOW, "limit": 50}
    text = plan(conn, "awaiting_gateway", params)
    assert "Seq Scan" not in text and re.search(r"payments_p\d+_due_at_id_idx", text), text


def test_parked_in_doubt_lists_only_what_waits(conn):
    waiting = park(conn, in_doubt=True)
    park(conn)  # parked, not in doubt
    insert_payment(conn, status="FAILED", in_doubt=False)
    insert_payment(conn, in_doubt=True)  # pending, in doubt: the engine's, not a human's
    closed = park(conn, in_doubt=True)
    conn.execute(
        "UPDATE dead_letters SET resolution = 'DISMISSED', resolved_at = now() "
        "WHERE payment_id = %s",
        (closed["id"],),
    )
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        rows = reads.waiting(conn, "parked_in_doubt", now=datetime.now(UTC))
    assert [r["id"] for r in rows] == [waiting["id"]]


def partitions_planned(conn, name: str, params: dict) -> set[str]:
    with conn.transaction(force_rollback=True):
        lines = [
            r["QUERY PLAN"]
            for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + QUERIES[name], params)
        ]
    return scanned_partitions(lines)


def test_payment_queries_touch_only_the_days_they_name(conn):
    future_day = TODAY + timedelta(days=3)
    row = insert_payment(conn, due_at=partitions.day_start(future_day) + timedelta(hours=1))
    assert partitions_planned(
        conn, "payments_due", {**due_bounds(future_day), **DUE_FILTERS, "scan": 10, "limit": 5}
    ) == {partitions.partition_name(future_day)}
    # a due range of several days plans those days and no other
    two_days = {partitions.partition_name(future_day + timedelta(days=n)) for n in (0, 1)}
    assert (
        partitions_planned(
            conn,
            "payments_due",
            {**due_bounds(future_day, days=2), **DUE_FILTERS, "processor": "fake"},
        )
        == two_days
    )
    assert partitions_planned(
        conn, "payments_by_keys", {"ids": [row["id"]], "due_ats": [row["due_at"]]}
    ) == {partitions.partition_name(future_day)}
    # a bulk cancel's preview, by due range or by payer within one
    for name in ("pending_due", "pending_of_payer"):
        params = {**due_bounds(future_day, days=2), **PENDING_FILTERS, "payer": "alice"}
        assert partitions_planned(conn, name, params) == two_days, name
    assert partitions_planned(conn, "due_per_minute", CASES["due_per_minute"][0]) <= {
        partitions.partition_name(HOUR_AGO.date()),
        partitions.partition_name(TODAY),
    }
    # the waiting lists read every day up to now, and no day after it
    past_and_today = {
        partitions.partition_name(d) for d in partitions.existing_days(conn) if d <= TODAY
    }
    assert partitions_planned(conn, "parked_in_doubt", {"now": NOW, "limit": 5}) == past_and_today


#: The bulk actions' and audit page's statements (paycron/store/sql/console_bulk.sql):
#: query -> (its parameters, the index its plan must use).
BULK_CASES = {
    "bulk_next_item": (
        {"request_id": 1},
        r"console_bulk_items_(todo_idx|pkey)",
    ),
    "bulk_items_page": (
        {"request_id": 1, "after": uuid.UUID(int=0), "limit": 51},
        r"Index Scan using console_bulk_items_pkey",
    ),
    "bulk_awaiting_page": ({"limit": 100}, r"console_bulk_requests_open_idx"),
    "bulk_running": ({"limit": 20}, r"console_bulk_requests_open_idx"),
    "bulk_expire": ({}, r"console_bulk_requests_open_idx"),
    "console_audit_page": (
        {"before_id": 2**62, "limit": 51},
        r"Index Scan Backward using console_audit_pkey",
    ),
}


@pytest.mark.parametrize("name", sorted(BULK_CASES))
def test_each_bulk_statement_rides_an_index(conn, name):
    from paycron.sql import q

    params, index = BULK_CASES[name]
    with conn.transaction(force_rollback=True):
        # bitmap scans priced out too: on a new table's guessed statistics
        # one looks cheap, at volume the ordered index scan under the LIMIT is
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        text = "\n".join(
            r["QUERY PLAN"] for r in conn.execute("EXPLAIN (COSTS OFF) " + q(name), params)
        )
    assert "Seq Scan" not in text, text
    assert re.search(index, text), text


def test_a_payer_and_a_reason_ride_one_of_their_indexes(conn):
    params = {**LETTER_PAGE, "payer": "acme", "reason": "RETRIES_EXHAUSTED"}
    text = plan(conn, "open_letters_of_payer", params)
    assert "Seq Scan" not in text and "Sort" not in text, text
    assert re.search(r"Index Scan using dead_letters_open_(payer|reason)_idx", text), text


def test_a_webhooks_payer_rides_the_endpoints_index(conn):
    params = {**CASES["webhook_backlog_page"][0], "payer": "acme"}
    text = plan(conn, "webhook_backlog_page", params)
    assert "Seq Scan" not in text, text
    # the payer is the index's leading column: only their endpoints are read
    # (and sorted on the id the index lacks), then cut to the page
    assert re.search(
        r"Index Scan using webhook_endpoints_actor_idx on webhook_endpoints\s+"
        r"Index Cond: \(.*\(actor = 'acme'::text\)\)",
        text,
    ), text


def test_filtered_reconciliation_runs_ride_an_index(conn):
    params = {"before_id": 2**62, "limit": 51, "day_before": TODAY, "mismatches_only": True}
    text = plan(conn, "reconciliation_runs_page", params)
    assert "Seq Scan" not in text, text
    assert re.search(r"reconciliation_runs_(pkey|day_idx)", text), text


# -- history and webhook deliveries (web/console/history.sql, the roller's SQL) ----------

WEEK_AGO = NOW - timedelta(days=7)


def plan_sql(conn, sql: str, params: dict) -> str:
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        return "\n".join(
            r["QUERY PLAN"] for r in conn.execute("EXPLAIN (COSTS OFF) " + sql, params)
        )


#: query -> (its SQL, its parameters, the index its plan must use)
HISTORY_CASES = {
    "history_range": (
        console_history.QUERIES["history_range"],
        {"since": WEEK_AGO, "until": NOW, "step_seconds": 3600.0},
        r"history_minutes_pkey",
    ),
    "history_lateness_range": (
        console_history.QUERIES["history_lateness_range"],
        {"since": WEEK_AGO, "until": NOW, "step_seconds": 3600.0},
        r"history_minutes_pkey",
    ),
    "webhook_endpoint": (
        console_deliveries.QUERIES["webhook_endpoint"],
        {"id": uuid.uuid4()},
        r"webhook_endpoints_pkey",
    ),
    "webhook_deliveries_page": (
        console_deliveries.QUERIES["webhook_deliveries_page"],
        {"endpoint_id": uuid.uuid4(), "before_event_id": 2**62, "limit": 51},
        r"Index Scan Backward using webhook_deliveries_pkey",
    ),
    "webhook_replays_of": (
        console_deliveries.QUERIES["webhook_replays_of"],
        {"endpoint_id": uuid.uuid4(), "limit": 20},
        r"webhook_replays_endpoint_idx",
    ),
    "webhook_replay_request": (
        console_deliveries.QUERIES["webhook_replay_request"],
        {"endpoint_id": uuid.uuid4(), "event_id": 1, "requested_by": "ops"},
        r"webhook_deliveries_pkey(.|\n)*payment_events_pkey",
    ),
    # the roller's reads: a minute range of attempts and dead letters, the
    # retention's minutes against the primary key
    "history_attempts_by_minute": (
        q("history_attempts_by_minute"),
        {"since": HOUR_AGO, "until": NOW, "edges": [0.5, 1.0]},
        r"attempts_started_idx",
    ),
    "history_dead_letters_by_minute": (
        q("history_dead_letters_by_minute"),
        {"since": HOUR_AGO, "until": NOW},
        r"dead_letters_created_idx",
    ),
    "history_first_pending": (
        q("history_first_pending"),
        {"since": WEEK_AGO, "until": NOW, "settle_seconds": 300.0},
        r"history_minutes_pkey",
    ),
    "history_prune": (q("history_prune"), {"before": WEEK_AGO}, r"history_minutes_pkey"),
    "webhook_claim_replays": (
        q("webhook_claim_replays"),
        {"limit": 4, "lease_seconds": 60.0},
        r"webhook_replays_waiting_idx",
    ),
}


def test_every_history_and_delivery_query_has_a_case():
    assert set(console_history.QUERIES) | set(console_deliveries.QUERIES) <= set(HISTORY_CASES)


@pytest.mark.parametrize("name", sorted(HISTORY_CASES))
def test_each_history_query_rides_an_index(conn, name):
    sql, params, index = HISTORY_CASES[name]
    text = plan_sql(conn, sql, params)
    assert "Seq Scan" not in text, text
    assert re.search(index, text), text


def test_the_charts_never_read_attempts(conn):
    for name in ("history_range", "history_lateness_range"):
        sql, params, _ = HISTORY_CASES[name]
        assert "attempts " not in plan_sql(conn, sql, params).replace("first_attempts", "")
