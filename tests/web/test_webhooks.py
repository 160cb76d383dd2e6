"""Webhook endpoints (API) and the relay, against real local HTTP receivers
that verify each signature with the endpoint's secret."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import random
import time
import uuid

import psycopg
import pytest
from psycopg.rows import dict_row

from devtools.procs import free_port
from paycron.config import Config
from paycron.errors import ConfigError
from paycron.store import events, webhooks
from paycron.store.db import make_pool
from scheduler.relay import RelayConfig, WebhookRelay
from tests.factories import insert_event
from tests.support import SENDABLE_WITHIN_SECONDS, WebhookReceiver, wait_until_sendable
from web import close_app

URL = "/v1/webhook-endpoints"
#: Fast relay settings: a 1 s timeout, backoff from 50 ms doubling to 400 ms.
FAST = RelayConfig.from_config(
    Config(webhook_allow_private_hosts=True),  # the receivers listen on loopback
    timeout_seconds=1.0,
    lease_seconds=10.0,
    poll_seconds=0.02,
    backoff_base_seconds=0.05,
    backoff_max_seconds=0.4,
)
#: Another database's long transaction may hold the snapshot's xmin back
#: (tests.support): waits for deliveries allow this long.
SETTLE_SECONDS = SENDABLE_WITHIN_SECONDS


def verify(secret: str, header: str, body: bytes, *, tolerance: float = 300) -> bool:
    """The receiver's side of the scheme, written from its description."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    timestamp = int(parts["t"])
    expected = hmac.new(
        secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - timestamp) <= tolerance


def signed_with(secret: str):
    """A receiver's ``verify``: does a delivery carry ``secret``'s signature?"""
    return lambda headers, body: verify(secret, headers["Paycron-Signature"], body)


def event_ids(receiver: WebhookReceiver, *, answered_ok: bool = True) -> list[int]:
    """Event ids in arrival order (by default only the deliveries answered 200)."""
    return [event["id"] for event in receiver.events(answered_ok=answered_ok)]


@pytest.fixture
def relays(config):
    """make(**settings) -> a WebhookRelay with its own pool; all closed after."""
    made = []

    def make(**settings) -> WebhookRelay:
        relay_config = dataclasses.replace(FAST, **settings)
        pool = make_pool(config, max_size=relay_config.pool_size, name="relay-test")
        relay = WebhookRelay(pool=pool, config=relay_config, rng=random.Random(7))
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.close()
        relay.pool.close()


@pytest.fixture
def receivers(relays):
    """make(**behaviour) -> a running WebhookReceiver. Closed before the relays
    (this fixture depends on theirs), so a hung request ends at once."""
    made = []

    def make(**behaviour) -> WebhookReceiver:
        made.append(WebhookReceiver(**behaviour))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def register(client, headers, receiver: WebhookReceiver) -> str:
    response = client.post(URL, json={"url": receiver.url}, headers=headers)
    assert response.status_code == 201, response.get_json()
    receiver.verify = signed_with(response.get_json()["secret"])
    return response.get_json()["id"]


