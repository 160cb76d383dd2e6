"""The operator console in a real headless Chromium (Debian's, driven by
playwright), against the web app on a real HTTP server on loopback and the
fake gateway: what an operator does, found by role and label as they see
it. A screenshot of each page is saved; the directory is printed at the
start and end of the run ($PAYCRON_SCREENSHOTS, or a temporary one).
"""

from __future__ import annotations

import os
import shutil
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from paycron.store import apikeys
from tests.console_support import console_config
from tests.factories import add_attempt, insert_payment, park
from tests.rows import letter, payment
from tests.support import Clock
from web import close_app

CHROMIUM = "/usr/bin/chromium"

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

if sync_playwright is None or not shutil.which(CHROMIUM):
    # CI installs both (.ci/run): there a missing browser is a failure, not a skip.
    if os.environ.get("CI"):
        raise RuntimeError(f"the console's browser tests need playwright and {CHROMIUM}")
    pytest.skip(
        f"needs playwright and {CHROMIUM} (apt-get install chromium)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def shots(request, tmp_path_factory):
    """Where each page's screenshot goes, printed so the run shows it."""
    directory = Path(
        os.environ.get("PAYCRON_SCREENSHOTS") or tmp_path_factory.mktemp("console-screenshots")
    )
    directory.mkdir(parents=True, exist_ok=True)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:  # past pytest's capture, onto the run's own output
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.ensure_newline()
                reporter.write_line(line)

    say(f"console screenshots: {directory}")
    yield directory
    say(
        f"console screenshots saved in {directory}: "
        + ", ".join(sorted(p.name for p in directory.glob("*.png")))
    )


@pytest.fixture(scope="module")
def chromium():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield browser
        browser.close()


@pytest.fixture
def clock():
    return Clock(running=True)


@pytest.fixture
def server(config, gateway, clock):
    """The web app with the console on, served threaded on 127.0.0.1."""
    from web import create_app

    app = create_app(console_config(config), clock=clock.utc)
    http = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_port}"
    http.shutdown()
    close_app(app)


@pytest.fixture
def page(chromium):
    context = chromium.new_context(
        viewport={"width": 1360, "height": 900}, java_script_enabled=False
    )  # nothing may need it
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    yield tab
    context.close()


@pytest.fixture
def admin_key(make_key):
    return make_key("ops-ann", admin=True)


def sign_in(page, server: str, key: str, *, path: str = "/console/") -> None:
    page.goto(server + path)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def go(page, link: str) -> None:
    page.get_by_role("navigation", name="Console").get_by_role("link", name=link).click()


def letter_row(page, payment_id):
    return page.get_by_role("row").filter(has_text=str(payment_id))


