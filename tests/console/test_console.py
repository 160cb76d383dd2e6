"""The operator console through Flask's test client: who may see it, the
session and CSRF rules, and each page and action on seeded rows (the same
scenarios in a real browser: tests/processes/test_console_browser.py)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

from paycron.config import Config
from paycron.errors import ConfigError
from paycron.store import apikeys
from tests.console_support import SECRET, console_config, csrf_of
from tests.factories import add_attempt, insert_payment, park
from tests.rows import letter, payment
from tests.support import Clock
from web import close_app

PAGES = [
    "/console/",
    "/console/payments",
    "/console/payments?status=FAILED",
    "/console/dead-letters",
    "/console/reconciliation",
    "/console/webhooks",
]


@pytest.fixture
def clock():
    return Clock(running=True)


@pytest.fixture
def console(config, clock):
    from web import create_app

    app = create_app(console_config(config), clock=clock.utc)
    yield app
    close_app(app)


@pytest.fixture
def browser(console):
    return console.test_client()


@pytest.fixture
def admin_key(make_key):
    return make_key("ops-ann", admin=True)


def sign_in(client, key: str, **extra):
    token = csrf_of(client.get("/console/sign-in").get_data(as_text=True))
    return client.post("/console/sign-in", data={"api_key": key, "csrf_token": token, **extra})


@pytest.fixture
def signed_in(browser, admin_key):
    assert sign_in(browser, admin_key).status_code == 302
    return browser


def page_token(client, url: str = "/console/dead-letters") -> str:
    return csrf_of(client.get(url).get_data(as_text=True))


# -- settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value", [("CONSOLE_SECRET_KEY", "too-short"), ("CONSOLE_SESSION_MINUTES", "0")]
)
def test_console_settings_are_checked_at_start(name, value):
    with pytest.raises(ConfigError) as refused:
        Config.from_env({name: value})
    assert name in str(refused.value)


def test_the_secret_key_stays_out_of_the_config_repr():
    config = Config.from_env({"CONSOLE_SECRET_KEY": SECRET, "CONSOLE_SESSION_MINUTES": "15"})
    assert config.console_session_minutes == 15 and SECRET not in repr(config)


# -- who may see it --------------------------------------------------------------


def test_without_a_secret_key_there_is_no_console(client):
    assert client.get("/console/").status_code == 404
    assert client.get("/console/sign-in").status_code == 404


@pytest.mark.parametrize(
    "url",
    PAGES + ["/console/reconciliation/1", "/console/payments/0193a000-0000-7000-8000-000000000000"],
)
def test_no_page_without_a_session(browser, url):
    answer = browser.get(url)
    assert answer.status_code == 302
    location = urlsplit(answer.headers["Location"])
    assert (location.path, parse_qs(location.query)) == ("/console/sign-in", {"next": [url]})


def test_an_admin_key_signs_in_and_sees_every_page(signed_in):
    for url in PAGES:
        answer = signed_in.get(url)
        assert answer.status_code == 200, url
        assert "Signed in as <strong>ops-ann</strong>" in answer.get_data(as_text=True)


def test_a_payer_key_is_refused_with_a_clear_message(browser, make_key):
    answer = sign_in(browser, make_key("alice"))
    assert answer.status_code == 403
    assert "only an admin API key can sign in" in answer.get_data(as_text=True)
    assert browser.get("/console/").status_code == 302


def test_an_unknown_key_is_refused(browser):
    answer = sign_in(browser, "pc_00000000_nope")
    assert answer.status_code == 401
    assert "unknown or revoked" in answer.get_data(as_text=True)


def test_sign_in_goes_back_to_the_page_asked_for_but_never_off_the_console(browser, admin_key):
    assert (
        sign_in(browser, admin_key, next="/console/webhooks").headers["Location"]
        == "/console/webhooks"
    )
    for elsewhere in ("https://evil.example/", "//evil.example/console/", "/v1/admin/x"):
        assert sign_in(browser, admin_key, next=elsewhere).headers["Location"] == "/console/"


# -- the session cookie --------------------------------------------------------------


def cookie_header(answer) -> str:
    (header,) = [
        h for h in answer.headers.getlist("Set-Cookie") if h.startswith("paycron_console=")
    ]
    return header


def test_the_session_cookie_is_httponly_strict_and_scoped_to_the_console(browser, admin_key):
    header = cookie_header(sign_in(browser, admin_key))
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/console" in header
    assert "Secure" not in header  # localhost: plain http works for a developer
    assert admin_key not in header and hashlib.sha256(admin_key.encode()).hexdigest() not in header


def test_off_localhost_the_cookie_is_secure(console, admin_key):
    client = console.test_client()
    base = "https://console.example.com"
    token = csrf_of(client.get("/console/sign-in", base_url=base).get_data(as_text=True))
    answer = client.post(
        "/console/sign-in", base_url=base, data={"api_key": admin_key, "csrf_token": token}
    )
    assert answer.status_code == 302
    assert "Secure" in cookie_header(answer)


def test_the_api_never_opens_or_sets_a_console_session(browser, alice):
    assert "Set-Cookie" not in browser.get("/healthz").headers
    assert "Set-Cookie" not in browser.get("/v1/scheduled-payments", headers=alice).headers


def test_a_tampered_cookie_is_no_session(browser, signed_in):
    cookie = browser.get_cookie("paycron_console", path="/console")
    forged = cookie.value[:-3] + ("AAA" if not cookie.value.endswith("AAA") else "BBB")
    browser.set_cookie("paycron_console", forged, path="/console")
    assert browser.get("/console/").status_code == 302


def test_the_session_expires_after_its_minutes_whatever_is_done_in_it(signed_in, clock):
    clock.advance(minutes=59)
    assert signed_in.get("/console/").status_code == 200
    clock.advance(minutes=1, seconds=1)
    answer = signed_in.get("/console/")
    assert answer.status_code == 302
    assert "Your session expired" in signed_in.get(answer.headers["Location"]).get_data(
        as_text=True
    )
    assert signed_in.get("/console/").status_code == 302


def test_revoking_the_key_ends_its_session(signed_in, conn, admin_key):
    assert signed_in.get("/console/").status_code == 200
    prefix = admin_key.split("_")[1]
    assert apikeys.revoke_api_key(conn, prefix).revoked is not None
    answer = signed_in.get("/console/payments")
    assert answer.status_code == 302
    assert "its API key was revoked" in signed_in.get(answer.headers["Location"]).get_data(
        as_text=True
    )


def test_a_revocation_ends_its_sessions_at_once_whatever_the_api_caches(config, conn, make_key):
    """The API trusts a key for API_KEY_CACHE_SECONDS; the console reads the
    key's row on every request, so a revocation ends its sessions at once."""
    from web import create_app

    moments = [0.0]
    app = create_app(console_config(config, api_key_cache_seconds=10))
    app.extensions["paycron.principals"]._monotonic = lambda: moments[0]
    try:
        client, key = app.test_client(), make_key("ops-bo", admin=True)
        sign_in(client, key)
        assert client.get("/console/").status_code == 200
        bearer = {"Authorization": f"Bearer {key}"}
        assert client.get("/v1/admin/dead-letters", headers=bearer).status_code == 200
        apikeys.revoke_api_key(conn, key.split("_")[1])
        assert client.get("/v1/admin/dead-letters", headers=bearer).status_code == 200  # cached
        assert client.get("/console/").status_code == 302
        # and a revoked key the API still trusts from its cache cannot sign in again
        assert sign_in(client, key).status_code == 401
    finally:
        close_app(app)


