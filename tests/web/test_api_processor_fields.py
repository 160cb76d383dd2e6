"""The create's processor fields (docs/api.md, docs/design.md): ``paymentMethod`` and
``customer`` — optional with the fake gateway, required with Stripe, stored
and shown, part of the idempotent request; Stripe's amount and currency rules
checked at create with GATEWAY=stripe; each customer bound to the first
actor that names it (CUSTOMER_NOT_YOURS for the others)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from werkzeug.serving import make_server

from paycron.domain.money import ISO_4217
from paycron.processors.stripe import amounts as stripe_amounts
from tests.conftest import future, iso
from web import close_app

URL = "/v1/scheduled-payments"
PM, CUS = "pm_card_visa", "cus_Q1w2E3r4T5y6U7"


@pytest.fixture
def stripe_app(config):
    """The app as GATEWAY=stripe builds it, without asking Stripe whose a
    payment method is: no call reaches Stripe here (that check:
    tests/web/test_customer_binding.py)."""
    from web import create_app

    app = create_app(
        config.with_overrides(
            gateway="stripe", stripe_api_key="sk_test_x", payment_method_check=False
        )
    )
    yield app
    close_app(app)


@pytest.fixture
def stripe(stripe_app):
    return stripe_app.test_client()


def body(**overrides) -> dict:
    payload = {
        "payee": "acme",
        "amount": 2500,
        "dueAt": iso(future()),
        "paymentMethod": PM,
        "customer": CUS,
    }
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not ...}


def post(client, headers, payload, key="key-1"):
    # ensure_ascii: a lone surrogate goes on the wire as its escape, "\ud800"
    return client.post(
        URL,
        data=json.dumps(payload, ensure_ascii=True),
        content_type="application/json",
        headers={**headers, "Idempotency-Key": key},
    )


def count(conn, table) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def assert_refused(response, conn, field: str, message: str | None = None) -> dict:
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    problem = response.get_json()
    assert problem["code"] == "VALIDATION_FAILED"
    assert field in problem["errors"], problem
    if message is not None:
        assert message in problem["errors"][field], problem
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 0
    assert count(conn, "customers") == 0
    return problem


# -- the two fields ------------------------------------------------------------------


@pytest.mark.parametrize("field", ["paymentMethod", "customer"])
@pytest.mark.parametrize("value", [..., None], ids=["missing", "null"])
def test_stripe_requires_both_fields(stripe, alice, conn, field, value):
    response = post(stripe, alice, body(**{field: value}))
    assert_refused(response, conn, field, f"{field} is required with this processor")


def test_the_fake_gateway_takes_a_payment_without_them(client, alice, conn):
    response = post(client, alice, body(paymentMethod=..., customer=...))
    assert response.status_code == 201, response.get_json()
    data = response.get_json()
    assert data["paymentMethod"] is None and data["customer"] is None
    row = conn.execute("SELECT payment_method, customer FROM payments").fetchone()
    assert row == {"payment_method": None, "customer": None}
    assert count(conn, "customers") == 0
    assert (
        post(client, alice, body(paymentMethod=None, customer=None), key="key-2").status_code == 201
    )


LONE = "cus_\ud800"
BAD_TOKENS = {
    "empty": ("", "must be 1-255 characters"),
    "256 characters": ("c" * 256, "must be 1-255 characters"),
    "tab": ("cus_\tx", "must be printable ASCII characters"),
    "newline": ("cus_x\n2026-01-01 FORGED", "must be printable ASCII characters"),
    "DEL": ("cus_\x7f", "must be printable ASCII characters"),
    "NUL": ("cus_\x00", "must be printable ASCII characters"),
    "not ASCII": ("cus_é", "must be printable ASCII characters"),
    "lone surrogate": (
        LONE,
        "must be valid Unicode text: no unpaired surrogate (U+D800 to U+DFFF)",
    ),
    "not a string": (7, "Not a valid string."),
}


@pytest.mark.parametrize("app_of", ["client", "stripe"])
@pytest.mark.parametrize("field", ["paymentMethod", "customer"])
@pytest.mark.parametrize("value,message", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_a_bad_token_is_a_400_for_its_field(request, alice, conn, app_of, field, value, message):
    client = request.getfixturevalue(app_of)
    problem = assert_refused(post(client, alice, body(**{field: value})), conn, field)
    assert any(m.endswith(message) for m in problem["errors"][field]), problem
    assert set(problem["errors"]) == {field}


@pytest.mark.parametrize("value", ["c", "c" * 255, "pm_1MqLiJLkdIwHu7ixUEgbFdYF", " ~!{}"])
def test_printable_tokens_of_1_to_255_characters_are_taken(stripe, alice, value):
    response = post(stripe, alice, body(paymentMethod=value, customer=value))
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["paymentMethod"] == value


def test_both_are_stored_and_shown_on_get_and_in_the_list(stripe, alice, conn):
    created = post(stripe, alice, body()).get_json()
    assert (created["paymentMethod"], created["customer"]) == (PM, CUS)
    row = conn.execute("SELECT payment_method, customer FROM payments").fetchone()
    assert row == {"payment_method": PM, "customer": CUS}
    shown = stripe.get(f"{URL}/{created['id']}", headers=alice).get_json()
    assert (shown["paymentMethod"], shown["customer"]) == (PM, CUS)
    [listed] = stripe.get(URL, headers=alice).get_json()["data"]
    assert (listed["paymentMethod"], listed["customer"]) == (PM, CUS)


def test_they_are_part_of_the_idempotent_request(stripe, alice, conn):
    first = post(stripe, alice, body())
    replay = post(stripe, alice, body(dueAt=first.get_json()["dueAt"]))
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json()["id"] == first.get_json()["id"]
    for changed in ({"paymentMethod": "pm_card_chargeDeclined"}, {"customer": "cus_other"}):
        response = post(stripe, alice, body(dueAt=first.get_json()["dueAt"], **changed))
        assert response.status_code == 409, response.get_json()
        assert response.get_json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert count(conn, "payments") == 1
    # the 409 naming a new customer bound nothing
    assert [r["customer"] for r in conn.execute("SELECT customer FROM customers")] == [CUS]


# -- Stripe's amount and currency rules ----------------------------------------------


STRIPE_REFUSES = {
    "above eight digits": (
        {"amount": 100_000_000},
        "amount",
        "amount must be at most 99999999 minor units with the processor (Stripe)",
    ),
    "below the USD minimum": (
        {"amount": 49},
        "amount",
        "amount must be at least 50 in USD (0.50 USD, the processor's minimum charge)",
    ),
    "below the GBP minimum": (
        {"amount": 29, "currency": "GBP"},
        "amount",
        "amount must be at least 30 in GBP (0.30 GBP, the processor's minimum charge)",
    ),
    "below the JPY minimum (whole yen)": (
        {"amount": 49, "currency": "JPY"},
        "amount",
        "amount must be at least 50 in JPY (50 JPY, the processor's minimum charge)",
    ),
    "below the HUF minimum": (
        {"amount": 17_499, "currency": "HUF"},
        "amount",
        "amount must be at least 17500 in HUF (175.00 HUF, the processor's minimum charge)",
    ),
    "three decimals not ending in 0": (
        {"amount": 5_125, "currency": "KWD"},
        "amount",
        "amount in KWD must end in 0: the processor (Stripe) "
        "charges three-decimal currencies in steps of 10 minor "
        "units",
    ),
    "ISK in fractions": (
        {"amount": 550, "currency": "ISK"},
        "amount",
        "amount in ISK must be a multiple of 100: the processor (Stripe) "
        "charges whole units, written with two decimals",
    ),
    "a currency Stripe does not take": (
        {"currency": "KPW"},
        "currency",
        "currency must be one the processor (Stripe) charges in",
    ),
    "the retired code STN": (
        {"currency": "STN"},
        "currency",
        "currency must be one the processor (Stripe) charges in",
    ),
}


@pytest.mark.parametrize(
    "overrides,field,message", STRIPE_REFUSES.values(), ids=STRIPE_REFUSES.keys()
)
def test_stripe_refuses_what_it_could_not_charge(stripe, alice, conn, overrides, field, message):
    problem = assert_refused(post(stripe, alice, body(**overrides)), conn, field)
    assert problem["errors"] == {field: [message]}


@pytest.mark.parametrize(
    "overrides,field,message", STRIPE_REFUSES.values(), ids=STRIPE_REFUSES.keys()
)
def test_the_fake_gateway_takes_what_stripe_would_refuse(client, alice, overrides, field, message):
    assert post(client, alice, body(**overrides)).status_code == 201


@pytest.mark.parametrize("currency", sorted(stripe_amounts.MINIMUM_CHARGE))
def test_each_published_minimum_is_the_least_amount_taken(stripe, alice, conn, currency):
    minimum = stripe_amounts.MINIMUM_CHARGE[currency]
    below = post(stripe, alice, body(amount=minimum - 1, currency=currency))
    assert_refused(below, conn, "amount")
    at = post(stripe, alice, body(amount=minimum, currency=currency), key="key-2")
    assert at.status_code == 201, at.get_json()


@pytest.mark.parametrize(
    "overrides",
    [
        {"amount": 99_999_999},
        {"amount": 5_120, "currency": "KWD"},
        {"amount": 10, "currency": "BHD"},  # no published minimum: only the API's > 0
        {"amount": 500, "currency": "ISK"},
        {"amount": 1, "currency": "KRW"},
        {"amount": 1, "currency": "XCG"},
    ],
    ids=str,
)
def test_stripe_takes_what_it_can_charge(stripe, alice, overrides):
    response = post(stripe, alice, body(**overrides))
    assert response.status_code == 201, response.get_json()


def test_both_fields_are_checked_at_once(stripe, alice, conn):
    problem = assert_refused(
        post(stripe, alice, body(amount=1, customer="", dueAt="soon")), conn, "amount"
    )
    assert set(problem["errors"]) == {"amount", "customer", "dueAt"}


def test_a_default_currency_stripe_does_not_take_is_refused_on_currency(config, alice, conn):
    from web import create_app

    app = create_app(
        config.with_overrides(gateway="stripe", stripe_api_key="sk_test_x", default_currency="KPW")
    )
    try:
        response = post(app.test_client(), alice, body())
    finally:
        close_app(app)
    assert assert_refused(response, conn, "currency")["errors"] == {
        "currency": [stripe_amounts.UNSUPPORTED_CURRENCY]
    }


def test_the_rules_cover_only_current_iso_codes():
    assert stripe_amounts.CURRENCIES <= ISO_4217 | {"STD"}
    assert set(stripe_amounts.MINIMUM_CHARGE) <= stripe_amounts.CURRENCIES
    for group in (
        stripe_amounts.ZERO_DECIMAL,
        stripe_amounts.THREE_DECIMAL,
        stripe_amounts.WHOLE_UNITS_IN_HUNDREDTHS,
    ):
        assert group <= stripe_amounts.CURRENCIES
    assert stripe_amounts.in_units(50, "JPY") == "50 JPY"
    assert stripe_amounts.in_units(5120, "KWD") == "5.120 KWD"


# -- the document ---------------------------------------------------------------------


def _create_schema(client) -> dict:
    return client.get("/openapi.json").get_json()["components"]["schemas"]


def test_the_document_requires_them_with_stripe_and_shows_stripes_rules(stripe, client):
    schemas = _create_schema(stripe)
    create = schemas["CreatePayment"]
    assert {"paymentMethod", "customer"} <= set(create["required"])
    for name in ("paymentMethod", "customer"):
        token = create["properties"][name]
        assert (token["type"], token["minLength"], token["maxLength"]) == ("string", 1, 255)
        assert token["pattern"] == r"^[\x20-\x7e]+$"
        assert "Required with this processor" in token["description"]
    assert create["properties"]["amount"]["maximum"] == stripe_amounts.MAX_AMOUNT
    assert "minimum charge" in create["properties"]["amount"]["description"]
    currencies = set(create["properties"]["currency"]["enum"]) - {None}
    assert currencies == stripe_amounts.CURRENCIES & ISO_4217
    assert "CUSTOMER_NOT_YOURS" in create["properties"]["customer"]["description"]
    for name in ("Payment", "PaymentSummary"):
        assert {"paymentMethod", "customer"} <= set(schemas[name]["required"])
        assert schemas[name]["properties"]["customer"]["type"] == ["string", "null"]


def test_the_document_has_them_optional_with_the_fake(client):
    create = _create_schema(client)["CreatePayment"]
    assert not {"paymentMethod", "customer"} & set(create["required"])
    assert create["properties"]["customer"]["type"] == ["string", "null"]
    assert "KPW" in create["properties"]["currency"]["enum"]


# -- each customer is its first actor's -------------------------------------------------


def test_another_actors_customer_is_refused_and_nothing_is_created(stripe, alice, bob, conn):
    assert post(stripe, alice, body()).status_code == 201
    response = post(stripe, bob, body())
    assert response.status_code == 400
    problem = response.get_json()
    assert problem["code"] == "CUSTOMER_NOT_YOURS"
    assert problem["errors"] == {"customer": ["customer belongs to another payer"]}
    assert "alice" not in response.get_data(as_text=True)
    assert count(conn, "payments") == count(conn, "idempotency_keys") == 1
    assert conn.execute("SELECT processor, customer, actor FROM customers").fetchall() == [
        {"processor": "stripe", "customer": CUS, "actor": "alice"}
    ]
    # alice keeps using it; bob's own customers still work
    assert post(stripe, alice, body(), key="key-2").status_code == 201
    assert post(stripe, bob, body(customer="cus_bobs")).status_code == 201


def test_customers_are_bound_per_processor(client, stripe, alice, bob, conn):
    assert post(client, alice, body()).status_code == 201  # bound at the fake
    assert post(stripe, bob, body(), key="key-b").status_code == 201  # Stripe's is new
    assert post(client, bob, body(), key="key-c").get_json()["code"] == "CUSTOMER_NOT_YOURS"
    rows = conn.execute("SELECT processor, actor FROM customers ORDER BY processor").fetchall()
    assert rows == [
        {"processor": "fake", "actor": "alice"},
        {"processor": "stripe", "actor": "bob"},
    ]


def test_a_replay_returns_the_original_even_when_the_customer_is_now_anothers(
    client, stripe, alice, bob, conn
):
    """Alice's create under the fake gateway; then the engine moves to Stripe,
    where bob names the customer first: alice's replay is still hers."""
    payload = body()
    original = post(client, alice, payload).get_json()
    assert post(stripe, bob, payload, key="bobs").status_code == 201
    replay = post(stripe, alice, payload)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json()["id"] == original["id"]
    # ... and a new create of hers with it is refused
    assert post(stripe, alice, payload, key="new").get_json()["code"] == "CUSTOMER_NOT_YOURS"
    assert count(conn, "payments") == 2