def snap(page, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def test_sign_in_and_see_every_page(page, server, admin_key, conn, shots):
    now = datetime.now(UTC)
    parked = park(conn, in_doubt=True, in_doubt_since=now - timedelta(minutes=42))
    for n in range(1, 4):
        add_attempt(
            conn,
            parked,
            attempt=n,
            outcome="AMBIGUOUS" if n == 1 else "RETRYABLE_ERROR",
            error_code="timeout" if n == 1 else "http_503",
            finished_at=now - timedelta(minutes=40 - n * 5),
        )
    for n in range(40):
        done = insert_payment(conn, status="COMPLETED", due_at=now - timedelta(minutes=n + 1))
        add_attempt(
            conn,
            done,
            attempt=1,
            outcome="SUCCEEDED",
            gateway_ref=f"ch_{n}",
            finished_at=now - timedelta(minutes=n + 1) + timedelta(seconds=n % 7),
        )
    run = conn.execute(
        "INSERT INTO reconciliation_runs (day, source, finished_at, charges_seen,"
        " mismatches) VALUES (%s, 'gateway', now(), 40, 1) RETURNING id",
        (now.date() - timedelta(days=1),),
    ).fetchone()["id"]
    conn.execute(
        "INSERT INTO reconciliation_items (run_id, kind, charge_id, detail) VALUES "
        "(%s, 'UNKNOWN_REFERENCE', 'ch_zz9', '{\"amount\": 500}')",
        (run,),
    )
    endpoint = conn.execute(
        "INSERT INTO webhook_endpoints (actor, url, secret) VALUES "
        "('alice', 'https://hooks.alice.example/paycron', 'whsec_1') "
        "RETURNING id"
    ).fetchone()["id"]
    events = [
        conn.execute(
            "INSERT INTO payment_events (payment_id, payer, type, status, attempt)"
            " VALUES (%s, 'alice', 'payment.completed', 'COMPLETED', 1) "
            "RETURNING id",
            (parked["id"],),
        ).fetchone()["id"]
        for _ in range(3)
    ]
    conn.execute(
        "INSERT INTO webhook_deliveries (endpoint_id, event_id, attempts, last_status, "
        "last_error) VALUES (%s, %s, 4, 503, 'Service Unavailable')",
        (endpoint, events[0]),
    )

    page.goto(server + "/console/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    snap(page, shots, "01-sign-in")
    sign_in(page, server, admin_key)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text("Signed in as")).to_contain_text("ops-ann")
    expect(page.get_by_role("img", name="Trigger lateness, last hour")).to_be_visible()
    expect(page.get_by_role("img", name="Claims vs due inflow, last hour")).to_be_visible()
    snap(page, shots, "02-overview")

    nav = page.get_by_role("navigation", name="Console")
    nav.get_by_role("link", name="Payments").click()
    page.get_by_label("Status").select_option("FAILED")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("link", name=str(parked["id"]))).to_be_visible()
    snap(page, shots, "03-payments")
    page.get_by_role("link", name=str(parked["id"])).click()
    expect(page.get_by_role("list", name="Attempt timeline")).to_contain_text(
        "Attempt 1: AMBIGUOUS"
    )
    expect(page.get_by_text("+00:00").first).to_be_visible()
    snap(page, shots, "04-payment")

    nav.get_by_role("link", name="Dead letters").click()
    expect(letter_row(page, parked["id"]).first).to_be_visible()
    snap(page, shots, "05-dead-letters")
    letter_row(page, parked["id"]).first.get_by_role("button", name="Dismiss").click()
    expect(page.get_by_role("button", name="Confirm dismiss")).to_be_visible()
    snap(page, shots, "06-confirm")

    nav.get_by_role("link", name="Reconciliation").click()
    expect(page.get_by_role("link", name=f"Run {run}")).to_be_visible()
    snap(page, shots, "07-reconciliation")
    page.get_by_role("link", name=f"Run {run}").click()
    expect(page.get_by_role("cell", name="UNKNOWN_REFERENCE")).to_be_visible()
    snap(page, shots, "08-reconciliation-run")

    nav.get_by_role("link", name="Webhooks").click()
    expect(page.get_by_role("cell", name="https://hooks.alice.example/paycron")).to_be_visible()
    expect(page.get_by_text("Endpoints of alice: 3 events waiting")).to_be_visible()
    expect(page.get_by_role("cell", name="503: Service Unavailable")).to_be_visible()
    snap(page, shots, "09-webhooks")
    page.get_by_role("link", name=str(endpoint)).click()
    expect(page.get_by_role("cell", name="503: Service Unavailable")).to_be_visible()
    page.get_by_role("button", name="Replay").click()
    expect(page.get_by_text(f"of event {events[0]} queued")).to_be_visible()
    expect(page.get_by_role("cell", name="waiting")).to_be_visible()
    snap(page, shots, "09b-webhook-endpoint")

    nav.get_by_role("link", name="History").click()
    expect(page.get_by_role("img", name="Trigger lateness, last hour")).to_be_visible()
    expect(page.get_by_role("img", name="Processor error rate, last hour")).to_be_visible()
    expect(page.get_by_label("Live (every 15 s)")).to_be_checked()  # its script ran
    page.get_by_role("link", name="last 7 days").click()
    expect(page.get_by_role("img", name="Throughput, last 7 days")).to_be_visible()
    snap(page, shots, "09c-history")

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    page.goto(server + "/console/dead-letters")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_find_a_parked_payment_redrive_it_and_see_it_leave_the_list(
    page, server, admin_key, conn, shots
):
    parked = park(conn)
    sign_in(page, server, admin_key)
    go(page, "Payments")
    page.get_by_label("Payment id").fill(str(parked["id"]))
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("heading", name=f"Payment {parked['id']}")).to_be_visible()
    go(page, "Dead letters")
    letter_row(page, parked["id"]).get_by_role("button", name="Re-drive").click()
    expect(page.get_by_text("Recorded as")).to_be_visible()
    page.get_by_role("button", name="Confirm re-drive").click()
    expect(page.get_by_role("status")).to_contain_text(f"{parked['id']}: redriven")
    expect(letter_row(page, parked["id"])).to_have_count(0)
    expect(page.get_by_text("No open dead letters")).to_be_visible()
    snap(page, shots, "10-after-redrive")
    assert payment(conn, parked["id"])["status"] == "PENDING"
    assert letter(conn, parked["id"])["resolved_by"] == "ops-ann"