def test_sign_out_ends_the_session(signed_in):
    answer = signed_in.post("/console/sign-out", data={"csrf_token": page_token(signed_in)})
    assert answer.status_code == 302
    assert signed_in.get("/console/").status_code == 302


def _cookie(client) -> str:
    return client.get_cookie("paycron_console", path="/console").value


def _session_id(app, client) -> str | None:
    serializer = app.session_interface.get_signing_serializer(app)
    return serializer.loads(_cookie(client)).get("sid")


def test_a_copy_of_the_cookie_is_nobodys_session_after_sign_out(console, signed_in):
    copied = _cookie(signed_in)
    assert (
        signed_in.post("/console/sign-out", data={"csrf_token": page_token(signed_in)}).status_code
        == 302
    )
    replay = console.test_client()
    replay.set_cookie("paycron_console", copied, path="/console")
    assert replay.get("/console/").status_code == 302
    assert replay.post("/console/dead-letters/redrive-selected").status_code in (302, 400)


def test_the_session_lives_on_the_server_and_the_cookie_holds_no_key(console, signed_in, admin_key):
    session_id = _session_id(console, signed_in)
    serializer = console.session_interface.get_signing_serializer(console)
    assert set(serializer.loads(_cookie(signed_in))) == {"sid", "signed_in_at", "csrf_token"}
    store = console.extensions["paycron.console.sessions"]
    assert store.get(session_id)["key_id"] is not None
    store.end(session_id)  # as another process's sign-out would
    assert signed_in.get("/console/").status_code == 302


