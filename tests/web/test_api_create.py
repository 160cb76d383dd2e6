"""POST /v1/scheduled-payments: create, idempotent replay, bad input."""

from __future__ import annotations

import concurrent.futures
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import future, iso
from tests.support import Clock
from web import close_app
from web.bodies import headers, load
from web.payments import _KEY_HEADER, request_idempotency_key
from web.problems import Problem

URL = "/v1/scheduled-payments"


def body(**overrides) -> dict:
    payload = {"payee": "acme", "amount": 2500, "dueAt": iso(future())}
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not ...}


def post(client, headers, payload, key="key-1", **extra):
    h = dict(headers)
    if key is not None:
        h["Idempotency-Key"] = key
    return client.post(URL, json=payload, headers=h, **extra)


def count(conn, table):
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def test_create_returns_the_pending_payment(client, alice, conn):
    due = future(7200).replace(microsecond=0)
    response = post(client, alice, body(dueAt=iso(due)))
    assert response.status_code == 201
    data = response.get_json()
    assert data["status"] == "PENDING"
    assert data["payer"] == "alice" and data["payee"] == "acme"
    assert data["amount"] == 2500 and isinstance(data["amount"], int)
    assert data["currency"] == "USD"
    assert datetime.fromisoformat(data["dueAt"]) == due
    assert data["attempts"] == []
    assert response.headers["Location"].endswith(data["id"])
    assert "Idempotent-Replayed" not in response.headers
    # one payment, one idempotency row, one created event: one transaction
    assert count(conn, "payments") == 1
    assert count(conn, "idempotency_keys") == 1
    event = conn.execute("SELECT type, payer FROM payment_events").fetchall()
    assert event == [{"type": "payment.created", "payer": "alice"}]


def test_creates_run_on_sessions_that_plan_them_once_where_nothing_else_runs(
    app, client, alice, bob, conn
):
    """The create's statement is planned once per session, not per create
    (its own pool, generic plans); replays and refusals are answered on the
    usual sessions, whose reads of the partitioned payments must be planned
    for their own day (tests/store/test_partition_pruning.py). Every
    statement the create's session runs is prepared at once here, so any
    other one would be seen."""
    with app.extensions["paycron.create_pool"].connection() as session:
        session.prepare_threshold = 0
    payload = body()
    for n in range(3):
        assert post(client, alice, payload, key=f"k-{n}").status_code == 201
        assert post(client, alice, payload, key=f"k-{n}").headers["Idempotent-Replayed"] == "true"
        assert post(client, alice, {**payload, "amount": 1}, key=f"k-{n}").status_code == 409
    soon = body(dueAt=iso(datetime.now(UTC) + timedelta(seconds=1)))
    assert post(client, alice, soon, key="soon").status_code == 201  # announced: NOTIFY
    named = body(customer="cus_shared")
    assert post(client, alice, named, key="c-1").status_code == 201  # binds the customer
    assert post(client, alice, named, key="c-2").status_code == 201
    refused = post(client, bob, named, key="c-3")
    assert (refused.status_code, refused.get_json()["code"]) == (400, "CUSTOMER_NOT_YOURS")
    with app.extensions["paycron.create_pool"].connection() as session:
        assert session.prepare_threshold == 0  # the same session
        plans = session.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
    ran = [p for p in plans if "pg_prepared_statements" not in p["statement"]]
    [create] = [p for p in ran if "INSERT INTO idempotency_keys" in p["statement"]]
    assert [p["statement"] for p in ran if p is not create] == ["NOTIFY paycron_due"]
    assert create["generic_plans"] >= 1 and create["custom_plans"] == 0
    assert count(conn, "payments") == 6


def test_due_at_with_an_offset_is_stored_in_utc(client, alice):
    due = future(7200).astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    data = post(client, alice, body(dueAt=due.isoformat())).get_json()
    assert data["dueAt"].endswith("+00:00")
    assert datetime.fromisoformat(data["dueAt"]) == due


def test_replay_with_the_same_body_returns_the_same_payment(client, alice, conn):
    payload = body()
    first = post(client, alice, payload)
    second = post(client, alice, dict(reversed(payload.items())))  # key order is irrelevant
    assert second.status_code == 201
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.get_json()["id"] == first.get_json()["id"]
    assert count(conn, "payments") == 1


def test_same_key_different_body_is_409_and_creates_nothing(client, alice, conn):
    post(client, alice, body(amount=2500))
    response = post(client, alice, body(amount=2600))
    assert response.status_code == 409
    assert response.mimetype == "application/problem+json"
    assert response.get_json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert count(conn, "payments") == 1


def test_the_same_key_from_two_actors_makes_two_payments(client, alice, bob, conn):
    payload = body()
    a = post(client, alice, payload).get_json()
    b = post(client, bob, payload).get_json()
    assert a["id"] != b["id"]
    assert (a["payer"], b["payer"]) == ("alice", "bob")
    assert count(conn, "payments") == 2


