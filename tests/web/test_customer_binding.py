"""Who may charge which customer, with which payment method (docs/customers.md):
customers registered to payers by an admin (CLI and admin API, audited),
``CUSTOMER_BINDING=registered`` refusing every other, and Stripe asked,
through the official SDK against the fake's Stripe surface, whose a
payment method is before a create is written."""

from __future__ import annotations

import json

import pytest
import stripe as stripe_sdk
from click.testing import CliRunner

from paycron.cli import main
from tests.conftest import future, iso
from tests.fake_gateway.stripeclient import sdk
from web import close_app

URL = "/v1/scheduled-payments"
ADMIN_URL = "/v1/admin/customers"
ALICE_CUS, BOB_CUS = "cus_alice0001", "cus_bob00001"


def body(customer: str, method: str, **extra) -> dict:
    return {
        "payee": "acme",
        "amount": 2500,
        "dueAt": iso(future()),
        "customer": customer,
        "paymentMethod": method,
        **extra,
    }


def post(client, headers, payload, key="key-1"):
    return client.post(URL, json=payload, headers={**headers, "Idempotency-Key": key})


def batch(client, headers, items):
    return client.post(f"{URL}/batch", json={"items": items}, headers=headers)


def counts(conn) -> tuple[int, int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM payments) AS p, (SELECT count(*) FROM idempotency_keys) AS k,"
        " (SELECT count(*) FROM customers) AS c"
    ).fetchone()
    return row["p"], row["k"], row["c"]


def events(lines, name):
    return [line for line in lines if line["event"] == name]


@pytest.fixture
def admin(make_key) -> dict:
    return {"Authorization": f"Bearer {make_key('ops-ann', admin=True)}"}


def make_app(config, **overrides):
    from web import create_app

    return create_app(config.with_overrides(**overrides))


@pytest.fixture
def apps():
    made = []

    def build(config, **overrides):
        app = make_app(config, **overrides)
        made.append(app)
        return app.test_client()

    yield build
    for app in made:
        if app.extensions["paycron.payment_method_check"] is not None:
            app.extensions["paycron.payment_method_check"].close()
        close_app(app)


@pytest.fixture
def stripe(stripe_config, apps):
    """The web on the fake's Stripe surface, first use (the default)."""
    return apps(stripe_config)


@pytest.fixture
def methods(gateway):
    """Attach a test token to a customer at the Stripe surface: a new pm_…
    of that customer, as Stripe makes it."""
    client = sdk(gateway.stripe_url)

    def attach(customer: str, token: str = "pm_card_visa") -> str:
        return client.v1.payment_methods.attach(token, params={"customer": customer}).id

    return attach


def checked(client) -> int:
    return client.application.extensions["paycron.payment_method_check"].asked


# -- the Stripe surface's payment methods ------------------------------------------------


def test_the_stub_holds_each_method_for_one_customer(gateway, methods):
    client = sdk(gateway.stripe_url)
    mine = methods(ALICE_CUS)
    assert mine.startswith("pm_") and mine != "pm_card_visa"
    assert client.v1.payment_methods.retrieve(mine).customer == ALICE_CUS
    assert client.v1.payment_methods.retrieve("pm_card_visa").customer is None
    with pytest.raises(stripe_sdk.InvalidRequestError) as refused:
        client.v1.payment_methods.attach(mine, params={"customer": BOB_CUS})
    assert refused.value.http_status == 400
    # Stripe refuses to charge a customer with another customer's method
    with pytest.raises(stripe_sdk.InvalidRequestError) as charged:
        client.v1.payment_intents.create(
            params={
                "amount": 1000,
                "currency": "usd",
                "customer": BOB_CUS,
                "payment_method": mine,
                "confirm": True,
                "off_session": True,
            }
        )
    assert charged.value.http_status == 400
    intent = client.v1.payment_intents.create(
        params={
            "amount": 1000,
            "currency": "usd",
            "customer": ALICE_CUS,
            "payment_method": mine,
            "confirm": True,
            "off_session": True,
        }
    )
    assert intent.status == "succeeded"
    client.v1.payment_methods.detach(mine)
    assert client.v1.payment_methods.retrieve(mine).customer is None
    with pytest.raises(stripe_sdk.InvalidRequestError) as missing:
        client.v1.payment_methods.retrieve("pm_nothing")
    assert missing.value.http_status == 404


# -- whose the payment method is ----------------------------------------------------------