def test_sign_in_rotates_the_session_id_and_ends_the_previous_one(console, signed_in, admin_key):
    before, copied = _session_id(console, signed_in), _cookie(signed_in)
    assert sign_in(signed_in, admin_key).status_code == 302
    after = _session_id(console, signed_in)
    assert after and before and after != before
    assert signed_in.get("/console/").status_code == 200
    replay = console.test_client()
    replay.set_cookie("paycron_console", copied, path="/console")
    assert replay.get("/console/").status_code == 302


# -- CSRF --------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "", "forged"])
def test_a_post_without_its_csrf_token_is_refused_and_changes_nothing(signed_in, conn, token):
    row = park(conn)
    data = {"note": "x"} if token is None else {"note": "x", "csrf_token": token}
    answer = signed_in.post(f"/console/dead-letters/{row['id']}/dismiss", data=data)
    assert answer.status_code == 400
    assert "CSRF" in answer.get_data(as_text=True)
    assert letter(conn, row["id"])["resolution"] is None
    assert signed_in.post("/console/sign-out", data=data).status_code == 400
    assert signed_in.get("/console/").status_code == 200  # still signed in


def test_the_sign_in_form_needs_its_csrf_token_too(browser, admin_key):
    browser.get("/console/sign-in")
    assert browser.post("/console/sign-in", data={"api_key": admin_key}).status_code == 400


def test_another_sessions_token_is_refused(console, signed_in, conn, make_key):
    other = console.test_client()
    sign_in(other, make_key("ops-cy", admin=True))
    row = park(conn)
    answer = signed_in.post(
        f"/console/dead-letters/{row['id']}/dismiss", data={"csrf_token": page_token(other)}
    )
    assert answer.status_code == 400


# -- pages ---------------------------------------------------------------------------------

UTC_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00")


def test_the_overview_has_the_numbers_and_two_pictures(signed_in, conn):
    now = datetime.now(UTC)
    for n in range(3):
        row = insert_payment(conn, status="COMPLETED", due_at=now - timedelta(minutes=5 + n))
        add_attempt(
            conn,
            row,
            attempt=1,
            outcome="SUCCEEDED",
            finished_at=now - timedelta(minutes=5 + n) + timedelta(seconds=2),
        )
    park(conn)
    html = signed_in.get("/console/").get_data(as_text=True)
    for label in (
        "Backlog",
        "Oldest due pending",
        "Lateness p50",
        "Lateness p99",
        "Open dead letters",
        "Circuit",
        "Partitions ahead",
        "Awaiting the gateway",
        "Other processor",
    ):
        assert label in html
    assert html.count("<svg") == 2 and "<polyline" in html and '<rect class="bar"' in html
    assert "closed" in html and UTC_TIME.search(html)