def _waiting_for_locks(conn, n: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        waiting = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()["n"]
        if waiting >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{n} creates never waited for the binding")


@pytest.fixture
def stripe_server(stripe_app):
    server = make_server("127.0.0.1", 0, stripe_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _send(url: str, headers: dict, payload: dict, key: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as http:
        return http.post(URL, json=payload, headers={**headers, "Idempotency-Key": key})


def test_creates_that_wait_for_a_first_binding_read_its_owner(
    stripe_server, alice, bob, database_url, conn
):
    """A binding not yet committed: the creates naming its customer wait for
    it, then answer by its owner (alice), not by what they saw before."""
    import psycopg

    payload = body()
    with psycopg.connect(database_url) as binder:  # a transaction, held open
        binder.execute(
            "INSERT INTO customers (processor, customer, actor) VALUES ('stripe', %s, 'alice')",
            (CUS,),
        )
        results = {}
        threads = [
            threading.Thread(
                target=lambda who=who, headers=headers: results.update(
                    {who: _send(stripe_server, headers, payload, f"key-{who}")}
                )
            )
            for who, headers in (("alice", alice), ("bob", bob))
        ]
        for thread in threads:
            thread.start()
        _waiting_for_locks(conn, 2)
        binder.commit()
    for thread in threads:
        thread.join()
    assert results["alice"].status_code == 201, results["alice"].text
    assert results["bob"].json()["code"] == "CUSTOMER_NOT_YOURS"
    assert count(conn, "payments") == 1


def test_actors_racing_to_name_a_new_customer_make_one_binding(stripe_server, make_key, conn):
    actors = {f"racer-{n}": {"Authorization": f"Bearer {make_key(f'racer-{n}')}"} for n in range(6)}
    rounds = 8
    for r in range(rounds):
        payload = body(customer=f"cus_race{r}")
        barrier = threading.Barrier(len(actors))
        results = {}

        def create(actor, headers, payload=payload, barrier=barrier, results=results, r=r):
            barrier.wait()
            results[actor] = _send(stripe_server, headers, payload, f"race-{r}")

        threads = [threading.Thread(target=create, args=item) for item in actors.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [a for a, resp in results.items() if resp.status_code == 201]
        assert len(winners) == 1, {a: resp.text for a, resp in results.items()}
        losers = {a: resp.json()["code"] for a, resp in results.items() if a not in winners}
        assert set(losers.values()) == {"CUSTOMER_NOT_YOURS"}, losers
        [binding] = conn.execute(
            "SELECT actor FROM customers WHERE customer = %s", (f"cus_race{r}",)
        ).fetchall()
        assert binding["actor"] == winners[0]
    assert count(conn, "payments") == count(conn, "customers") == rounds


def test_one_actors_concurrent_creates_naming_a_new_customer_all_succeed(
    stripe_server, alice, conn
):
    """Bound by a sibling create that committed while this one ran: still its
    own. (The window is narrow: several rounds make meeting it likely.)"""
    rounds, siblings = 6, 8
    for r in range(rounds):
        payload = body(customer=f"cus_shared{r}")
        barrier = threading.Barrier(siblings)
        results = []

        def create(n, payload=payload, barrier=barrier, results=results, r=r):
            barrier.wait()
            results.append(_send(stripe_server, alice, payload, f"sibling-{r}-{n}"))

        threads = [threading.Thread(target=create, args=(n,)) for n in range(siblings)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [r.status_code for r in results] == [201] * siblings, [r.text for r in results]
    assert count(conn, "payments") == rounds * siblings and count(conn, "customers") == rounds