def test_another_customers_method_is_refused_with_its_code_and_nothing_written(
    stripe, alice, bob, conn, methods
):
    alices = methods(ALICE_CUS)
    response = post(stripe, bob, body(BOB_CUS, alices))
    assert response.status_code == 400, response.get_json()
    problem = response.get_json()
    assert problem["code"] == "PAYMENT_METHOD_NOT_CUSTOMERS"
    assert list(problem["errors"]) == ["paymentMethod"]
    assert counts(conn) == (0, 0, 0)
    # the customer's own method, and an unattached test token, are taken
    assert post(stripe, bob, body(BOB_CUS, methods(BOB_CUS)), key="k2").status_code == 201
    assert post(stripe, alice, body(ALICE_CUS, alices), key="k3").status_code == 201
    assert post(stripe, alice, body(ALICE_CUS, "pm_card_visa"), key="k4").status_code == 201


def test_asking_stripe_logs_no_payment_method(stripe, alice, methods, caplog):
    """The SDK logs each request's URL, which names the method it retrieves:
    the line is redacted like every other (docs/api.md)."""
    mine = methods(ALICE_CUS)
    with caplog.at_level("INFO", logger="stripe"):
        assert post(stripe, alice, body(ALICE_CUS, mine)).status_code == 201
    urls = [r.getMessage() for r in caplog.records if "payment_methods" in r.getMessage()]
    assert urls and all("pm_[scrubbed]" in line for line in urls)
    assert mine not in caplog.text and ALICE_CUS not in caplog.text


def test_a_method_stripe_does_not_hold_is_refused(stripe, alice, conn):
    response = post(stripe, alice, body(ALICE_CUS, "pm_nothing_such"))
    assert response.get_json()["code"] == "PAYMENT_METHOD_NOT_CUSTOMERS"
    assert counts(conn) == (0, 0, 0)


def test_a_verdict_is_kept_so_stripe_is_asked_once_per_pair(stripe, alice, methods):
    mine = methods(ALICE_CUS)
    for n in range(3):
        assert post(stripe, alice, body(ALICE_CUS, mine), key=f"k{n}").status_code == 201
    assert checked(stripe) == 1


def test_another_payers_customer_is_refused_before_stripe_is_asked(
    stripe, alice, bob, conn, methods
):
    """No payer can use the check to learn whose a method is: the customer
    is refused first, the same whatever the method."""
    assert post(stripe, alice, body(ALICE_CUS, methods(ALICE_CUS))).status_code == 201
    asked = checked(stripe)
    for method in (methods(ALICE_CUS), methods("cus_elsewhere"), "pm_nothing_such"):
        response = post(stripe, bob, body(ALICE_CUS, method), key=method)
        assert response.get_json()["code"] == "CUSTOMER_NOT_YOURS"
    assert checked(stripe) == asked


def test_batch_items_with_another_customers_method_are_refused_alone(stripe, alice, conn, methods):
    mine, theirs = methods(ALICE_CUS), methods(BOB_CUS)
    items = [
        {"idempotencyKey": f"b{n}", **body(ALICE_CUS, method, amount=2500 + n)}
        for n, method in enumerate([mine, theirs, mine, theirs, "pm_card_visa"])
    ]
    response = batch(stripe, alice, items)
    assert response.status_code == 200, response.get_json()
    results = response.get_json()["results"]
    assert [r["status"] for r in results] == [201, 400, 201, 400, 201]
    assert {results[i]["error"]["code"] for i in (1, 3)} == {"PAYMENT_METHOD_NOT_CUSTOMERS"}
    assert counts(conn)[:2] == (3, 3)
    assert checked(stripe) == 3  # one ask per distinct (customer, method)


def test_an_unreachable_processor_is_503_with_nothing_written_and_replays_still_answer(
    stripe_config, apps, alice, conn, methods
):
    up = apps(stripe_config)
    mine = methods(ALICE_CUS)
    first = body(ALICE_CUS, mine)
    assert post(up, alice, first).status_code == 201
    down = apps(stripe_config, stripe_api_base="http://127.0.0.1:9")  # nothing listens
    refused = post(down, alice, body(ALICE_CUS, mine), key="k2")
    assert refused.status_code == 503
    assert refused.get_json()["code"] == "PROCESSOR_UNAVAILABLE"
    refused = batch(down, alice, [{"idempotencyKey": "b1", **body(ALICE_CUS, mine)}])
    assert refused.status_code == 503
    assert refused.get_json()["code"] == "PROCESSOR_UNAVAILABLE"
    assert counts(conn) == (1, 1, 1)
    # the first create's replay is answered whatever the processor says now
    replay = post(down, alice, first)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"


