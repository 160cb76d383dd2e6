"""POST /v1/scheduled-payments/batch: many creates in one request, each
answered exactly as a single create of it would be; whole-batch refusals
write nothing."""

from __future__ import annotations

import concurrent.futures
import json
import random
import threading
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.conftest import future, iso
from web import close_app

URL = "/v1/scheduled-payments/batch"
SINGLE = "/v1/scheduled-payments"
PM, CUS = "pm_card_visa", "cus_Q1w2E3r4T5y6U7"


@pytest.fixture
def due() -> str:
    """One dueAt for the test: the same body twice must be the same body."""
    return iso(future(7200).replace(microsecond=0))


def item(key: str | None, due: str, **overrides) -> dict:
    payload = {"idempotencyKey": key, "payee": "acme", "amount": 2500, "dueAt": due}
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not ...}


def body_of(batch_item: dict) -> dict:
    """The single create's body of an item: the item without its key."""
    return {k: v for k, v in batch_item.items() if k != "idempotencyKey"}


def post(client, headers, items, **extra):
    return client.post(URL, json={"items": items}, headers=headers, **extra)


def results(response) -> list[dict]:
    assert response.status_code == 200, response.get_data(as_text=True)
    answered = response.get_json()["results"]
    assert [r["index"] for r in answered] == list(range(len(answered)))
    return answered


def count(conn, table) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def nothing_written(conn) -> bool:
    return (
        count(conn, "payments")
        == count(conn, "idempotency_keys")
        == 0
        == count(conn, "payment_events")
    )


# -- each item is a single create ---------------------------------------------------


def test_each_item_is_created_and_answered_in_order(client, alice, conn, due):
    items = [item(f"k{n}", due, amount=100 + n) for n in range(5)]
    answered = results(post(client, alice, items))
    assert [(r["status"], r["replayed"]) for r in answered] == [(201, False)] * 5
    assert [r["payment"]["amount"] for r in answered] == [100, 101, 102, 103, 104]
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 5
    # each payment's created event, in the same transaction as its row
    events = conn.execute("SELECT payment_id, type, payer FROM payment_events").fetchall()
    assert sorted(str(e["payment_id"]) for e in events) == sorted(
        r["payment"]["id"] for r in answered
    )
    assert {(e["type"], e["payer"]) for e in events} == {("payment.created", "alice")}


def test_a_created_item_answers_the_single_creates_body(client, alice, conn, due):
    [created] = results(post(client, alice, [item("k", due)]))
    shown = client.get(f"{SINGLE}/{created['payment']['id']}", headers=alice).get_json()
    assert created["payment"] == shown
    single = client.post(
        SINGLE, json=body_of(item("k", due)), headers={**alice, "Idempotency-Key": "other"}
    ).get_json()
    assert set(created["payment"]) == set(single)


def test_a_key_is_shared_with_single_creates_both_ways(client, alice, conn, due):
    first = client.post(
        SINGLE, json=body_of(item("s", due)), headers={**alice, "Idempotency-Key": "s"}
    )
    [replay, created] = results(post(client, alice, [item("s", due), item("b", due)]))
    assert (replay["status"], replay["replayed"]) == (201, True)
    assert replay["payment"]["id"] == first.get_json()["id"]
    again = client.post(
        SINGLE, json=body_of(item("b", due)), headers={**alice, "Idempotency-Key": "b"}
    )
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == created["payment"]["id"]
    reused = client.post(
        SINGLE, json=body_of(item("b", due, amount=1)), headers={**alice, "Idempotency-Key": "b"}
    )
    assert reused.status_code == 409
    assert count(conn, "payments") == 2


def test_a_whole_batch_again_replays_every_item(client, alice, conn, due):
    items = [item(f"k{n}", due) for n in range(4)]
    first = results(post(client, alice, items))
    again = results(post(client, alice, list(reversed(items))))
    assert [r["replayed"] for r in again] == [True] * 4
    assert [r["payment"]["id"] for r in again] == [r["payment"]["id"] for r in reversed(first)]
    assert count(conn, "payments") == 4 and count(conn, "payment_events") == 4