def until(predicate, relay: WebhookRelay | None = None, timeout: float = SETTLE_SECONDS):
    """Runs ``relay.run_once`` (if given) until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        if relay is not None:
            relay.run_once()
        time.sleep(0.01)


def deliveries(conn, endpoint_id: str) -> list[dict]:
    return conn.execute(
        "SELECT event_id, attempts, last_status, last_error, delivered_at"
        " FROM webhook_deliveries WHERE endpoint_id = %s ORDER BY event_id",
        (endpoint_id,),
    ).fetchall()


# -- the API -------------------------------------------------------------------


def test_create_shows_the_secret_once_and_the_list_never(client, alice):
    response = client.post(URL, json={"url": "https://example.com/hooks?x=1"}, headers=alice)
    assert response.status_code == 201
    created = response.get_json()
    assert list(created) == ["id", "url", "secret", "createdAt"]
    assert created["url"] == "https://example.com/hooks?x=1"
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert created["createdAt"].endswith("+00:00")
    assert response.headers["Location"] == f"{URL}/{created['id']}"

    listed = client.get(URL, headers=alice).get_json()["data"]
    assert listed == [{k: created[k] for k in ("id", "url", "createdAt")}]
    assert created["secret"] not in client.get(URL, headers=alice).get_data(as_text=True)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "ftp://example.com/hooks"}, "url"),
        ({"url": "javascript:alert(1)"}, "url"),
        ({"url": "example.com/hooks"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "http://"}, "url"),
        ({"url": 5}, "url"),
        ({"url": "https://example.com/" + "a" * 2048}, "url"),
        ({}, "url"),
        ({"url": "https://example.com/", "secret": "mine"}, "secret"),
    ],
)
def test_create_refuses_anything_but_an_http_or_https_url(client, alice, body, field):
    response = client.post(URL, json=body, headers=alice)
    assert response.status_code == 400
    problem = response.get_json()
    assert problem["code"] == "VALIDATION_FAILED" and field in problem["errors"]
    assert client.get(URL, headers=alice).get_json()["data"] == []


def test_create_needs_a_key_and_json(client, alice):
    assert client.post(URL, json={"url": "https://example.com/"}).status_code == 401
    response = client.post(
        URL,
        data="url=https://example.com/",
        headers=alice,
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 415


def test_delete_is_scoped_to_its_owner(client, alice, bob):
    mine = client.post(URL, json={"url": "https://a.example/"}, headers=alice).get_json()["id"]
    kept = client.post(URL, json={"url": "https://b.example/"}, headers=alice).get_json()["id"]

    assert client.delete(f"{URL}/{mine}", headers=bob).status_code == 404
    for path_id in ("not-a-uuid", str(uuid.uuid4())):
        assert client.delete(f"{URL}/{path_id}", headers=alice).status_code == 404
    assert len(client.get(URL, headers=alice).get_json()["data"]) == 2

    assert client.delete(f"{URL}/{mine}", headers=alice).status_code == 204
    assert client.delete(f"{URL}/{mine}", headers=alice).status_code == 204  # repeatable
    assert [e["id"] for e in client.get(URL, headers=alice).get_json()["data"]] == [kept]
    assert client.get(URL, headers=bob).get_json()["data"] == []


def test_the_feed_shows_each_event_as_webhooks_post_it(client, alice, conn):
    """The feed dumps events through its EventSchema, the relay posts
    ``paycron.store.events.to_wire``: one wire shape, as the document says."""
    ids = [insert_event(conn, type=t) for t in ("payment.created", "payment.processing")]
    feed: list[dict] = []

    def read_both() -> bool:
        feed[:] = client.get("/v1/events", headers=alice).get_json()["data"]
        return len(feed) == 2

    until(read_both)
    rows = conn.execute(
        "SELECT * FROM payment_events WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    assert feed == [events.to_wire(row) for row in rows]


# -- the relay -----------------------------------------------------------------


def test_events_arrive_signed_in_order_from_the_endpoints_creation_on(
    client, alice, conn, relays, receivers
):
    earlier = insert_event(conn)
    receiver = receivers()
    endpoint = register(client, alice, receiver)
    types = [
        "payment.created",
        "payment.processing",
        "payment.pending",
        "payment.processing",
        "payment.completed",
    ]
    ids = [insert_event(conn, type=t) for t in types]
    relay = relays()

    until(lambda: len(receiver.deliveries) >= 5, relay)
    assert relay.run_once().delivered == 0  # nothing left
    assert event_ids(receiver) == ids and earlier not in event_ids(receiver)
    assert all(r.verified for r in receiver.deliveries)
    assert all(r.headers["Content-Type"] == "application/json" for r in receiver.deliveries)
    assert [int(r.headers["Paycron-Event-Id"]) for r in receiver.deliveries] == ids
    first = receiver.deliveries[0].json()
    assert set(first) == {"id", "type", "paymentId", "status", "attempt", "data", "createdAt"}
    assert [r.json()["type"] for r in receiver.deliveries] == types

    rows = deliveries(conn, endpoint)
    assert [r["event_id"] for r in rows] == ids
    assert all(r["attempts"] == 1 and r["last_status"] == 200 and r["delivered_at"] for r in rows)


def test_a_forged_signature_does_not_verify(client, alice, conn, relays, receivers):
    receiver = receivers()
    register(client, alice, receiver)
    insert_event(conn)
    relay = relays()
    until(lambda: receiver.deliveries, relay)
    receiver.verify = signed_with(webhooks.new_secret())  # another endpoint's secret
    insert_event(conn)
    until(lambda: len(receiver.deliveries) == 2, relay)
    assert [r.verified for r in receiver.deliveries] == [True, False]


def test_a_new_endpoint_gets_what_commits_after_its_creation(
    client, alice, conn, database_url, relays, receivers
):
    receiver = receivers()
    with psycopg.connect(database_url, row_factory=dict_row) as slow:
        open_before = insert_event(slow)  # its transaction is open while the endpoint is made
        committed_before = insert_event(conn)  # committed before, with a larger txid
        endpoint = register(client, alice, receiver)
        slow.commit()  # commits after the endpoint exists
    after = insert_event(conn)

    until(lambda: len(receiver.deliveries) >= 2, relays())
    assert event_ids(receiver) == [open_before, after]
    assert committed_before not in [r["event_id"] for r in deliveries(conn, endpoint)]


def test_the_relay_never_skips_an_event_that_commits_late(
    client, alice, conn, database_url, relays, receivers
):
    receiver = receivers()
    register(client, alice, receiver)
    relay = relays()
    with psycopg.connect(database_url, row_factory=dict_row) as slow:
        early = insert_event(slow)  # its transaction stays open
        late = insert_event(conn)  # committed after it
        for _ in range(5):
            relay.run_once()
            time.sleep(0.05)
        assert receiver.deliveries == []  # the late one waits behind the open transaction
        slow.commit()
    until(lambda: len(receiver.deliveries) >= 2, relay)
    assert event_ids(receiver) == [early, late]


def test_a_failing_receiver_gets_every_event_later_with_backoff(
    client, alice, conn, relays, receivers
):
    receiver = receivers(statuses=[500] * 3)
    endpoint = register(client, alice, receiver)
    ids = [insert_event(conn) for _ in range(3)]
    # Backoffs of 1.6-2 s: long enough to see one from here on a loaded machine.
    relay = relays(backoff_base_seconds=2.0, backoff_max_seconds=2.0)

    until(lambda: receiver.deliveries, relay)
    head = deliveries(conn, endpoint)
    assert [
        (r["event_id"], r["attempts"], r["last_status"], r["last_error"], r["delivered_at"])
        for r in head
    ] == [(ids[0], 1, 500, "http_500", None)]
    waiting = conn.execute(
        "SELECT next_attempt_at > now() AS backing_off, lease_owner"
        " FROM webhook_endpoints WHERE id = %s",
        (endpoint,),
    ).fetchone()
    assert waiting == {"backing_off": True, "lease_owner": None}

    until(lambda: len(receiver.deliveries) >= 6, relay)
    # Every failure went to the same head event; then all arrived in order.
    assert event_ids(receiver, answered_ok=False) == [ids[0]] * 4 + ids[1:]
    assert event_ids(receiver) == ids
    # Backoff: 50 ms doubling, each at least 80% of its step (jitter is ±20%).
    at = [r.at for r in receiver.deliveries[:4]]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert all(gap >= 0.05 * 2**i * 0.8 for i, gap in enumerate(gaps)), gaps
    rows = deliveries(conn, endpoint)
    assert [(r["event_id"], r["attempts"], r["last_status"], r["last_error"]) for r in rows] == [
        (ids[0], 4, 200, None),
        (ids[1], 1, 200, None),
        (ids[2], 1, 200, None),
    ]
    assert all(r["delivered_at"] for r in rows)


def test_an_unreachable_endpoint_is_recorded_and_retried(client, alice, conn, relays):
    response = client.post(URL, json={"url": f"http://127.0.0.1:{free_port()}/"}, headers=alice)
    endpoint = response.get_json()["id"]
    event = insert_event(conn)
    relay = relays()

    until(lambda: deliveries(conn, endpoint), relay)
    until(lambda: deliveries(conn, endpoint)[0]["attempts"] >= 2, relay)
    [row] = deliveries(conn, endpoint)
    assert row["event_id"] == event and row["last_status"] is None
    assert row["last_error"] and row["delivered_at"] is None


def test_a_hanging_endpoint_does_not_delay_another_payers(
    client, alice, bob, conn, relays, receivers
):
    hung = receivers(hang_seconds=30)
    healthy = receivers()
    hung_endpoint = register(client, alice, hung)
    register(client, bob, healthy)
    relay = relays(timeout_seconds=3.0, lease_seconds=12.0, concurrency=4)
    relay.start()

    wait_until_sendable(conn, insert_event(conn, payer="alice"))
    until(lambda: hung.deliveries)  # a worker is now stuck on alice's endpoint
    for n in range(1, 4):
        # Timed from when the relay can read it: another database's long
        # transaction may hold an event back first (tests.support).
        sendable = wait_until_sendable(conn, insert_event(conn, payer="bob"))
        until(lambda n=n: len(healthy.deliveries) >= n)
        assert healthy.deliveries[-1].at - sendable < 1.5  # well inside the 3 s hang
        time.sleep(0.2)
    # Meanwhile alice's request timed out and is waiting to be retried.
    until(lambda: deliveries(conn, hung_endpoint))
    [row] = deliveries(conn, hung_endpoint)
    # The socket's read timeout and the delivery's deadline are both 3 s: either ends it.
    assert row["last_status"] is None
    assert row["last_error"] in ("ReadTimeoutError", "deadline_exceeded")


def test_deleted_endpoints_receive_nothing(client, alice, conn, relays, receivers):
    before_any, later, control = receivers(), receivers(), receivers()
    deleted_early = register(client, alice, before_any)
    assert client.delete(f"{URL}/{deleted_early}", headers=alice).status_code == 204
    deleted_later = register(client, alice, later)
    register(client, alice, control)  # stays: proves the relay saw every event
    first = insert_event(conn)
    relay = relays()
    until(lambda: later.deliveries and control.deliveries, relay)

    assert client.delete(f"{URL}/{deleted_later}", headers=alice).status_code == 204
    second = insert_event(conn)
    until(lambda: len(control.deliveries) == 2, relay)
    relay.run_once()
    assert event_ids(control) == [first, second]
    assert event_ids(later) == [first]
    assert before_any.deliveries == [] and deliveries(conn, deleted_early) == []


def test_another_payers_events_never_reach_an_endpoint(client, alice, bob, conn, relays, receivers):
    alices, bobs = receivers(), receivers()
    register(client, alice, alices)
    register(client, bob, bobs)
    expected = {"alice": [], "bob": []}
    for payer in ("alice", "bob", "bob", "alice", "bob", "alice"):
        expected[payer].append(insert_event(conn, payer=payer))
    relay = relays()

    until(lambda: len(alices.deliveries) + len(bobs.deliveries) >= 6, relay)
    time.sleep(0.1)
    relay.run_once()
    assert event_ids(alices) == expected["alice"]
    assert event_ids(bobs) == expected["bob"]


def test_two_relays_deliver_each_event_once_per_endpoint(
    client, alice, bob, conn, relays, receivers
):
    endpoints = {"alice-1": receivers(), "alice-2": receivers(), "bob": receivers()}
    for name, receiver in endpoints.items():
        register(client, alice if name.startswith("alice") else bob, receiver)
    # Small batches and two workers each: the endpoints change hands often.
    for relay in (relays(batch=3, concurrency=2), relays(batch=3, concurrency=2)):
        relay.start()
    expected = {"alice": [], "bob": []}
    for i in range(60):
        payer = "alice" if i % 3 else "bob"
        expected[payer].append(insert_event(conn, payer=payer))
        if i % 10 == 0:
            time.sleep(0.02)

    until(lambda: sum(len(r.deliveries) for r in endpoints.values()) >= 100)
    time.sleep(0.3)  # anything duplicated would arrive now
    for name, receiver in endpoints.items():
        assert event_ids(receiver) == expected[name.split("-")[0]], name
        assert all(r.verified for r in receiver.deliveries)
    attempts = conn.execute(
        "SELECT attempts, count(*) AS n FROM webhook_deliveries GROUP BY attempts"
    ).fetchall()
    assert attempts == [{"attempts": 1, "n": 100}]


def test_a_leased_endpoint_waits_for_its_lease_to_end(
    client, alice, conn, database_url, relays, receivers
):
    receiver = receivers()
    register(client, alice, receiver)
    event = insert_event(conn)
    with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as crashed:
        until(lambda: webhooks.claim_endpoints(crashed, limit=5, lease_seconds=0.5))
    relay = relays()
    assert relay.run_once().endpoints == 0  # held by a relay that died holding it
    until(lambda: receiver.deliveries, relay)  # the lease ends in the database's time
    assert event_ids(receiver) == [event]


def test_a_relay_whose_lease_ran_out_moves_no_cursor(client, alice, conn, database_url):
    endpoint = client.post(URL, json={"url": "https://example.com/"}, headers=alice).get_json()
    event = insert_event(conn)
    claimed = []
    with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as db:
        until(lambda: webhooks.claim_endpoints(db, limit=1, lease_seconds=0.1))
        [stale] = conn.execute(
            "SELECT id AS endpoint_id, url, secret, lease_owner AS owner FROM webhook_endpoints"
        ).fetchall()

        def claim_again():  # as soon as the first lease ends, in the database's time
            claimed[:] = webhooks.claim_endpoints(db, limit=1, lease_seconds=10)
            return claimed

        until(claim_again)
        [current] = claimed
        [pending] = webhooks.pending_events(db, current, limit=10)
        assert pending["id"] == event
        assert (
            webhooks.record_delivered(db, webhooks.Lease(**stale), pending, 200)
            is webhooks.Recorded.LEASE_LOST
        )
        # The delivery happened, so it is recorded; the stream is still the new holder's.
        assert [r["event_id"] for r in deliveries(db, endpoint["id"])] == [event]
        assert [e["id"] for e in webhooks.pending_events(db, current, limit=10)] == [event]
        assert webhooks.record_delivered(db, current, pending, 200) is webhooks.Recorded.MOVED
        assert webhooks.pending_events(db, current, limit=10) == []


def test_backoff_doubles_to_its_cap_with_jitter():
    rng = random.Random(1)
    plain = [webhooks.backoff(n, base=1, cap=600, jitter=0, rng=rng) for n in range(1, 13)]
    assert plain == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]
    assert webhooks.backoff(10_000, base=1, cap=600, jitter=0.2, rng=rng) <= 600
    jittered = [webhooks.backoff(3, base=1, cap=600, jitter=0.2, rng=rng) for _ in range(200)]
    assert 3.2 <= min(jittered) < max(jittered) <= 4.8


def test_the_relay_refuses_a_timeout_its_lease_cannot_cover():
    with pytest.raises(ConfigError):
        RelayConfig.from_config(Config(), timeout_seconds=5, lease_seconds=10)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://192.168.0.10/",
    ],
)
def test_internal_destinations_are_refused_by_default(config, alice, conn, url):
    from web import create_app

    app = create_app(config.with_overrides(webhook_allow_private_hosts=False))
    try:
        response = app.test_client().post(URL, json={"url": url}, headers=alice)
    finally:
        close_app(app)
    assert response.status_code == 400
    assert "url" in response.get_json()["errors"]
    assert conn.execute("SELECT count(*) AS n FROM webhook_endpoints").fetchone()["n"] == 0


def test_the_relay_refuses_an_internal_destination_too(client, alice, conn, relays, receivers):
    """An endpoint stored before the rule (or re-pointed by DNS) is not called."""
    receiver = receivers()
    endpoint = register(client, alice, receiver)  # this app allows loopback; the relay not
    event = insert_event(conn)
    relay = relays(allow_private_hosts=False)

    until(lambda: deliveries(conn, endpoint), relay)
    [row] = deliveries(conn, endpoint)
    assert (row["event_id"], row["last_status"], row["last_error"], row["delivered_at"]) == (
        event,
        None,
        "forbidden_destination",
        None,
    )
    assert receiver.deliveries == []


def test_only_hosts_resolving_to_public_addresses_are_allowed():
    assert webhooks.forbidden_destination("http://127.0.0.1:1/x") is not None
    assert webhooks.forbidden_destination("http://93.184.215.14/x") is None  # a public address
    assert webhooks.forbidden_destination("http://no-such-host.invalid/x") is not None


def test_relay_settings_come_from_the_environment():
    config = Config.from_env(
        {
            "WEBHOOK_CONCURRENCY": "3",
            "WEBHOOK_TIMEOUT_SECONDS": "30s",
            "WEBHOOK_BACKOFF_MAX_SECONDS": "1h",
            "WEBHOOK_ALLOW_PRIVATE_HOSTS": "true",
        }
    )
    relay = RelayConfig.from_config(config)
    assert (relay.concurrency, relay.timeout_seconds, relay.backoff_max_seconds) == (3, 30, 3600)
    assert relay.allow_private_hosts
    # a long timeout stretches the lease instead of failing the lease/4 rule
    assert relay.lease_seconds == 120
    for bad in (
        {"WEBHOOK_CONCURRENCY": "0"},
        {"WEBHOOK_TIMEOUT_SECONDS": "0"},
        {"WEBHOOK_BACKOFF_MAX_SECONDS": "0"},
        {"WEBHOOK_BACKOFF_MAX_SECONDS": "500ms"},
    ):
        with pytest.raises(ConfigError):
            RelayConfig.from_config(Config.from_env(bad))