def test_the_check_can_be_turned_off(stripe_config, apps, bob, methods):
    client = apps(stripe_config, payment_method_check=False)
    assert post(client, bob, body(BOB_CUS, methods(ALICE_CUS))).status_code == 201


# -- registered customers only ------------------------------------------------------------


@pytest.fixture
def registered(config, apps):
    """The fake card processor (no method to check), registered customers only."""
    return apps(config, customer_binding="registered")


def test_registered_only_refuses_a_customer_not_registered_to_the_payer(
    registered, alice, bob, admin, conn
):
    for who in (alice, bob):
        response = post(registered, who, body(ALICE_CUS, "pm_x"))
        assert response.status_code == 400
        problem = response.get_json()
        assert problem["code"] == "CUSTOMER_NOT_YOURS"
        assert "not registered" in problem["errors"]["customer"][0]
    assert counts(conn) == (0, 0, 0)  # nothing bound by use
    done = registered.post(ADMIN_URL, json={"customer": ALICE_CUS, "actor": "alice"}, headers=admin)
    assert done.status_code == 200
    assert post(registered, alice, body(ALICE_CUS, "pm_x")).status_code == 201
    # another payer gets the same answer as for an unregistered customer
    assert (
        post(registered, bob, body(ALICE_CUS, "pm_x"), key="k2").get_json()["errors"]
        == (post(registered, bob, body("cus_nobody", "pm_x"), key="k3").get_json()["errors"])
    )


def test_registered_only_refuses_batch_items_too(registered, alice, admin, conn):
    registered.post(ADMIN_URL, json={"customer": ALICE_CUS, "actor": "alice"}, headers=admin)
    items = [
        {"idempotencyKey": "b1", **body(ALICE_CUS, "pm_x")},
        {"idempotencyKey": "b2", **body("cus_unregistered", "pm_x")},
    ]
    results = batch(registered, alice, items).get_json()["results"]
    assert [r["status"] for r in results] == [201, 400]
    assert results[1]["error"]["code"] == "CUSTOMER_NOT_YOURS"
    assert counts(conn) == (1, 1, 1)


def test_first_use_still_binds_and_a_registration_closes_the_race(client, alice, bob, admin):
    client.post(ADMIN_URL, json={"customer": BOB_CUS, "actor": "bob"}, headers=admin)
    assert post(client, alice, body(BOB_CUS, "pm_x")).get_json()["code"] == "CUSTOMER_NOT_YOURS"
    assert post(client, alice, body("cus_new", "pm_x"), key="k2").status_code == 201
    assert post(client, bob, body(BOB_CUS, "pm_x")).status_code == 201


# -- registering: the admin API -----------------------------------------------------------


def test_the_admin_api_registers_lists_and_removes_and_audits_each(
    client, admin, conn, audit_lines
):
    answer = client.post(ADMIN_URL, json={"customer": ALICE_CUS, "actor": "alice"}, headers=admin)
    assert answer.status_code == 200
    assert answer.get_json()["actor"] == "alice" and answer.get_json()["registeredBy"] == "ops-ann"
    again = client.post(ADMIN_URL, json={"customer": ALICE_CUS, "actor": "alice"}, headers=admin)
    assert again.status_code == 200
    taken = client.post(ADMIN_URL, json={"customer": ALICE_CUS, "actor": "bob"}, headers=admin)
    assert (taken.status_code, taken.get_json()["code"]) == (409, "CUSTOMER_BOUND")
    client.post(ADMIN_URL, json={"customer": BOB_CUS, "actor": "bob"}, headers=admin)

    page = client.get(f"{ADMIN_URL}?limit=1", headers=admin).get_json()
    assert [b["customer"] for b in page["data"]] == [ALICE_CUS]
    rest = client.get(f"{ADMIN_URL}?limit=1&cursor={page['nextCursor']}", headers=admin)
    assert [b["customer"] for b in rest.get_json()["data"]] == [BOB_CUS]
    assert rest.get_json()["nextCursor"] is None
    only_bob = client.get(f"{ADMIN_URL}?actor=bob", headers=admin).get_json()["data"]
    assert [b["actor"] for b in only_bob] == ["bob"]

    removed = client.post(f"{ADMIN_URL}/remove", json={"customer": ALICE_CUS}, headers=admin)
    assert removed.status_code == 200 and removed.get_json()["actor"] == "alice"
    gone = client.post(f"{ADMIN_URL}/remove", json={"customer": ALICE_CUS}, headers=admin)
    assert gone.status_code == 404
    assert [r["customer"] for r in conn.execute("SELECT customer FROM customers")] == [BOB_CUS]

    registered = events(audit_lines, "customer.register")
    assert [line["outcome"] for line in registered] == ["success", "success", "refused", "success"]
    assert registered[0]["actor"] == "ops-ann" and registered[0]["target"] == "customer of alice"
    assert registered[0]["channel"] == "api" and isinstance(registered[0]["key_id"], int)
    removals = events(audit_lines, "customer.remove")
    assert [line["outcome"] for line in removals] == ["success", "refused"]
    reads = events(audit_lines, "admin.read")
    assert [line["target"] for line in reads] == [
        "customer bindings",
        "customer bindings",
        "customer bindings of bob",
    ]
    # an audit line names the payer, never the customer
    assert ALICE_CUS not in json.dumps(audit_lines) and BOB_CUS not in json.dumps(audit_lines)