def test_the_overview_numbers_are_read_once_per_interval(console, signed_in, conn):
    cached = console.extensions["paycron.console.overview"]
    first = cached.get()
    park(conn)
    signed_in.get("/console/")
    assert cached.get() is first  # the same read answers within CONSOLE cache seconds


def test_find_a_payment_by_id_and_see_its_attempt_timeline(signed_in, conn):
    row = park(conn, in_doubt=True)
    first = datetime.now(UTC) - timedelta(minutes=10)
    add_attempt(conn, row, attempt=1, outcome="AMBIGUOUS", error_code="timeout", finished_at=first)
    add_attempt(
        conn,
        row,
        attempt=2,
        outcome="RETRYABLE_ERROR",
        error_code="http_503",
        gateway_ref="ch_123",
        finished_at=first + timedelta(minutes=1),
    )
    answer = signed_in.get("/console/payments", query_string={"id": str(row["id"]).upper()})
    assert answer.headers["Location"] == f"/console/payments/{row['id']}"
    html = signed_in.get(answer.headers["Location"]).get_data(as_text=True)
    assert "Attempt 1: AMBIGUOUS" in html and "code timeout" in html
    assert "Attempt 2: RETRYABLE_ERROR" in html and "gateway ref ch_123" in html
    assert "RETRIES_EXHAUSTED" in html and UTC_TIME.search(html)
    assert signed_in.get("/console/payments", query_string={"id": "nope"}).status_code == 400
    missing = "0193a000-0000-7000-8000-000000000000"
    assert signed_in.get(f"/console/payments/{missing}").status_code == 404


def test_payments_by_payer_ride_the_idempotency_index(signed_in, conn):
    rows = []
    for n in range(3):
        row = insert_payment(
            conn,
            payer="acme",
            status="FAILED" if n == 1 else "PENDING",
            due_at=datetime.now(UTC) + timedelta(days=n),
        )
        conn.execute(
            "INSERT INTO idempotency_keys (actor, key, request_hash, payment_id, due_at)"
            " VALUES ('acme', %s, '\\x00', %s, %s)",
            (f"k{n}", row["id"], row["due_at"]),
        )
        rows.append(row)
    html = signed_in.get("/console/payments", query_string={"payer": "acme"}).get_data(as_text=True)
    assert all(str(r["id"]) in html for r in rows)
    html = signed_in.get(
        "/console/payments", query_string={"payer": "acme", "status": "FAILED"}
    ).get_data(as_text=True)
    assert str(rows[1]["id"]) in html and str(rows[0]["id"]) not in html


def test_payments_by_status_read_one_due_day_in_bounded_stretches(signed_in, conn, monkeypatch):
    from web.console import reads

    monkeypatch.setattr(reads, "DAY_SCAN", 4)
    monkeypatch.setattr(reads, "PAGE", 2)
    day = datetime.now(UTC).replace(hour=1, minute=0, second=0, microsecond=0) + timedelta(days=2)
    statuses = ["PENDING", "CANCELLED", "PENDING", "PENDING", "PENDING", "CANCELLED"]
    rows = [
        insert_payment(conn, status=s, due_at=day + timedelta(minutes=i))
        for i, s in enumerate(statuses)
    ]
    query = {"status": "CANCELLED", "day": day.date().isoformat()}
    first = signed_in.get("/console/payments", query_string=query).get_data(as_text=True)
    assert str(rows[1]["id"]) in first and str(rows[5]["id"]) not in first
    assert "Read 4 payments" in first
    cursor = re.search(r"cursor=([0-9a-f-]+)", first).group(1)
    assert cursor == str(rows[3]["id"])  # the stretch ended at the 4th row read
    second = signed_in.get("/console/payments", query_string={**query, "cursor": cursor})
    html = second.get_data(as_text=True)
    assert str(rows[5]["id"]) in html and 'rel="next"' not in html
    assert signed_in.get("/console/payments", query_string={"status": "BOGUS"}).status_code == 400
    assert signed_in.get("/console/payments", query_string={"day": "2026-13-01"}).status_code == 400


