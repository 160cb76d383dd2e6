"""A bulk refund over a filter in a real headless Chromium, with four eyes:
one operator filters the dead letters, previews the refund of every match
and requests it; approving it herself is refused; a second operator (another
admin key) approves it, and the runner (the scheduler's, run in a thread
here) works through it while the request's page shows its progress.
Screenshots as in test_console_browser.py."""

from __future__ import annotations

import re
import threading
import time

import pytest
from werkzeug.serving import make_server

from paycron.engine import console_bulk
from tests.console_support import console_config
from tests.factories import park
from tests.processes.test_console_browser import (  # noqa: F401  (fixtures)
    chromium,
    clock,
    go,
    page,
    shots,
    sign_in,
    snap,
)
from tests.rows import letter
from web import close_app

pytestmark = pytest.mark.slow


@pytest.fixture
def server(config, gateway, clock):  # noqa: F811
    """The console on 127.0.0.1, and the bulk runner polling as the scheduler does."""
    from web import create_app

    app = create_app(console_config(config), clock=clock.utc)
    http = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    stop = threading.Event()

    def runner():
        pool, processor = app.extensions["paycron.pool"], app.extensions["paycron.gateway"]
        while not stop.is_set():
            console_bulk.run_once(pool, processor, chunk=2)
            stop.wait(0.2)

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_port}"
    stop.set()
    thread.join()
    http.shutdown()
    close_app(app)


def test_a_bulk_refund_is_requested_refused_to_its_requester_and_approved_by_another(
    page,  # noqa: F811
    server,
    make_key,
    conn,
    gateway,
    shots,  # noqa: F811
):
    from playwright.sync_api import expect

    rows = [park(conn, payer="acme-bulk", in_doubt=True, amount_minor=50000) for _ in range(3)]
    for row in rows:
        gateway.charge(row, amount=50000)
    bystander = park(conn, payer="zed-bulk")
    ann, bob = make_key("ops-ann", admin=True), make_key("ops-bob", admin=True)

    sign_in(page, server, ann)
    go(page, "Dead letters")
    page.get_by_label("Payer").fill("acme-bulk")
    page.get_by_role("button", name="Filter").click()
    assert "payer=acme-bulk" in page.url  # the filter is the address
    expect(page.get_by_role("row").filter(has_text=str(bystander["id"]))).to_have_count(0)
    snap(page, shots, "20-bulk-filtered-dead-letters")

    page.get_by_role("button", name="Refund all matching").click()
    expect(page.get_by_text("3 payments", exact=True)).to_be_visible()
    expect(page.get_by_text("1,500.00 USD")).to_be_visible()
    snap(page, shots, "21-bulk-preview")
    page.get_by_label("Reason").fill("charged twice during the outage")
    page.get_by_role("button", name="Request approval").click()
    expect(page.locator("#bulk-state")).to_have_text("AWAITING_APPROVAL")
    request_id = int(re.search(r"/console/bulk/(\d+)", page.url).group(1))

    go(page, "Approvals")
    row = page.get_by_role("row").filter(has_text=f"Request {request_id}")
    snap(page, shots, "22-bulk-approvals")
    row.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("alert")).to_have_text("You cannot approve your own request.")
    snap(page, shots, "23-bulk-self-approval-refused")
    assert {letter(conn, r["id"])["resolution"] for r in rows} == {None}

    page.get_by_role("button", name="Sign out").click()
    sign_in(page, server, bob)
    go(page, "Approvals")
    page.get_by_role("row").filter(has_text=f"Request {request_id}").get_by_role(
        "button", name="Approve"
    ).click()
    for _ in range(50):  # the runner takes two payments every 0.2 s
        if page.locator("#bulk-state").inner_text() == "FINISHED":
            break
        time.sleep(0.2)
        page.reload()
    expect(page.locator("#bulk-state")).to_have_text("FINISHED")
    expect(page.locator("#bulk-progress")).to_have_text("3 of 3: 3 done, 0 refused")
    snap(page, shots, "24-bulk-finished")
    assert {letter(conn, r["id"])["resolution"] for r in rows} == {"REFUNDED"}
    assert letter(conn, bystander["id"])["resolution"] is None

    go(page, "Audit")
    expect(page.get_by_role("cell", name="console.bulk_approve").first).to_be_visible()
    expect(page.get_by_role("cell", name="console.bulk_finish").first).to_be_visible()
    snap(page, shots, "25-bulk-audit")
