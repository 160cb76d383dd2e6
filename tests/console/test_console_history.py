"""The console's history charts (read from the rollup, never attempts),
an endpoint's webhook deliveries with replay (audited, sent again by the
relay), and the payments CSV export."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import random
import time
from datetime import UTC, datetime, timedelta

import pytest

from paycron.config import Config
from paycron.store import history
from paycron.store.db import make_pool
from scheduler.relay import RelayConfig, WebhookRelay
from tests.console_support import console_config, csrf_of
from tests.factories import add_dead_letter, insert_event, insert_payment
from tests.support import SENDABLE_WITHIN_SECONDS, Clock, WebhookReceiver
from web import close_app


@pytest.fixture
def console(config):
    from web import create_app

    app = create_app(console_config(config), clock=Clock(running=True).utc)
    yield app
    close_app(app)


@pytest.fixture
def signed_in(console, make_key):
    client = console.test_client()
    token = csrf_of(client.get("/console/sign-in").get_data(as_text=True))
    key = make_key("ops-ann", admin=True)
    answer = client.post("/console/sign-in", data={"api_key": key, "csrf_token": token})
    assert answer.status_code == 302
    return client


def token_of(client) -> str:
    return csrf_of(client.get("/console/dead-letters").get_data(as_text=True))


# -- history ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1h", "24h", "7d"])
def test_each_range_draws_its_four_charts(signed_in, name):
    answer = signed_in.get("/console/history", query_string={"range": name})
    html = answer.get_data(as_text=True)
    assert answer.status_code == 200
    for title in ("Trigger lateness", "Throughput", "Dead-letter inflow", "Processor error rate"):
        assert title in html
    assert html.count("<polyline") == 7  # p50, p99, mean; calls, charged; inflow; error rate
    assert 'src="/console/static/history.js"' in html and 'id="live-refresh"' in html
    # nothing rolled up yet: the page says so rather than showing a quiet week
    assert "not rolled up yet" in html


@pytest.mark.parametrize("value", ["", "2h", "1H", "7d ", "x" * 300, "1h\x00"])
def test_a_bad_range_is_a_400(signed_in, value):
    answer = signed_in.get("/console/history", query_string={"range": value})
    assert answer.status_code == 400


def test_the_charts_show_the_rollup_and_never_read_attempts(signed_in, conn):
    now = history.clock(conn)
    minute = history.floor_minute(now) - timedelta(minutes=20)
    for i, outcome in enumerate(["SUCCEEDED", "SUCCEEDED", "RETRYABLE_ERROR", "IN_FLIGHT"]):
        row = insert_payment(conn, due_at=minute, status="PENDING")
        conn.execute(
            "INSERT INTO attempts (payment_id, attempt, gateway_key, started_at, outcome, due_at)"
            " VALUES (%s, 1, 'k', %s, %s, %s)",
            (row["id"], minute + timedelta(seconds=3 + i), outcome, minute),
        )
        if i == 2:
            add_dead_letter(conn, row)
            conn.execute(
                "UPDATE dead_letters SET created_at = %s", (minute + timedelta(seconds=9),)
            )
    history.roll_up_pending(conn, retention=timedelta(days=8), batch_minutes=2880)
    conn.execute("DELETE FROM attempts")
    conn.execute("DELETE FROM dead_letters")

    html = signed_in.get("/console/history?range=1h").get_data(as_text=True)
    assert "not rolled up yet" not in html
    shown = minute.astimezone(UTC).isoformat(sep=" ")
    row_html = html.split(f"<td>{shown}</td>", 1)[1].split("</tr>", 1)[0]
    cells = [c.split(">", 1)[1] for c in row_html.split("</td>") if ">" in c]
    # calls, charged, processor errors, error rate (1 of 3 finished), dead letters,
    # first attempts, p50 and p99 (3-6 s late: the [2 s, 5 s) and [5 s, 10 s) buckets)
    assert cells[:8] == ["4", "2", "1", "33.3%", "1", "4", "5 s", "10 s"]
    # a week's chart sums the same minute into its hour
    week = signed_in.get("/console/history?range=7d").get_data(as_text=True)
    assert '<td class="num">4</td><td class="num">2</td>' in week


def test_history_needs_a_session(console):
    answer = console.test_client().get("/console/history")
    assert answer.status_code == 302 and "/console/sign-in" in answer.headers["Location"]


# -- webhook deliveries and replay -----------------------------------------------------


#: The tests' relay: loopback receivers allowed, a short timeout.
FAST = RelayConfig.from_config(
    Config(webhook_allow_private_hosts=True), timeout_seconds=1.0, poll_seconds=0.02
)


@pytest.fixture
def relay(config):
    pool = make_pool(config, max_size=FAST.pool_size, name="relay-test")
    made = WebhookRelay(pool=pool, config=dataclasses.replace(FAST), rng=random.Random(7))
    yield made
    made.close()
    pool.close()


@pytest.fixture
def receiver(relay):
    made = WebhookReceiver()
    yield made
    made.close()


def endpoint_for(conn, url: str, payer: str = "alice") -> str:
    row = conn.execute(
        "INSERT INTO webhook_endpoints (actor, url, secret) VALUES (%s, %s, 'whsec_test')"
        " RETURNING id",
        (payer, url),
    ).fetchone()
    return str(row["id"])


def delivered(relay, receiver, count: int) -> None:
    # another database's long transaction may hold the stream back (below xmin)
    deadline = datetime.now(UTC) + timedelta(seconds=SENDABLE_WITHIN_SECONDS)
    while len(receiver.deliveries) < count:
        assert datetime.now(UTC) < deadline, "timed out"
        relay.run_once()


def test_an_endpoint_shows_its_deliveries_with_status_and_latency(signed_in, conn, relay, receiver):
    endpoint = endpoint_for(conn, receiver.url)
    event = insert_event(conn)
    delivered(relay, receiver, 1)
    row = conn.execute(
        "SELECT last_status, last_latency_ms FROM webhook_deliveries WHERE event_id = %s",
        (event,),
    ).fetchone()
    assert row["last_status"] == 200 and row["last_latency_ms"] is not None
    html = signed_in.get(f"/console/webhooks/{endpoint}").get_data(as_text=True)
    assert f'<td class="id">{event}</td>' in html
    assert f"{row['last_latency_ms']} ms" in html and "Replay" in html
    # the list links to it
    listing = signed_in.get("/console/webhooks").get_data(as_text=True)
    assert f'href="/console/webhooks/{endpoint}"' in listing


def delivered_by_hand(conn, receiver) -> tuple[str, int]:
    """An endpoint with one delivery of an event that predates it: the
    stream never sends that event (its creation snapshot saw it), so
    whatever reaches the receiver is a replay."""
    event = insert_event(conn)
    endpoint = endpoint_for(conn, receiver.url)
    conn.execute(
        "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_status,"
        " delivered_at, last_latency_ms) VALUES (%s, %s, 1, 200, now(), 12)",
        (endpoint, event),
    )
    return endpoint, event


def test_a_replay_is_audited_queued_and_sent_again_by_the_relay(
    signed_in, conn, relay, receiver, audit_lines
):
    endpoint, event = delivered_by_hand(conn, receiver)
    answer = signed_in.post(
        f"/console/webhooks/{endpoint}/deliveries/{event}/replay",
        data={"csrf_token": token_of(signed_in)},
    )
    assert answer.status_code == 302  # answered at once: the relay sends it
    [line] = [a for a in audit_lines if a["event"] == "webhook.replay"]
    assert (line["outcome"], line["actor"]) == ("success", "ops-ann")
    assert line["target"] == f"webhook endpoint {endpoint} event {event}"
    assert "waiting" in signed_in.get(f"/console/webhooks/{endpoint}").get_data(as_text=True)

    assert relay.run_once().replayed == 1
    [sent] = receiver.deliveries
    assert sent.headers["Paycron-Event-Id"] == str(event)
    assert json.loads(sent.body)["id"] == event
    assert sent.headers["Paycron-Signature"].startswith("t=")
    replay = conn.execute("SELECT status, latency_ms, done_at FROM webhook_replays").fetchone()
    assert replay["status"] == 200 and replay["done_at"] and replay["latency_ms"] is not None
    page = signed_in.get(f"/console/webhooks/{endpoint}").get_data(as_text=True)
    assert f"{replay['latency_ms']} ms" in page and "waiting" not in page
    # once: a second run sends nothing, and the stream's delivery row is as it was
    assert relay.run_once().replayed == 0 and len(receiver.deliveries) == 1
    assert conn.execute("SELECT attempts FROM webhook_deliveries").fetchone()["attempts"] == 1


def test_the_relays_loop_sends_replays_too(conn, relay, receiver):
    endpoint, event = delivered_by_hand(conn, receiver)
    conn.execute(
        "INSERT INTO webhook_replays (endpoint_id, event_id, requested_by) VALUES (%s, %s, 'ops')",
        (endpoint, event),
    )
    relay.start()
    deadline = datetime.now(UTC) + timedelta(seconds=15)
    while conn.execute("SELECT done_at FROM webhook_replays").fetchone()["done_at"] is None:
        assert datetime.now(UTC) < deadline, "timed out"
        time.sleep(0.02)
    assert [d.headers["Paycron-Event-Id"] for d in receiver.deliveries] == [str(event)]


def test_a_replay_does_not_wait_on_a_slow_endpoint(signed_in, conn, relay):
    slow = WebhookReceiver(hang_seconds=30)
    try:
        endpoint = endpoint_for(conn, slow.url)
        event = insert_event(conn)
        conn.execute(
            "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_error)"
            " VALUES (%s, %s, 1, 'deadline_exceeded')",
            (endpoint, event),
        )
        started = datetime.now(UTC)
        answer = signed_in.post(
            f"/console/webhooks/{endpoint}/deliveries/{event}/replay",
            data={"csrf_token": token_of(signed_in)},
        )
        assert answer.status_code == 302
        assert datetime.now(UTC) - started < timedelta(seconds=5)  # not the 30 s hang
        assert not slow.deliveries
    finally:
        slow.close()


def test_a_replay_of_a_deleted_endpoint_or_a_pruned_event_is_recorded_not_sent(conn, relay):
    gone = endpoint_for(conn, "http://127.0.0.1:9/hooks")
    live = endpoint_for(conn, "http://127.0.0.1:9/hooks", payer="bob")
    event = insert_event(conn)
    conn.execute(
        "INSERT INTO webhook_replays (endpoint_id, event_id, requested_by)"
        " VALUES (%s, %s, 'ops'), (%s, 999999999, 'ops')",
        (gone, event, live),
    )
    conn.execute("UPDATE webhook_endpoints SET deleted_at = now() WHERE id = %s", (gone,))
    assert relay.run_once().replayed == 2
    errors = {
        str(r["endpoint_id"]): (r["error"], r["status"])
        for r in conn.execute("SELECT endpoint_id, error, status FROM webhook_replays")
    }
    assert errors == {gone: ("endpoint_deleted", None), live: ("event_gone", None)}


@pytest.mark.parametrize(
    "path, status",
    [
        ("/console/webhooks/not-a-uuid/deliveries/1/replay", 404),
        ("/console/webhooks/{endpoint}/deliveries/not-a-number/replay", 404),
        ("/console/webhooks/{endpoint}/deliveries/424242/replay", 404),  # no such delivery
        ("/console/webhooks/{endpoint}/deliveries/99999999999999999999/replay", 404),
        ("/console/webhooks/0193a1c2-7d1e-7c4b-9a55-0c1d2e3f4a5b/deliveries/1/replay", 404),
    ],
)
def test_a_bad_replay_is_refused_and_queues_nothing(signed_in, conn, path, status):
    endpoint = endpoint_for(conn, "http://127.0.0.1:9/hooks")
    answer = signed_in.post(
        path.format(endpoint=endpoint), data={"csrf_token": token_of(signed_in)}
    )
    assert answer.status_code == status
    assert conn.execute("SELECT count(*) AS n FROM webhook_replays").fetchone()["n"] == 0


def test_a_replay_needs_its_csrf_token_and_a_live_endpoint(signed_in, conn):
    endpoint = endpoint_for(conn, "http://127.0.0.1:9/hooks")
    event = insert_event(conn)
    conn.execute(
        "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_status)"
        " VALUES (%s, %s, 1, 500)",
        (endpoint, event),
    )
    url = f"/console/webhooks/{endpoint}/deliveries/{event}/replay"
    assert signed_in.post(url).status_code in (400, 403)
    conn.execute("UPDATE webhook_endpoints SET deleted_at = now()")
    assert signed_in.post(url, data={"csrf_token": token_of(signed_in)}).status_code == 404
    assert conn.execute("SELECT count(*) AS n FROM webhook_replays").fetchone()["n"] == 0


@pytest.mark.parametrize("path", ["/console/webhooks/nope", "/console/webhooks/{random}"])
def test_an_unknown_endpoint_page_is_a_404(signed_in, path):
    import uuid

    assert signed_in.get(path.format(random=uuid.uuid4())).status_code == 404


def test_a_bad_deliveries_cursor_is_a_400(signed_in, conn):
    endpoint = endpoint_for(conn, "http://127.0.0.1:9/hooks")
    for cursor in ("x", "-5", "99999999999999999999"):
        answer = signed_in.get(f"/console/webhooks/{endpoint}", query_string={"cursor": cursor})
        assert answer.status_code == 400


# -- CSV ---------------------------------------------------------------------------------


def payer_rows(conn, payer: str, count: int, **columns) -> list[dict]:
    rows = []
    for n in range(count):
        row = insert_payment(
            conn, payer=payer, due_at=datetime.now(UTC) + timedelta(hours=n + 1), **columns
        )
        conn.execute(
            "INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, due_at)"
            " VALUES (%s, %s, '\\x00', %s, %s)",
            (payer, f"k{n}", row["id"], row["due_at"]),
        )
        rows.append(row)
    return rows


def read_csv(answer) -> list[dict]:
    assert answer.status_code == 200 and answer.mimetype == "text/csv"
    return list(csv.DictReader(io.StringIO(answer.get_data(as_text=True))))


def test_the_export_has_a_header_and_every_matching_row(signed_in, conn):
    rows = payer_rows(conn, "=acme", 3)
    answer = signed_in.get("/console/payments.csv", query_string={"payer": "=acme"})
    assert answer.get_data(as_text=True).splitlines()[0] == (
        "id,due_at,payer,payee,amount,amount_minor,currency,status,failure_reason,"
        "in_doubt,attempt,updated_at"
    )
    got = read_csv(answer)
    assert {r["id"] for r in got} == {str(r["id"]) for r in rows}
    assert got[0]["amount"] == "25.00" and got[0]["amount_minor"] == "2500"
    assert got[0]["payer"] == "'=acme"  # never a formula in a spreadsheet
    assert "attachment" in answer.headers["Content-Disposition"]


def shown_on_the_list(client, query: dict, rows: list[dict]) -> set[str]:
    html = client.get("/console/payments", query_string=query).get_data(as_text=True)
    return {str(r["id"]) for r in rows if str(r["id"]) in html}


def test_the_export_holds_every_match_of_the_lists_filter(signed_in, conn, monkeypatch):
    from web.console import export

    monkeypatch.setattr(export, "CSV_CHUNK", 2)  # several chunks: each cursor followed
    start = (datetime.now(UTC) + timedelta(days=1)).replace(
        hour=2, minute=0, second=0, microsecond=0
    )
    matching = [
        insert_payment(conn, due_at=start + timedelta(hours=h), status="FAILED", in_doubt=True)
        for h in (0, 1, 3, 5, 25)  # over both days of the range
    ]
    others = [  # each misses the filter by one field
        insert_payment(conn, due_at=start + timedelta(hours=2), status="FAILED"),
        insert_payment(conn, due_at=start + timedelta(hours=4), status="PROCESSING", in_doubt=True),
        insert_payment(conn, due_at=start - timedelta(hours=3), status="FAILED", in_doubt=True),
        insert_payment(conn, due_at=start + timedelta(days=2), status="FAILED", in_doubt=True),
    ]
    query = {
        "due_from": start.date().isoformat(),
        "due_to": (start + timedelta(days=1)).date().isoformat(),
        "status": "FAILED",
        "in_doubt": "yes",
    }
    got = read_csv(signed_in.get("/console/payments.csv", query_string=query))
    # every match, in due order, once; nothing else
    assert [r["id"] for r in got] == [str(r["id"]) for r in matching]
    assert {r["in_doubt"] for r in got} == {"true"} and {r["status"] for r in got} == {"FAILED"}
    # the list shows the same payments
    assert shown_on_the_list(signed_in, query, matching + others) == {r["id"] for r in got}
    # narrower: a processor and a failure reason; the list's `?day=` links too
    declined = insert_payment(
        conn, due_at=start + timedelta(hours=6), status="FAILED", processor="stripe"
    )
    narrower = {"due_from": start.date().isoformat(), "processor": "stripe"}
    got = read_csv(signed_in.get("/console/payments.csv", query_string=narrower))
    assert [r["id"] for r in got] == [str(declined["id"])]
    assert shown_on_the_list(signed_in, narrower, [*matching, *others, declined]) == {
        str(declined["id"])
    }
    day = {"day": start.date().isoformat(), "failure_reason": "DECLINED", "in_doubt": "no"}
    got = read_csv(signed_in.get("/console/payments.csv", query_string=day))
    assert [r["id"] for r in got] == [str(others[0]["id"]), str(declined["id"])]


def test_a_payers_export_narrows_by_the_other_fields_too(signed_in, conn, monkeypatch):
    from web.console import export

    monkeypatch.setattr(export, "CSV_CHUNK", 2)
    rows = payer_rows(conn, "acme", 5)  # due in 1..5 hours
    conn.execute(
        "UPDATE payments SET in_doubt = true WHERE id = ANY(%s)", ([r["id"] for r in rows[1:4]],)
    )
    query = {
        "payer": "acme",
        "in_doubt": "yes",
        "due_to": (rows[2]["due_at"] + timedelta(minutes=1)).isoformat(timespec="minutes"),
    }
    got = read_csv(signed_in.get("/console/payments.csv", query_string=query))
    assert [r["id"] for r in got] == [str(rows[2]["id"]), str(rows[1]["id"])]  # newest first
    assert shown_on_the_list(signed_in, query, rows) == {r["id"] for r in got}


@pytest.mark.parametrize("by", ["payer", "due range"])
def test_the_export_is_capped(signed_in, conn, monkeypatch, by):
    from web.console import export

    monkeypatch.setattr(export, "CSV_MAX_ROWS", 3)
    monkeypatch.setattr(export, "CSV_CHUNK", 2)  # and read in chunks
    rows = payer_rows(conn, "acme", 5)
    query = (
        "payer=acme"
        if by == "payer"
        else f"due_from={rows[0]['due_at'].date()}&due_to={rows[-1]['due_at'].date()}"
    )
    assert len(read_csv(signed_in.get(f"/console/payments.csv?{query}"))) == 3


@pytest.mark.parametrize(
    "query",
    [
        "",
        "in_doubt=any",
        "status=NOPE",
        "day=2026-02-30",
        "day=x",
        "payer=a%00",
        "status=FAILED&day=1",
        "payer=" + "x" * 201,
        "due_from=2026-01-05&due_to=2026-01-01",
        "due_from=2026-01-01&due_to=2026-03-01",
        "due_from=31-12-2026",
        "due_to=9999-12-31",
        "due_from=9999-12-31",
        "payer=acme&due_from=9999-12-31",
        "in_doubt=maybe",
        "processor=paypal",
        "failure_reason=BROKE",
        "id=nope",
    ],
)
def test_an_export_the_list_refuses_is_a_400(signed_in, query):
    assert signed_in.get(f"/console/payments.csv?{query}").status_code == 400


def test_the_payments_page_links_its_export(signed_in):
    html = signed_in.get("/console/payments?status=FAILED").get_data(as_text=True)
    assert 'href="/console/payments.csv?status=FAILED"' in html
