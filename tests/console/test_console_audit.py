"""The console's audit lines: sign-in (success, failure, a payer key
refused), sign-out, a session ended by revocation, pages without a session,
forms without their token, reads of payer data and every action, each with
the operator, the key's id and the client's address; never a key or a
cookie."""

from __future__ import annotations

import pytest

from paycron.store import apikeys
from tests.console_support import console_config, csrf_of
from tests.factories import park
from tests.support import Clock
from web import close_app


@pytest.fixture
def console(config):
    from web import create_app

    app = create_app(console_config(config), clock=Clock(running=True).utc)
    yield app
    close_app(app)


@pytest.fixture
def browser(console):
    return console.test_client()


@pytest.fixture
def admin_key(make_key):
    return make_key("ops-ann", admin=True)


def sign_in(client, key: str):
    token = csrf_of(client.get("/console/sign-in").get_data(as_text=True))
    return client.post("/console/sign-in", data={"api_key": key, "csrf_token": token})


def token_of(client) -> str:
    return csrf_of(client.get("/console/dead-letters").get_data(as_text=True))


def events(lines, name):
    return [line for line in lines if line["event"] == name]


def test_sign_in_success_failure_and_refusal(browser, admin_key, make_key, audit_lines):
    assert sign_in(browser, "pc_nope_nope").status_code == 401
    assert sign_in(browser, make_key("alice")).status_code == 403
    assert sign_in(browser, admin_key).status_code == 302
    failed, refused, signed_in = events(audit_lines, "console.sign_in")
    assert (failed["outcome"], failed["actor"], failed["reason"]) == (
        "failure",
        None,
        "unknown or revoked key",
    )
    assert (refused["outcome"], refused["actor"]) == ("refused", "alice")
    assert (signed_in["outcome"], signed_in["actor"]) == ("success", "ops-ann")
    assert isinstance(signed_in["key_id"], int) and signed_in["remote_addr"] == "127.0.0.1"
    cookie = browser.get_cookie("paycron_console", path="/console").value
    text = str(audit_lines)
    assert admin_key not in text and "pc_nope_nope" not in text and cookie not in text


def test_sign_out_is_logged(browser, admin_key, audit_lines):
    sign_in(browser, admin_key)
    browser.post("/console/sign-out", data={"csrf_token": token_of(browser)})
    (line,) = events(audit_lines, "console.sign_out")
    assert (line["outcome"], line["actor"]) == ("success", "ops-ann")


def test_pages_without_a_session_and_forms_without_a_token_are_logged(
    browser, admin_key, audit_lines
):
    assert browser.get("/console/payments").status_code == 302
    (unauthenticated,) = events(audit_lines, "console.unauthenticated")
    assert unauthenticated["target"] == "/console/payments"
    sign_in(browser, admin_key)
    assert browser.post("/console/sign-out", data={"csrf_token": "forged"}).status_code == 400
    (csrf,) = events(audit_lines, "console.csrf_refused")
    assert (csrf["outcome"], csrf["target"]) == ("refused", "/console/sign-out")


def test_a_session_ended_by_revocation_is_logged(browser, admin_key, conn, audit_lines):
    sign_in(browser, admin_key)
    apikeys.revoke_api_key(conn, admin_key.split("_")[1])
    assert browser.get("/console/").status_code == 302
    (line,) = events(audit_lines, "console.session_ended")
    assert line["outcome"] == "refused" and isinstance(line["key_id"], int)


def test_reads_of_payer_data_are_logged_with_their_filter(browser, admin_key, conn, audit_lines):
    row = park(conn, payer="acme")
    sign_in(browser, admin_key)
    browser.get("/console/payments?payer=acme&status=FAILED")
    browser.get(f"/console/payments/{row['id']}")
    browser.get("/console/dead-letters")
    targets = [line["target"] for line in events(audit_lines, "console.read")]
    assert targets[:3] == [
        "payments payer=acme status=FAILED",
        f"payment {row['id']}",
        "dead letters",
    ]
    assert {line["actor"] for line in events(audit_lines, "console.read")} == {"ops-ann"}


def test_console_actions_are_logged_with_their_outcome(
    browser, admin_key, conn, gateway, audit_lines
):
    charged, other = park(conn, in_doubt=True), park(conn)
    gateway.charge(charged)
    sign_in(browser, admin_key)
    token = token_of(browser)
    browser.post(f"/console/dead-letters/{charged['id']}/refund", data={"csrf_token": token})
    browser.post(f"/console/dead-letters/{charged['id']}/refund", data={"csrf_token": token})
    browser.post(
        f"/console/dead-letters/{other['id']}/dismiss",
        data={"csrf_token": token, "note": "paid by wire"},
    )
    refunded, again = events(audit_lines, "dead_letter.refund")
    assert (refunded["outcome"], refunded["target"], refunded["channel"]) == (
        "success",
        str(charged["id"]),
        "console",
    )
    assert refunded["actor"] == "ops-ann" and again["outcome"] == "refused"
    (dismissed,) = events(audit_lines, "dead_letter.dismiss")
    assert (dismissed["outcome"], dismissed["reason"]) == ("success", "paid by wire")