def test_a_key_with_another_body_is_that_items_409(client, alice, conn, due):
    results(post(client, alice, [item("k", due)]))
    answered = results(post(client, alice, [item("k", due, amount=99), item("new", due)]))
    assert answered[0]["status"] == 409
    assert answered[0]["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert answered[0]["error"]["status"] == 409
    assert answered[1]["status"] == 201
    assert count(conn, "payments") == 2


def test_the_same_key_twice_in_a_batch_is_two_creates_in_order(client, alice, conn, due):
    answered = results(
        post(client, alice, [item("k", due), item("k", due), item("k", due, amount=1)])
    )
    assert [(r["status"], r.get("replayed")) for r in answered] == [
        (201, False),
        (201, True),
        (409, None),
    ]
    assert answered[0]["payment"] == answered[1]["payment"]
    assert count(conn, "payments") == 1


def test_a_refused_item_then_a_good_one_with_its_key_creates(client, alice, conn, due):
    answered = results(post(client, alice, [item("k", due, amount=0), item("k", due)]))
    assert [r["status"] for r in answered] == [400, 201]
    assert answered[0]["error"]["errors"] == {"amount": ["amount must be greater than 0"]}
    # ... and the other way round: the refused body is a 409 once the key is used
    answered = results(post(client, alice, [item("j", due), item("j", due, amount=0)]))
    assert [r["status"] for r in answered] == [201, 409]
    assert count(conn, "payments") == 2


BAD_ITEMS = {
    "amount as float": ({"amount": 25.0}, "amount"),
    "amount as string": ({"amount": "25"}, "amount"),
    "amount as bool": ({"amount": True}, "amount"),
    "amount above cap": ({"amount": 100_000_001}, "amount"),
    "dueAt naive": ({"dueAt": future().replace(tzinfo=None).isoformat()}, "dueAt"),
    "dueAt past": ({"dueAt": iso(datetime.now(UTC) - timedelta(minutes=1))}, "dueAt"),
    "dueAt beyond horizon": ({"dueAt": iso(datetime.now(UTC) + timedelta(days=367))}, "dueAt"),
    "unknown currency": ({"currency": "XYZ"}, "currency"),
    "payer in item": ({"payer": "mallory"}, "payer"),
    "payee missing": ({"payee": ...}, "payee"),
    "payee with NUL": ({"payee": "a\x00b"}, "payee"),
    "key missing": ({"idempotencyKey": ...}, "idempotencyKey"),
    "key empty": ({"idempotencyKey": ""}, "idempotencyKey"),
    "key too long": ({"idempotencyKey": "k" * 256}, "idempotencyKey"),
    "key not printable": ({"idempotencyKey": "tab\there"}, "idempotencyKey"),
    "key not a string": ({"idempotencyKey": 7}, "idempotencyKey"),
}


@pytest.mark.parametrize("overrides,field", BAD_ITEMS.values(), ids=BAD_ITEMS.keys())
def test_a_bad_item_is_its_own_400_and_the_others_are_created(
    client, alice, conn, due, overrides, field
):
    answered = results(post(client, alice, [item("a", due), item("bad", due, **overrides)]))
    assert answered[0]["status"] == 201
    refused = answered[1]
    assert refused["status"] == 400 and refused["error"]["status"] == 400
    assert refused["error"]["code"] == "VALIDATION_FAILED"
    assert field in refused["error"]["errors"], refused
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 1


def test_the_key_takes_what_the_header_takes(client, alice, due):
    answered = results(post(client, alice, [item("k" * 255, due), item(" ~", due)]))
    assert [r["status"] for r in answered] == [201, 201]


@pytest.mark.parametrize("thing", [5, "item", None, [1, 2], True])
def test_an_item_that_is_not_an_object_is_its_own_400(client, alice, conn, due, thing):
    answered = results(post(client, alice, [thing, item("k", due)]))
    assert answered[0]["status"] == 400
    assert answered[0]["error"]["errors"] == {"_schema": ["an item must be a JSON object"]}
    assert answered[1]["status"] == 201


def test_a_replay_is_answered_after_its_due_time_has_passed(app, config, alice, conn):
    from web import create_app

    due = iso(future(3600).replace(microsecond=0))
    [first] = results(post(app.test_client(), alice, [item("k", due)]))
    later = create_app(config, clock=lambda: datetime.now(UTC) + timedelta(hours=2))
    try:
        answered = results(
            post(
                later.test_client(),
                alice,
                [item("k", due), item("fresh", due), item("k", due, amount=1)],
            )
        )
    finally:
        close_app(later)
    assert (answered[0]["status"], answered[0]["replayed"]) == (201, True)
    assert answered[0]["payment"]["id"] == first["payment"]["id"]
    assert answered[1]["status"] == 400 and "dueAt" in answered[1]["error"]["errors"]
    assert answered[2]["status"] == 409  # the key is used: its dueAt no longer matters
    assert count(conn, "payments") == 1


def test_a_day_without_a_partition_is_refused_like_one_beyond_the_horizon(config, alice, conn):
    """Partitions exist through HORIZON_DAYS + margin; a horizon beyond them
    (the partition keeper is behind) must not make a 500 of the batch."""
    from web import create_app

    app = create_app(config.with_overrides(horizon_days=500))
    beyond = iso(datetime.now(UTC) + timedelta(days=450))
    try:
        answered = results(
            post(app.test_client(), alice, [item("far", beyond), item("near", iso(future()))])
        )
    finally:
        close_app(app)
    assert answered[0]["status"] == 400
    assert answered[0]["error"]["errors"] == {"dueAt": ["dueAt must be within 500 days"]}
    assert answered[1]["status"] == 201
    assert count(conn, "payments") == 1


# -- the processor's customers ------------------------------------------------------


@pytest.fixture
def stripe(config):
    from web import create_app

    # No call reaches Stripe (whose a payment method is: tests/web/test_customer_binding.py).
    app = create_app(
        config.with_overrides(
            gateway="stripe", stripe_api_key="sk_test_x", payment_method_check=False
        )
    )
    yield app.test_client()
    close_app(app)


def test_a_customer_is_bound_by_the_first_create_naming_it(stripe, alice, bob, conn, due):
    mine = dict(paymentMethod=PM, customer=CUS)
    answered = results(post(stripe, alice, [item("a1", due, **mine), item("a2", due, **mine)]))
    assert [r["status"] for r in answered] == [201, 201]
    refused = results(
        post(
            stripe,
            bob,
            [item("b1", due, **mine), item("b2", due, paymentMethod=PM, customer="cus_bob")],
        )
    )
    assert refused[0]["status"] == 400
    assert refused[0]["error"]["code"] == "CUSTOMER_NOT_YOURS"
    assert refused[0]["error"]["errors"] == {"customer": ["customer belongs to another payer"]}
    assert refused[1]["status"] == 201
    owners = conn.execute("SELECT customer, actor FROM customers ORDER BY customer").fetchall()
    assert owners == [
        {"customer": "cus_Q1w2E3r4T5y6U7", "actor": "alice"},
        {"customer": "cus_bob", "actor": "bob"},
    ]


def test_an_item_that_creates_nothing_binds_no_customer(stripe, alice, conn, due):
    results(post(stripe, alice, [item("k", due, paymentMethod=PM, customer="cus_first")]))
    [reused] = results(post(stripe, alice, [item("k", due, paymentMethod=PM, customer="cus_new")]))
    assert reused["status"] == 409
    assert [r["customer"] for r in conn.execute("SELECT customer FROM customers")] == ["cus_first"]


def test_stripe_requires_the_processor_fields_per_item(stripe, alice, conn, due):
    [refused] = results(post(stripe, alice, [item("k", due)]))
    assert set(refused["error"]["errors"]) == {"paymentMethod", "customer"}
    assert nothing_written(conn)


# -- whole-batch refusals: nothing written ----------------------------------------------


@pytest.mark.parametrize(
    "envelope,message_field",
    [
        ({}, "items"),
        ({"items": None}, "items"),
        ({"items": []}, "items"),
        ({"items": {"idempotencyKey": "k"}}, "items"),
        ({"items": "all of them"}, "items"),
        ({"items": [{}], "dryRun": True}, "dryRun"),
    ],
)
def test_a_bad_envelope_is_400_and_writes_nothing(client, alice, conn, envelope, message_field):
    response = client.post(URL, json=envelope, headers=alice)
    assert response.status_code == 400
    assert response.mimetype == "application/problem+json"
    assert message_field in response.get_json()["errors"]
    assert nothing_written(conn)


@pytest.mark.parametrize("body", [[{"idempotencyKey": "k"}], "items", 7])
def test_a_body_that_is_not_an_object_is_400(client, alice, conn, body):
    response = client.post(URL, json=body, headers=alice)
    assert response.status_code == 400 and response.get_json()["code"] == "INVALID_JSON"
    assert nothing_written(conn)


def test_more_items_than_the_maximum_is_413_with_the_limit(config, alice, conn, due):
    from web import create_app

    app = create_app(config.with_overrides(batch_max_items=3))
    try:
        client = app.test_client()
        refused = post(client, alice, [item(f"k{n}", due) for n in range(4)])
        accepted = post(client, alice, [item(f"k{n}", due) for n in range(3)])
        document = client.get("/openapi.json").get_json()
    finally:
        close_app(app)
    assert refused.status_code == 413
    assert refused.get_json()["code"] == "TOO_MANY_ITEMS"
    assert "at most 3 items" in refused.get_json()["detail"]
    assert accepted.status_code == 200
    assert count(conn, "payments") == 3
    items = document["components"]["schemas"]["BatchRequest"]["properties"]["items"]
    assert (items["minItems"], items["maxItems"]) == (1, 3)


def test_a_body_over_the_batch_limit_is_413_and_one_under_it_is_taken(config, alice, conn, due):
    from web import create_app

    app = create_app(config.with_overrides(max_batch_body_bytes=4096, max_body_bytes=512))
    items = [item(f"k{n}", due) for n in range(20)]  # over MAX_BODY_BYTES, under 4096
    size = len(json.dumps({"items": items}))
    assert 512 < size < 4096
    try:
        client = app.test_client()
        taken = post(client, alice, items)
        refused = post(client, alice, items + [item(f"x{n}", due) for n in range(40)])
    finally:
        close_app(app)
    assert taken.status_code == 200
    assert refused.status_code == 413 and refused.get_json()["code"] == "BODY_TOO_LARGE"
    assert count(conn, "payments") == 20


def test_not_json_is_415_and_no_key_is_401(client, alice, conn):
    response = client.post(URL, data="items=1", headers={**alice, "Content-Type": "text/plain"})
    assert response.status_code == 415
    assert client.post(URL, json={"items": [{}]}).status_code == 401
    assert nothing_written(conn)


# -- the actor's rate limit counts items ------------------------------------------------


def test_each_item_is_charged_and_a_batch_beyond_the_bucket_is_429_whole(
    config, alice, bob, conn, due
):
    """A bucket of 500 refilled at 1/s: what refills while the test runs (a
    few tokens on a slow machine) never changes an answer."""
    from web import create_app

    app = create_app(
        config.with_overrides(api_rate_limit=1, api_rate_burst=500, batch_max_items=500)
    )
    try:
        client = app.test_client()
        assert post(client, alice, [item(f"a{n}", due) for n in range(300)]).status_code == 200
        refused = post(client, alice, [item(f"b{n}", due) for n in range(250)])  # ~200 left
        assert refused.status_code == 429
        assert refused.get_json()["code"] == "RATE_LIMITED"
        assert int(refused.headers["Retry-After"]) >= 30  # ~50 more tokens at 1/s
        assert count(conn, "payments") == 300  # nothing of the refused batch
        # the refusal took nothing: 200 items still fit, then the bucket is ~empty
        assert post(client, alice, [item(f"c{n}", due) for n in range(200)]).status_code == 200
        assert post(client, alice, [item(f"d{n}", due) for n in range(60)]).status_code == 429
        # bob has a bucket of his own
        assert post(client, bob, [item(f"e{n}", due) for n in range(500)]).status_code == 200
    finally:
        close_app(app)
    assert count(conn, "payments") == 1000


def test_the_answer_is_the_json_of_what_a_single_create_answers(client, alice, due):
    """The batch's answer is encoded by orjson, the single create's by
    Flask's json: the same JSON, text outside ASCII included, refusals'
    per-field messages included."""
    items = [item("accented", due, payee="Zoë Café — 東京"), item("bad", due, amount="x")]
    response = post(client, alice, items)
    created, refused = results(response)
    assert json.loads(response.get_data()) == response.get_json()
    single = client.post(
        SINGLE, json=body_of(items[0]), headers={**alice, "Idempotency-Key": "accented"}
    )
    assert single.status_code == 201 and single.headers.get("Idempotent-Replayed") == "true"
    assert created["payment"] == single.get_json()
    assert created["payment"]["payee"] == "Zoë Café — 東京"
    lone = client.post(SINGLE, json=body_of(items[1]), headers={**alice, "Idempotency-Key": "bad"})
    assert refused["status"] == lone.status_code == 400
    assert refused["error"] == lone.get_json()


# -- racing creates ---------------------------------------------------------------------


def test_sixteen_clients_racing_on_overlapping_keys_make_one_payment_per_key(
    live_server, alice, conn, due
):
    """Rounds of 16 clients starting at once on the round's keys: 12 send
    batches of them in shuffled orders, 4 single creates. Every key ends
    with exactly one payment, every answer for a key names that payment,
    and exactly one answer created it. (Batches that inserted their keys in
    their own order deadlock here.)"""
    rounds, clients = 4, 16
    barriers = [threading.Barrier(clients, timeout=60) for _ in range(rounds)]

    def send(client_number: int) -> list[tuple[str, dict]]:
        rng = random.Random(client_number)
        answers = []
        with httpx.Client(base_url=live_server, timeout=60) as http:
            for r in range(rounds):
                chosen = rng.sample([f"race-{r}-{n:03d}" for n in range(100)], 80)
                barriers[r].wait()
                if client_number % 4 == 0:  # a single-create client
                    for key in chosen[:10]:
                        response = http.post(
                            SINGLE,
                            json=body_of(item(key, due)),
                            headers={**alice, "Idempotency-Key": key},
                        )
                        assert response.status_code == 201, response.text
                        replayed = response.headers.get("Idempotent-Replayed") == "true"
                        answers.append((key, {"id": response.json()["id"], "replayed": replayed}))
                    continue
                response = http.post(
                    URL, json={"items": [item(k, due) for k in chosen]}, headers=alice
                )
                assert response.status_code == 200, response.text
                for key, result in zip(chosen, response.json()["results"], strict=True):
                    assert result["status"] == 201, result
                    answers.append(
                        (key, {"id": result["payment"]["id"], "replayed": result["replayed"]})
                    )
        return answers

    def client(number: int) -> list[tuple[str, dict]]:
        try:
            return send(number)
        except BaseException:
            for barrier in barriers:  # the others stop now, not after the barrier's timeout
                barrier.abort()
            raise

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client, number) for number in range(clients)]
    failures = [f.exception() for f in futures if f.exception() is not None]
    # the first failure itself, not a client the failure stopped at a barrier
    for failure in sorted(failures, key=lambda e: isinstance(e, threading.BrokenBarrierError)):
        raise failure
    answers = [a for future in futures for a in future.result()]
    rows = conn.execute(
        "SELECT k.key, count(p.id) AS n, min(p.id::text) AS id FROM idempotency_keys k "
        "JOIN payments p ON p.id = k.payment_id GROUP BY k.key"
    ).fetchall()
    used = {key for key, _ in answers}
    assert {r["key"] for r in rows} == used and {r["n"] for r in rows} == {1}
    assert count(conn, "payments") == len(used)
    ids = {r["key"]: r["id"] for r in rows}
    creations = dict.fromkeys(used, 0)
    for key, answer in answers:
        assert answer["id"] == ids[key]
        creations[key] += not answer["replayed"]
    assert set(creations.values()) == {1}


# -- the document -----------------------------------------------------------------------


def test_the_document_states_the_batch(client, config):
    document = client.get("/openapi.json").get_json()
    operation = document["paths"][URL]["post"]
    assert set(operation["responses"]) == {"200", "400", "401", "413", "415", "429", "503"}
    schemas = document["components"]["schemas"]
    assert set(schemas["BatchItem"]["properties"]) == set(
        schemas["CreatePayment"]["properties"]
    ) | {"idempotencyKey"}
    assert set(schemas["BatchItem"]["required"]) == {"amount", "dueAt", "payee", "idempotencyKey"}
    items = schemas["BatchRequest"]["properties"]["items"]
    assert items["maxItems"] == config.batch_max_items and items["minItems"] == 1
    assert schemas["BatchRequest"]["additionalProperties"] is False
    result = schemas["BatchResults"]["properties"]["results"]["items"]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in result["oneOf"]] == [
        "BatchCreated",
        "BatchRefused",
    ]