def test_empty_states_say_so(signed_in):
    assert "No open dead letters" in signed_in.get("/console/dead-letters").get_data(as_text=True)
    assert "No payment is awaiting the gateway" in signed_in.get("/console/dead-letters").get_data(
        as_text=True
    )
    assert "No reconciliation has run yet" in signed_in.get("/console/reconciliation").get_data(
        as_text=True
    )
    assert "No live webhook endpoints" in signed_in.get("/console/webhooks").get_data(as_text=True)
    assert "Filter by payment id" in signed_in.get("/console/payments").get_data(as_text=True)


def test_parked_in_doubt_is_listed_with_its_age(signed_in, conn):
    doubtful = park(conn, in_doubt=True, in_doubt_since=datetime.now(UTC) - timedelta(hours=2))
    plain = park(conn)
    html = signed_in.get("/console/dead-letters").get_data(as_text=True)
    section = html.split('id="doubt-title"')[1].split('id="awaiting-title"')[0]
    assert str(doubtful["id"]) in section and str(plain["id"]) not in section
    assert "2h" in section


def test_payments_awaiting_the_gateway_are_listed_with_their_age(signed_in, conn):
    since = datetime.now(UTC) - timedelta(hours=3)
    row = insert_payment(
        conn,
        status="AWAITING_GATEWAY",
        gateway_intent_id="pi_waits",
        awaiting_since=since,
        next_poll_at=since + timedelta(hours=4),
    )
    html = signed_in.get("/console/dead-letters").get_data(as_text=True)
    section = html.split('id="awaiting-title"')[1]
    assert str(row["id"]) in section and "pi_waits" in section and "3h" in section


def test_reconciliation_runs_and_their_items(signed_in, conn):
    run = conn.execute(
        "INSERT INTO reconciliation_runs (day, source, finished_at, mismatches) "
        "VALUES ('2026-11-30', 'file', now(), 1) RETURNING id"
    ).fetchone()["id"]
    conn.execute(
        "INSERT INTO reconciliation_items (run_id, kind, charge_id, detail) "
        "VALUES (%s, 'UNKNOWN_REFERENCE', 'ch_zz', '{\"amount\": 5}')",
        (run,),
    )
    html = signed_in.get("/console/reconciliation").get_data(as_text=True)
    assert f"Run {run}" in html and "2026-11-30" in html
    html = signed_in.get(f"/console/reconciliation/{run}").get_data(as_text=True)
    assert "UNKNOWN_REFERENCE" in html and "ch_zz" in html
    assert signed_in.get("/console/reconciliation/999999").status_code == 404


def test_webhook_endpoints_with_their_backlog_per_payer(signed_in, conn):
    conn.execute(
        "INSERT INTO webhook_endpoints (actor, url, secret) "
        "VALUES ('acme', 'https://hooks.acme.example/in', 'whsec_x')"
    )
    for _ in range(3):
        insert_payment(conn, payer="acme")
        conn.execute(
            "INSERT INTO payment_events (payment_id, payer, type, status, attempt) "
            "VALUES (gen_random_uuid(), 'acme', 'payment.created', 'PENDING', 0)"
        )
    html = signed_in.get("/console/webhooks").get_data(as_text=True)
    assert "https://hooks.acme.example/in" in html
    assert "Endpoints of acme: 3 events waiting" in html
    assert "none yet" in html  # no delivery attempted yet