def test_replay_after_due_at_passed_returns_the_original(app, config, alice, conn):
    from web import create_app

    payload = body(dueAt=iso(future(3600)))
    first = post(app.test_client(), alice, payload).get_json()
    # Two hours later the dueAt has passed.
    clock = Clock(running=True)
    clock.advance(hours=2)
    later = create_app(config, clock=clock.utc)
    try:
        client = later.test_client()
        # a fresh create with that dueAt is refused ...
        assert post(client, alice, payload, key="other").status_code == 400
        # ... but the replay still returns the original payment
        replay = post(client, alice, payload)
    finally:
        close_app(later)
    assert replay.status_code == 201
    assert replay.get_json()["id"] == first["id"]
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert count(conn, "payments") == 1


def test_sixteen_concurrent_posts_with_one_key_make_one_payment(live_server, alice, conn):
    payload = body()

    def send(_):
        with httpx.Client(base_url=live_server, timeout=30) as http:
            return http.post(URL, json=payload, headers={**alice, "Idempotency-Key": "race"})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(send, range(16)))
    assert count(conn, "payments") == 1
    payment_id = conn.execute("SELECT id FROM payments").fetchone()["id"]
    for response in responses:
        assert response.status_code in (201, 409), response.text
        if response.status_code == 201:
            assert response.json()["id"] == str(payment_id)
    assert (
        sum(r.status_code == 201 and "Idempotent-Replayed" not in r.headers for r in responses) == 1
    )


BAD_BODIES = {
    "amount as float": ({"amount": 25.0}, "amount"),
    "amount as fraction": ({"amount": 25.5}, "amount"),
    "amount as string": ({"amount": "25"}, "amount"),
    "amount as bool": ({"amount": True}, "amount"),
    "amount zero": ({"amount": 0}, "amount"),
    "amount negative": ({"amount": -1}, "amount"),
    "amount above cap": ({"amount": 100_000_001}, "amount"),
    "amount missing": ({"amount": ...}, "amount"),
    "amount null": ({"amount": None}, "amount"),
    "dueAt naive": ({"dueAt": future().replace(tzinfo=None).isoformat()}, "dueAt"),
    "dueAt past": ({"dueAt": iso(datetime.now(UTC) - timedelta(minutes=1))}, "dueAt"),
    "dueAt beyond horizon": ({"dueAt": iso(datetime.now(UTC) + timedelta(days=367))}, "dueAt"),
    "dueAt not a date": ({"dueAt": "next tuesday"}, "dueAt"),
    "dueAt missing": ({"dueAt": ...}, "dueAt"),
    "unknown currency": ({"currency": "XYZ"}, "currency"),
    "lowercase currency": ({"currency": "usd"}, "currency"),
    "payer in body": ({"payer": "mallory"}, "payer"),
    "status in body": ({"status": "COMPLETED"}, "status"),
    "payee missing": ({"payee": ...}, "payee"),
    "payee empty": ({"payee": ""}, "payee"),
    "payee not a string": ({"payee": 7}, "payee"),
}