def test_the_admin_api_is_for_admin_keys_only(client, alice, conn, audit_lines):
    for response in (
        client.post(ADMIN_URL, json={"customer": ALICE_CUS, "actor": "alice"}, headers=alice),
        client.get(ADMIN_URL, headers=alice),
        client.post(f"{ADMIN_URL}/remove", json={"customer": ALICE_CUS}, headers=alice),
    ):
        assert response.status_code == 404
    assert client.get(ADMIN_URL).status_code == 401
    assert counts(conn)[2] == 0
    assert [line["outcome"] for line in events(audit_lines, "api.forbidden")] == ["refused"] * 3
    (unauthorized,) = events(audit_lines, "api.unauthorized")
    assert unauthorized["target"] == f"GET {ADMIN_URL}"


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"customer": ALICE_CUS}, "actor"),
        ({"actor": "alice"}, "customer"),
        ({"customer": "", "actor": "alice"}, "customer"),
        ({"customer": "cus_\u00e9", "actor": "alice"}, "customer"),
        ({"customer": ALICE_CUS, "actor": "alice", "extra": 1}, "extra"),
    ],
)
def test_a_bad_registration_is_a_400_that_binds_nothing(client, admin, conn, payload, field):
    response = client.post(ADMIN_URL, json=payload, headers=admin)
    assert response.status_code == 400 and field in response.get_json()["errors"]
    assert counts(conn)[2] == 0


# -- registering: the CLI -----------------------------------------------------------------


@pytest.fixture
def cli(config):
    env = {"DATABASE_URL": config.database_url, "REDIS_URL": config.redis_url}

    def run(*args, code=0):
        result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result.output

    return run


def test_the_cli_registers_lists_and_removes_and_audits_each(cli, conn, audit_lines):
    said = cli("customer", "register", ALICE_CUS, "--actor", "alice", "--by", "ops-bo")
    assert said.splitlines()[-1] == f"{ALICE_CUS} -> alice at fake: registered"
    cli("customer", "register", BOB_CUS, "--actor", "alice", "--by", "ops-bo")
    cli("customer", "register", ALICE_CUS, "--actor", "bob", "--by", "ops-bo", code=1)
    listed = [line.split("\t") for line in cli("customer", "list").splitlines()]
    assert [row[:3] for row in listed] == [
        [ALICE_CUS, "alice", "ops-bo"],
        [BOB_CUS, "alice", "ops-bo"],
    ]
    assert cli("customer", "list", "--actor", "bob") == ""
    cli("customer", "remove", BOB_CUS, "--by", "ops-bo")
    cli("customer", "remove", BOB_CUS, "--by", "ops-bo", code=1)
    cli("customer", "register", "cus_\u00e9", "--actor", "alice", code=2)
    rows = conn.execute("SELECT customer, actor, registered_by FROM customers").fetchall()
    assert rows == [{"customer": ALICE_CUS, "actor": "alice", "registered_by": "ops-bo"}]

    registered = events(audit_lines, "customer.register")
    assert [line["outcome"] for line in registered] == ["success", "success", "refused"]
    assert {(line["actor"], line["channel"]) for line in registered} == {("ops-bo", "cli")}
    removals = events(audit_lines, "customer.remove")
    assert [line["outcome"] for line in removals] == ["success", "refused"]
    assert ALICE_CUS not in json.dumps(audit_lines) and BOB_CUS not in json.dumps(audit_lines)


def test_a_customer_registered_from_the_cli_is_the_payers_in_registered_mode(
    cli, config, apps, alice, bob
):
    client = apps(config, customer_binding="registered")
    cli("customer", "register", ALICE_CUS, "--actor", "alice")
    assert post(client, alice, body(ALICE_CUS, "pm_x")).status_code == 201
    assert post(client, bob, body(ALICE_CUS, "pm_x")).status_code == 400