def test_webhooks_filter_by_payer_backlog_and_failing(signed_in, conn):
    endpoints = {
        actor: conn.execute(
            "INSERT INTO webhook_endpoints (actor, url, secret) "
            "VALUES (%s, %s, 'whsec_x') RETURNING id",
            (actor, f"https://hooks.{actor}.example/in"),
        ).fetchone()["id"]
        for actor in ("calm", "busy", "sick")
    }
    for actor in ("busy", "sick"):
        conn.execute(
            "INSERT INTO payment_events (payment_id, payer, type, status, attempt) "
            "VALUES (gen_random_uuid(), %s, 'payment.created', 'PENDING', 0)",
            (actor,),
        )
    head = conn.execute(
        "SELECT id FROM payment_events WHERE payer = 'sick' ORDER BY id LIMIT 1"
    ).fetchone()["id"]
    conn.execute(  # tried, not delivered
        "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_status) "
        "VALUES (%s, %s, 2, 500)",
        (endpoints["sick"], head),
    )

    def shown(**query) -> set:
        html = signed_in.get("/console/webhooks", query_string=query).get_data(as_text=True)
        return {actor for actor in endpoints if f"https://hooks.{actor}.example/in" in html}

    assert shown() == {"calm", "busy", "sick"}
    assert shown(payer="busy") == {"busy"}
    assert shown(only="backlog") == {"busy", "sick"}
    assert shown(only="failing") == {"sick"}
    assert shown(payer="calm", only="backlog") == set()
    html = signed_in.get("/console/webhooks", query_string={"payer": "busy"}).get_data(as_text=True)
    assert 'value="busy"' in html and ">Filter</button>" in html
    assert signed_in.get("/console/webhooks?only=stuck").status_code == 400


def test_a_caught_up_endpoint_shows_its_latest_answer(signed_in, conn):
    """Every event delivered, none waiting: the page still says how the last
    delivery went, not a dash."""
    (endpoint,) = (
        conn.execute(
            "INSERT INTO webhook_endpoints (actor, url, secret) "
            "VALUES ('acme', 'https://hooks.acme.example/in', 'whsec_x') RETURNING id"
        )
        .fetchone()
        .values()
    )
    for event_id, status in ((1, 500), (2, 204)):
        conn.execute(
            "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_status, "
            "delivered_at) VALUES (%s, %s, 1, %s, now())",
            (endpoint, event_id, status),
        )
    html = signed_in.get("/console/webhooks").get_data(as_text=True)
    row = html[html.index("https://hooks.acme.example/in") :].split("</tr>", 1)[0]
    *_, last_answer, _next_try = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert last_answer.startswith("204 at "), last_answer


# -- actions ------------------------------------------------------------------------------------


def test_dismiss_is_confirmed_then_recorded_with_the_operator(signed_in, conn):
    row = park(conn)
    confirm = signed_in.get(f"/console/dead-letters/{row['id']}/dismiss")
    html = confirm.get_data(as_text=True)
    assert "Confirm dismiss" in html and "ops-ann" in html
    assert letter(conn, row["id"])["resolution"] is None  # the confirmation page changes nothing
    answer = signed_in.post(
        f"/console/dead-letters/{row['id']}/dismiss",
        data={"csrf_token": csrf_of(html), "note": "customer paid by wire"},
    )
    assert answer.status_code == 302
    closed = letter(conn, row["id"])
    assert (closed["resolution"], closed["resolved_by"], closed["note"]) == (
        "DISMISSED",
        "ops-ann",
        "customer paid by wire",
    )
    html = signed_in.get("/console/dead-letters").get_data(as_text=True)
    assert f"{row['id']}: dismissed" in html and "No open dead letters" in html


def test_redrive_and_refund_through_the_gateway(signed_in, conn, gateway):
    lost, charged = park(conn), park(conn, in_doubt=True)
    charge = gateway.charge(charged)
    token = page_token(signed_in)
    signed_in.post(f"/console/dead-letters/{lost['id']}/redrive", data={"csrf_token": token})
    assert payment(conn, lost["id"])["status"] == "PENDING"
    assert letter(conn, lost["id"])["resolved_by"] == "ops-ann"
    signed_in.post(f"/console/dead-letters/{charged['id']}/refund", data={"csrf_token": token})
    refunded = letter(conn, charged["id"])
    assert (refunded["resolution"], refunded["resolved_by"]) == ("REFUNDED", "ops-ann")
    assert charge["id"] in refunded["note"]
    # a second refund is refused, and says so
    signed_in.post(f"/console/dead-letters/{charged['id']}/refund", data={"csrf_token": token})
    assert "refused: the dead letter is already resolved" in signed_in.get(
        "/console/dead-letters"
    ).get_data(as_text=True)