@pytest.mark.parametrize("overrides,field", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_bodies_are_400_with_a_message_for_the_field(client, alice, conn, overrides, field):
    response = post(client, alice, body(**overrides))
    assert response.status_code == 400, response.get_json()
    problem = response.get_json()
    assert response.mimetype == "application/problem+json"
    assert problem["code"] == "VALIDATION_FAILED"
    assert field in problem["errors"], problem
    assert count(conn, "payments") == 0
    assert count(conn, "idempotency_keys") == 0


def test_due_at_at_the_horizon_is_accepted(client, alice, conn):
    due = datetime.now(UTC) + timedelta(days=366) - timedelta(minutes=1)
    response = post(client, alice, body(dueAt=iso(due)))
    assert response.status_code == 201, response.get_json()


@pytest.mark.parametrize(
    "key,code",
    [
        (None, "IDEMPOTENCY_KEY_MISSING"),
        ("", "IDEMPOTENCY_KEY_MISSING"),
        ("k" * 256, "IDEMPOTENCY_KEY_INVALID"),
        ("tab\tinside", "IDEMPOTENCY_KEY_INVALID"),
    ],
)
def test_missing_or_bad_idempotency_key_is_400(client, alice, conn, key, code):
    response = post(client, alice, body(), key=key)
    assert response.status_code == 400
    assert response.get_json()["code"] == code
    assert count(conn, "payments") == 0


def test_a_255_character_key_is_accepted(client, alice):
    assert post(client, alice, body(), key="k" * 255).status_code == 201


@pytest.mark.parametrize("key", [{"Idempotency-Key": "k"}, {}])
def test_non_json_is_415_with_or_without_a_key(client, alice, conn, key):
    # The body is read before the key is checked.
    response = client.post(
        URL, data="amount=1", headers={**alice, **key, "Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.get_json()["code"] == "UNSUPPORTED_MEDIA_TYPE"


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", "25", "null"])
def test_malformed_or_non_object_json_is_400(client, alice, conn, raw):
    response = client.post(
        URL, data=raw, headers={**alice, "Idempotency-Key": "k", "Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.get_json()["code"] == "INVALID_JSON"
    assert count(conn, "payments") == 0


def test_oversized_body_is_413(client, alice, conn):
    response = post(client, alice, body(payee="x" * 70_000))
    assert response.status_code == 413
    assert response.get_json()["code"] == "BODY_TOO_LARGE"
    assert count(conn, "payments") == 0


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nope", "Basic abc", "bearer  "])
def test_missing_or_wrong_key_is_401(client, conn, header):
    headers = {"Idempotency-Key": "k"}
    if header is not None:
        headers["Authorization"] = header
    response = client.post(URL, json=body(), headers=headers)
    assert response.status_code == 401
    assert response.get_json()["code"] == "UNAUTHENTICATED"
    assert count(conn, "payments") == 0


def test_a_revoked_key_is_401(client, conn, make_key):
    from paycron.store.apikeys import revoke_api_key

    key = make_key("carol")
    revoke_api_key(conn, key.split("_")[1])
    response = post(client, {"Authorization": f"Bearer {key}"}, body())
    assert response.status_code == 401


def test_a_revoked_key_stops_working_once_the_cache_ttl_has_passed(app, conn, make_key):
    from paycron.store.apikeys import PrincipalCache, revoke_api_key

    pool = app.extensions["paycron.pool"]
    clock = Clock(start=1000.0)
    cache = PrincipalCache(10.0, monotonic=clock)
    key = make_key("carol")
    assert cache.authenticate(pool, key).actor == "carol"
    revoke_api_key(conn, key.split("_")[1])
    clock.advance(9.9)
    assert cache.authenticate(pool, key).actor == "carol"  # served from the cache
    clock.advance(0.2)
    assert cache.authenticate(pool, key) is None
    assert PrincipalCache(0.0).authenticate(pool, key) is None


def test_the_principal_cache_remembers_neither_unknown_keys_nor_more_than_its_bound(
    app, conn, make_key
):
    from paycron.store.apikeys import PrincipalCache, revoke_api_key

    pool = app.extensions["paycron.pool"]
    cache = PrincipalCache(60.0, max_entries=2)
    assert cache.authenticate(pool, "pc_00000000_unknown") is None
    keys = [make_key(f"payer-{i}") for i in range(3)]
    for key in keys:
        cache.authenticate(pool, key)
    for key in keys:
        revoke_api_key(conn, key.split("_")[1])
    # the third key cleared the full cache: only it is still served from memory
    assert [cache.authenticate(pool, key) is not None for key in keys] == [False, False, True]


def test_the_cli_creates_lists_and_revokes_keys(config):
    from click.testing import CliRunner

    from paycron.cli import main
    from web import create_app

    env = {"DATABASE_URL": config.database_url, "API_KEY_CACHE_SECONDS": "0"}

    def cli(*args):
        result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    key = cli("api-key", "create", "--actor", "erin").strip().splitlines()[-1]
    prefix = key.split("_")[1]
    assert f"{prefix}\terin\tpayments\tactive" in cli("api-key", "list")
    app = create_app(config.with_overrides(api_key_cache_seconds=0))
    try:
        client = app.test_client()
        headers = {"Authorization": f"Bearer {key}"}
        assert post(client, headers, body()).status_code == 201
        assert "(0 s in this environment)" in cli("api-key", "revoke", prefix)
        assert post(client, headers, body(), key="key-2").status_code == 401
    finally:
        close_app(app)
    assert f"{prefix}\terin\tpayments\trevoked" in cli("api-key", "list")


def test_only_a_hash_of_the_key_is_stored(conn, make_key):
    key = make_key("dave")
    stored = conn.execute("SELECT * FROM api_keys WHERE actor = 'dave'").fetchone()
    assert key.encode() not in bytes(stored["key_hash"])
    assert key not in str(stored)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.one_of(
        st.text(alphabet=st.characters(min_codepoint=0x09, max_codepoint=0xFF), max_size=300),
        st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=250),
    )
)
@example(key="k" * 255)
@example(key="k" * 256)
@example(key="")
@example(key=" ")
@example(key="caf\xe9")
@example(key="a\x7f")
@example(key="a\tb")
def test_a_key_taken_without_the_schema_is_one_the_schema_takes(app, key):
    """The create takes a plain Idempotency-Key itself and leaves every other
    to the header's schema: what it takes, the schema takes, unchanged."""
    if "\n" in key or "\r" in key:
        return  # no HTTP header carries them
    with app.test_request_context(headers={"Idempotency-Key": key}):
        try:
            taken = request_idempotency_key()
        except Problem:
            taken = None
        try:
            loaded = load(_KEY_HEADER, headers(_KEY_HEADER))["idempotency_key"]
        except Problem:
            loaded = None
    assert taken == loaded