def test_refund_and_dismiss(page, server, admin_key, conn, gateway, shots):
    charged, lost = park(conn, in_doubt=True), park(conn)
    charge = gateway.charge(charged)
    sign_in(page, server, admin_key, path="/console/dead-letters")
    letter_row(page, charged["id"]).get_by_role("button", name="Refund").click()
    page.get_by_role("button", name="Confirm refund").click()
    expect(page.get_by_role("status")).to_contain_text(f"of charge {charge['id']}")
    expect(letter_row(page, charged["id"])).to_have_count(0)

    letter_row(page, lost["id"]).get_by_role("button", name="Dismiss").click()
    page.get_by_label("Note").fill("paid by bank transfer")
    page.get_by_role("button", name="Confirm dismiss").click()
    expect(page.get_by_role("status")).to_contain_text(f"{lost['id']}: dismissed")
    expect(letter_row(page, lost["id"])).to_have_count(0)
    snap(page, shots, "11-after-refund-and-dismiss")
    assert (
        letter(conn, charged["id"])["resolution"],
        letter(conn, charged["id"])["resolved_by"],
    ) == ("REFUNDED", "ops-ann")
    dismissed = letter(conn, lost["id"])
    assert (dismissed["resolution"], dismissed["resolved_by"], dismissed["note"]) == (
        "DISMISSED",
        "ops-ann",
        "paid by bank transfer",
    )


def test_redrive_a_selection(page, server, admin_key, conn, shots):
    rows = [park(conn) for _ in range(3)]
    sign_in(page, server, admin_key, path="/console/dead-letters")
    for row in rows[:2]:
        page.get_by_label(f"Select {row['id']}").check()
    page.get_by_role("button", name="Re-drive selected").click()
    snap(page, shots, "12-confirm-selection")
    page.get_by_role("button", name="Confirm re-drive of 2").click()
    for row in rows[:2]:
        expect(letter_row(page, row["id"])).to_have_count(0)
    expect(letter_row(page, rows[2]["id"])).to_have_count(1)
    assert [letter(conn, r["id"])["resolution"] for r in rows] == ["REDRIVEN", "REDRIVEN", None]


def test_a_post_without_its_csrf_token_is_refused(page, server, admin_key, conn, chromium):
    row = park(conn)
    sign_in(page, server, admin_key, path=f"/console/dead-letters/{row['id']}/dismiss")
    # the session's own cookie, the form without its token (as a forged page would send it)
    answer = page.request.post(
        f"{server}/console/dead-letters/{row['id']}/dismiss", form={"note": "forged"}
    )
    assert answer.status == 400 and "CSRF" in answer.text()
    answer = page.request.post(
        f"{server}/console/dead-letters/{row['id']}/dismiss",
        form={"note": "forged", "csrf_token": "guessed"},
    )
    assert answer.status == 400
    assert letter(conn, row["id"])["resolution"] is None
    # the same form with JavaScript on, its token removed from the page before it is sent
    context = chromium.new_context()
    scripted = context.new_page()
    try:
        sign_in(scripted, server, admin_key, path=f"/console/dead-letters/{row['id']}/dismiss")
        scripted.eval_on_selector_all(
            "input[name=csrf_token]", "all => all.forEach(e => e.remove())"
        )
        with scripted.expect_response(lambda r: r.request.method == "POST") as sent:
            scripted.get_by_role("button", name="Confirm dismiss").click()
        assert sent.value.status == 400
        expect(scripted.get_by_role("alert")).to_contain_text("CSRF")
    finally:
        context.close()
    assert letter(conn, row["id"])["resolution"] is None


def test_a_payer_key_is_refused(page, server, make_key, shots):
    sign_in(page, server, make_key("alice"))
    expect(page.get_by_role("alert")).to_contain_text("only an admin API key can sign in")
    expect(page.get_by_label("API key")).to_be_visible()
    snap(page, shots, "13-payer-key-refused")
    page.goto(server + "/console/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


@pytest.mark.parametrize(
    "path",
    [
        "/console/",
        "/console/payments",
        "/console/dead-letters",
        "/console/reconciliation",
        "/console/webhooks",
    ],
)
def test_no_page_without_a_session(page, server, admin_key, path):
    page.goto(server + path)
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_role("navigation", name="Console")).to_have_count(0)
    page.get_by_label("API key").fill(admin_key)
    page.get_by_role("button", name="Sign in").click()
    assert page.url == server + path


def test_session_expiry_and_a_revoked_key_end_the_session(
    page, server, admin_key, conn, clock, shots
):
    sign_in(page, server, admin_key)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    clock.advance(minutes=61)
    page.reload()
    expect(page.get_by_role("status")).to_contain_text("Your session expired")
    snap(page, shots, "14-session-expired")
    page.get_by_label("API key").fill(admin_key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    apikeys.revoke_api_key(conn, admin_key.split("_")[1])
    go(page, "Dead letters")
    expect(page.get_by_role("status")).to_contain_text("its API key was revoked")
    page.get_by_label("API key").fill(admin_key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("unknown or revoked")