def test_a_refund_with_no_charge_is_refused_and_leaves_the_letter_open(signed_in, conn, gateway):
    row = park(conn)
    signed_in.post(
        f"/console/dead-letters/{row['id']}/refund", data={"csrf_token": page_token(signed_in)}
    )
    assert letter(conn, row["id"])["resolution"] is None
    assert "holds no charge" in signed_in.get("/console/dead-letters").get_data(as_text=True)


def test_a_selection_is_confirmed_then_re_driven(signed_in, conn, gateway):
    rows = [park(conn) for _ in range(3)]
    chosen = [str(rows[0]["id"]), str(rows[2]["id"])]
    token = page_token(signed_in)
    confirm = signed_in.post(
        "/console/dead-letters/redrive-selected", data={"csrf_token": token, "payment_id": chosen}
    )
    html = confirm.get_data(as_text=True)
    assert confirm.status_code == 200 and "Confirm re-drive of 2" in html
    assert all(letter(conn, r["id"])["resolution"] is None for r in rows)
    signed_in.post(
        "/console/dead-letters/redrive-selected",
        data={"csrf_token": token, "payment_id": chosen, "confirmed": "yes"},
    )
    assert [letter(conn, r["id"])["resolution"] for r in rows] == ["REDRIVEN", None, "REDRIVEN"]


def test_an_unknown_action_or_letter_is_a_404(signed_in, conn):
    row = park(conn)
    assert signed_in.get(f"/console/dead-letters/{row['id']}/launch").status_code == 404
    other = insert_payment(conn)
    assert signed_in.get(f"/console/dead-letters/{other['id']}/dismiss").status_code == 404


# -- money as people read it ----------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [(50003, "USD", "500.03 USD"), (500, "JPY", "500 JPY"), (5120, "BHD", "5.120 BHD")],
)
def test_amounts_are_major_units_with_the_minor_units_on_hover(
    signed_in, conn, amount, currency, shown
):
    row = park(conn, amount_minor=amount, currency=currency)
    title = f'title="{amount} minor units"'
    for url in (f"/console/payments/{row['id']}", "/console/dead-letters"):
        html = signed_in.get(url).get_data(as_text=True)
        assert f'<span class="money" {title}>{shown}</span>' in html, url
        if shown != f"{amount} {currency}":  # never the minor units as if major
            assert f">{amount} {currency}<" not in html


def test_the_confirmation_says_which_keys_a_redrive_and_a_refund_use(signed_in, conn):
    """A re-drive that finds nothing moves to the next key generation (the
    processor replays its stored answer for the current one), and Stripe
    keys a refund by the intent it refunds, not by the payment id."""
    row = park(conn, key_generation=2, processor="stripe")
    redrive = signed_in.get(f"/console/dead-letters/{row['id']}/redrive").get_data(as_text=True)
    assert "the same idempotency key" not in redrive
    assert f"next idempotency key ({row['id']}:3)" in redrive
    assert f"not the current one ({row['id']}:2)" in redrive
    refund = signed_in.get(f"/console/dead-letters/{row['id']}/refund").get_data(as_text=True)
    assert "refund:&lt;intent id&gt;" in refund and "refund:&lt;payment id&gt;" not in refund
    at_fake = park(conn, processor="fake")
    refund = signed_in.get(f"/console/dead-letters/{at_fake['id']}/refund").get_data(as_text=True)
    assert "refund:&lt;payment id&gt;" in refund


def test_the_selection_promises_the_next_key_not_the_same_one(signed_in, conn):
    rows = [park(conn) for _ in range(2)]
    confirm = signed_in.post(
        "/console/dead-letters/redrive-selected",
        data={"csrf_token": page_token(signed_in), "payment_id": [str(r["id"]) for r in rows]},
    )
    html = confirm.get_data(as_text=True)
    assert "the same idempotency key" not in html and "next idempotency key" in html
