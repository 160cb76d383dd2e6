"""The console's filters, bulk actions over a filter, four-eyes approvals,
the audit page and cancelling a PENDING payment, against the real database
and the fake gateway (docs/console.md)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from paycron.engine import console_bulk
from tests.console_support import console_config, csrf_of
from tests.factories import insert_payment, park
from tests.rows import letter, payment
from tests.support import Clock
from web import close_app


@pytest.fixture
def console(config):
    from web import create_app

    app = create_app(
        console_config(config, console_bulk_max=5, console_approval_above_minor=100_000),
        clock=Clock(running=True).utc,
    )
    yield app
    close_app(app)


def signed_in_as(console, make_key, actor: str):
    client = console.test_client()
    token = csrf_of(client.get("/console/sign-in").get_data(as_text=True))
    key = make_key(actor, admin=True)
    answer = client.post("/console/sign-in", data={"api_key": key, "csrf_token": token})
    assert answer.status_code == 302
    return client


@pytest.fixture
def ann(console, make_key):
    return signed_in_as(console, make_key, "ops-ann")


@pytest.fixture
def bob(console, make_key):
    return signed_in_as(console, make_key, "ops-bob")


def run_all(console, *, chunk: int = 50) -> console_bulk.RunCounts:
    """What the scheduler's runner does, until nothing is left."""
    pool, gateway = console.extensions["paycron.pool"], console.extensions["paycron.gateway"]
    total = console_bulk.RunCounts()
    for _ in range(20):
        counts = console_bulk.run_once(pool, gateway, chunk=chunk)
        total = console_bulk.RunCounts(
            total.done + counts.done,
            total.refused + counts.refused,
            total.finished + counts.finished,
            total.expired + counts.expired,
        )
        if not (counts.done or counts.refused):
            return total
    return total


def request_bulk(client, name: str, query: dict, *, reason: str = "cleanup after outage"):
    """Preview, then confirm (or request approval): the request's page."""
    preview = client.get(f"/console/dead-letters/all/{name}", query_string=query)
    assert preview.status_code == 200, preview.get_data(as_text=True)
    html = preview.get_data(as_text=True)
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    answer = client.post(
        f"/console/dead-letters/all/{name}",
        data={**query, "csrf_token": csrf_of(html), "digest": digest, "note": reason},
    )
    return html, answer


def request_cancel(client, query: dict, *, reason: str = "merchant closed"):
    """A bulk cancel's preview, then its confirmation (or approval request)."""
    preview = client.get("/console/payments/all/cancel", query_string=query)
    assert preview.status_code == 200, preview.get_data(as_text=True)
    html = preview.get_data(as_text=True)
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    answer = client.post(
        "/console/payments/all/cancel",
        data={**query, "csrf_token": csrf_of(html), "digest": digest, "note": reason},
    )
    return html, answer


def items_of(conn, request_id: int) -> list[dict]:
    return conn.execute(
        "SELECT payment_id, outcome, detail FROM console_bulk_items WHERE request_id = %s "
        "ORDER BY payment_id",
        (request_id,),
    ).fetchall()


def cancelled_events(conn, payment_id) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM payment_events "
        "WHERE payment_id = %s AND type = 'payment.cancelled'",
        (payment_id,),
    ).fetchone()["n"]


def latest_request(conn):
    return conn.execute("SELECT max(id) AS n FROM console_bulk_requests").fetchone()["n"]


def request_id_of(answer) -> int:
    assert answer.status_code == 302, answer.get_data(as_text=True)
    return int(re.search(r"/console/bulk/(\d+)", answer.headers["Location"]).group(1))


def token(client, url="/console/approvals") -> str:
    return csrf_of(client.get(url).get_data(as_text=True))


# -- filters ---------------------------------------------------------------------


def test_dead_letters_filter_by_reason_payer_parked_before_and_processor(ann, conn):
    old = park(conn, payer="acme", reason="LEASE_EXPIRED_REPEATEDLY", processor="fake")
    conn.execute(
        "UPDATE dead_letters SET created_at = now() - interval '3 days' WHERE payment_id = %s",
        (old["id"],),
    )
    acme = park(conn, payer="acme", processor="fake")
    other = park(conn, payer="zed", processor="stripe")

    def shown(**query) -> set:
        html = ann.get("/console/dead-letters", query_string=query).get_data(as_text=True)
        open_list = html.split('id="doubt-title"')[0]
        return {r["id"] for r in (old, acme, other) if str(r["id"]) in open_list}

    assert shown() == {old["id"], acme["id"], other["id"]}
    assert shown(payer="acme") == {old["id"], acme["id"]}
    assert shown(reason="LEASE_EXPIRED_REPEATEDLY") == {old["id"]}
    assert shown(payer="acme", reason="RETRIES_EXHAUSTED") == {acme["id"]}
    before = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    assert shown(parked_before=before) == {old["id"]}
    assert shown(processor="stripe") == {other["id"]}
    # the filter is the page's address: the form and the pager keep it
    html = ann.get("/console/dead-letters", query_string={"payer": "acme"}).get_data(as_text=True)
    assert 'value="acme"' in html and "Re-drive all matching" in html


def test_payments_filter_by_due_range_reason_doubt_and_processor(ann, conn):
    start = datetime.now(UTC).replace(hour=2, minute=0, second=0, microsecond=0) + timedelta(days=1)
    declined = insert_payment(conn, status="FAILED", failure_reason="DECLINED", due_at=start)
    doubtful = park(conn, in_doubt=True, due_at=start + timedelta(hours=1), processor="stripe")
    later = insert_payment(conn, due_at=start + timedelta(days=1, hours=1))
    day = start.date().isoformat()

    def shown(**query) -> set:
        html = ann.get("/console/payments", query_string=query).get_data(as_text=True)
        return {r["id"] for r in (declined, doubtful, later) if str(r["id"]) in html}

    assert shown(due_from=day, due_to=day) == {declined["id"], doubtful["id"]}
    next_day = (start + timedelta(days=1)).date().isoformat()
    assert shown(due_from=day, due_to=next_day) == {declined["id"], doubtful["id"], later["id"]}
    assert shown(due_from=day, due_to=next_day, status="FAILED") == {
        declined["id"],
        doubtful["id"],
    }
    assert shown(due_from=day, failure_reason="DECLINED") == {declined["id"]}
    assert shown(due_from=day, in_doubt="yes") == {doubtful["id"]}
    assert shown(due_from=day, processor="stripe") == {doubtful["id"]}


def test_reconciliation_runs_filter_by_day_and_mismatches(ann, conn):
    clean, dirty = (
        conn.execute(
            "INSERT INTO reconciliation_runs (day, source, finished_at, mismatches) "
            "VALUES (%s, 'file', now(), %s) RETURNING id",
            (day, mismatches),
        ).fetchone()["id"]
        for day, mismatches in (("2026-10-02", 0), ("2026-10-01", 2))
    )

    def shown(**query) -> set:
        html = ann.get("/console/reconciliation", query_string=query).get_data(as_text=True)
        return {run for run in (clean, dirty) if f"Run {run}<" in html}

    assert shown() == {clean, dirty}
    assert shown(mismatches="only") == {dirty}
    assert shown(day_before="2026-10-02") == {dirty}
    assert ann.get("/console/reconciliation?day_before=10/02").status_code == 400


@pytest.mark.parametrize(
    "url",
    [
        "/console/dead-letters?reason=DECLINED",
        "/console/dead-letters?processor=paypal",
        "/console/dead-letters?parked_before=yesterday",
        "/console/dead-letters?payer=" + "x" * 201,
        "/console/payments?due_from=2026-01-05&due_to=2026-01-01",
        "/console/payments?due_from=2026-01-01&due_to=2026-03-01",
        "/console/payments?due_from=31-12-2026",
        "/console/payments?in_doubt=maybe",
        "/console/payments?failure_reason=BROKE",
        "/console/dead-letters/all/redrive?parked_before=0000-01-01",
        "/console/payments/all/cancel?payer=acme",  # a bulk cancel needs Status PENDING
        "/console/payments/all/cancel?status=FAILED",
        "/console/payments/all/cancel?status=PENDING&due_from=2026-01-01&due_to=2026-03-01",
        "/console/bulk/1?cursor=nope",
        "/console/audit?cursor=-5",
    ],
)
def test_bad_filter_input_is_a_clear_400(ann, url):
    answer = ann.get(url)
    assert answer.status_code == 400, url
    assert 'role="alert"' in answer.get_data(as_text=True)


# -- bulk actions --------------------------------------------------------------------


def test_a_bulk_dismiss_is_previewed_confirmed_and_run_in_chunks(ann, console, conn):
    rows = [park(conn, payer="acme", amount_minor=1000 + n) for n in range(3)]
    other = park(conn, payer="zed")
    preview, answer = request_bulk(ann, "dismiss", {"payer": "acme"})
    assert "3 payments" in preview and "30.03 USD" in preview  # 1000 + 1001 + 1002 minor
    assert "Confirm" in preview and "Request approval" not in preview
    assert all(letter(conn, r["id"])["resolution"] is None for r in rows)  # nothing yet
    request_id = request_id_of(answer)
    made = console_bulk.get(conn, request_id)
    assert (made["state"], made["payments"]) == ("RUNNING", 3)
    # one chunk of two, then the rest: each payment once
    pool, gateway = console.extensions["paycron.pool"], console.extensions["paycron.gateway"]
    assert console_bulk.run_once(pool, gateway, chunk=2).done == 2
    assert console_bulk.get(conn, request_id)["state"] == "RUNNING"
    assert run_all(console).finished == 1
    closed = [letter(conn, r["id"]) for r in rows]
    assert {(c["resolution"], c["resolved_by"]) for c in closed} == {("DISMISSED", "ops-ann")}
    assert all(c["note"] == "cleanup after outage" for c in closed)
    assert letter(conn, other["id"])["resolution"] is None
    page = ann.get(f"/console/bulk/{request_id}").get_data(as_text=True)
    assert "FINISHED" in page and "3 done, 0 refused" in page


def test_each_payment_is_refused_exactly_as_its_single_action_is(ann, console, conn, gateway):
    """Parity: a re-drive with a call that may still land, a refund with no
    charge, a letter already resolved: the same words, bulk or single."""
    single, bulk = park(conn, payer="a1"), park(conn, payer="b1")  # no charge to refund
    ann.post(f"/console/dead-letters/{single['id']}/refund", data={"csrf_token": token(ann)})
    page = ann.get("/console/dead-letters").get_data(as_text=True)
    single_message = re.search(rf"{single['id']}: (refused: [^<]+)", page).group(1)
    assert "holds no charge" in single_message

    request_id = request_id_of(request_bulk(ann, "refund", {"payer": "b1"})[1])
    conn.execute(
        "UPDATE console_bulk_requests SET state = 'RUNNING' WHERE id = %s", (request_id,)
    )  # as approved
    run_all(console)
    item = conn.execute(
        "SELECT outcome, detail FROM console_bulk_items WHERE request_id = %s", (request_id,)
    ).fetchone()
    assert item["outcome"] == "refused"
    assert item["detail"] == single_message
    assert letter(conn, bulk["id"])["resolution"] is None

    # resolved between the request and its run: refused, as a single action is
    gone = park(conn, payer="c1")
    request_id = request_id_of(request_bulk(ann, "dismiss", {"payer": "c1"})[1])
    conn.execute(
        "UPDATE dead_letters SET resolution = 'DISMISSED', resolved_at = now() "
        "WHERE payment_id = %s",
        (gone["id"],),
    )
    run_all(console)
    item = conn.execute(
        "SELECT outcome, detail FROM console_bulk_items WHERE request_id = %s", (request_id,)
    ).fetchone()
    assert item == {
        "outcome": "refused",
        "detail": "refused: the dead letter is already resolved (DISMISSED)",
    }


def test_a_crash_mid_way_resumes_and_refunds_nobody_twice(ann, bob, console, conn, gateway):
    rows = [park(conn, payer="acme", in_doubt=True) for _ in range(3)]
    for row in rows:
        gateway.charge(row)
    request_id = request_id_of(request_bulk(ann, "refund", {"payer": "acme"})[1])
    bob.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(bob)})

    # the process dies after the second refund was made at the processor,
    # before its outcome (and the refund's row) committed
    real = console_bulk.attempt
    calls = []

    def dying(*args, **kwargs):
        calls.append(args[3])
        result = real(*args, **kwargs)
        if len(calls) == 2:
            raise SystemExit("killed")
        return result

    pool, gateway_client = console.extensions["paycron.pool"], console.extensions["paycron.gateway"]
    console_bulk.attempt = dying
    try:
        with pytest.raises(SystemExit):
            console_bulk.run_once(pool, gateway_client)
    finally:
        console_bulk.attempt = real
    outcomes = conn.execute(
        "SELECT payment_id, outcome FROM console_bulk_items WHERE request_id = %s "
        "ORDER BY payment_id",
        (request_id,),
    ).fetchall()
    assert [o["outcome"] for o in outcomes] == ["done", None, None]
    assert letter(conn, outcomes[1]["payment_id"])["resolution"] is None  # rolled back

    assert run_all(console).finished == 1
    refunds = conn.execute(
        "SELECT payment_id, count(*) AS n FROM refunds WHERE payment_id = ANY(%s) "
        "GROUP BY payment_id",
        ([r["id"] for r in rows],),
    ).fetchall()
    assert sorted(r["n"] for r in refunds) == [1, 1, 1]
    ours = {str(r["id"]) for r in rows}
    charges = [c for c in gateway.ledger() if c["reference"] in ours]
    assert sorted(c["status"] for c in charges) == ["refunded"] * 3
    assert {letter(conn, r["id"])["resolution"] for r in rows} == {"REFUNDED"}
    made = console_bulk.get(conn, request_id)
    assert (made["state"], made["done"], made["refused"]) == ("FINISHED", 3, 0)


def test_more_than_the_cap_is_refused_at_the_preview(ann, conn):
    for _ in range(6):  # CONSOLE_BULK_MAX is 5 here
        park(conn, payer="many")
    answer = ann.get("/console/dead-letters/all/dismiss", query_string={"payer": "many"})
    assert answer.status_code == 400
    assert "More than 5 payments" in answer.get_data(as_text=True)


def test_a_confirmation_whose_filter_now_matches_others_is_refused(ann, conn):
    park(conn, payer="acme")
    preview = ann.get("/console/dead-letters/all/dismiss", query_string={"payer": "acme"})
    html = preview.get_data(as_text=True)
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    park(conn, payer="acme")  # parked after the preview
    before = conn.execute("SELECT max(id) AS n FROM console_bulk_requests").fetchone()["n"]
    answer = ann.post(
        "/console/dead-letters/all/dismiss",
        data={"payer": "acme", "csrf_token": csrf_of(html), "digest": digest, "note": "x"},
    )
    assert answer.status_code == 409
    after = conn.execute("SELECT max(id) AS n FROM console_bulk_requests").fetchone()["n"]
    assert after == before


def test_a_reason_is_required(ann, conn):
    park(conn, payer="acme")
    _, answer = request_bulk(ann, "dismiss", {"payer": "acme"}, reason="  ")
    assert answer.status_code == 400


# -- four eyes ------------------------------------------------------------------------


def test_a_bulk_refund_needs_another_operator(ann, bob, console, conn, gateway):
    row = park(conn, payer="acme", in_doubt=True)
    gateway.charge(row)
    preview, answer = request_bulk(ann, "refund", {"payer": "acme"})
    assert "Request approval" in preview and ">Confirm<" not in preview
    request_id = request_id_of(answer)
    assert console_bulk.get(conn, request_id)["state"] == "AWAITING_APPROVAL"
    assert run_all(console).done == 0  # nothing runs before an approval

    approvals = ann.get("/console/approvals").get_data(as_text=True)
    assert f"Request {request_id}" in approvals and "Approve" in approvals
    mine = ann.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(ann)})
    assert mine.status_code == 403
    assert "You cannot approve your own request" in mine.get_data(as_text=True)
    assert console_bulk.get(conn, request_id)["state"] == "AWAITING_APPROVAL"

    theirs = bob.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(bob)})
    assert theirs.status_code == 302
    made = console_bulk.get(conn, request_id)
    assert (made["state"], made["decided_by"]) == ("RUNNING", "ops-bob")
    run_all(console)
    assert letter(conn, row["id"])["resolution"] == "REFUNDED"
    # decided once: a second approval is refused
    again = bob.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(bob)})
    assert again.status_code == 409


def test_the_same_operator_under_another_key_is_still_refused(ann, console, conn, make_key):
    park(conn, payer="acme", amount_minor=200_000)  # above CONSOLE_APPROVAL_ABOVE_MINOR
    preview, answer = request_bulk(ann, "dismiss", {"payer": "acme"})
    assert "Request approval" in preview
    request_id = request_id_of(answer)
    ann_again = signed_in_as(console, make_key, "ops-ann")
    refused = ann_again.post(
        f"/console/approvals/{request_id}/approve", data={"csrf_token": token(ann_again)}
    )
    assert refused.status_code == 403


def test_an_undecided_request_expires(ann, bob, console, conn):
    park(conn, payer="acme", amount_minor=200_000)
    request_id = request_id_of(request_bulk(ann, "dismiss", {"payer": "acme"})[1])
    made = console_bulk.get(conn, request_id)
    assert made["expires_at"] - made["created_at"] == timedelta(minutes=60)
    conn.execute(
        "UPDATE console_bulk_requests SET expires_at = now() - interval '1 second' WHERE id = %s",
        (request_id,),
    )
    late = bob.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(bob)})
    assert late.status_code == 409 and "expired" in late.get_data(as_text=True)
    assert f"Request {request_id}<" not in bob.get("/console/approvals").get_data(as_text=True)
    assert console_bulk.get(conn, request_id)["state"] == "EXPIRED"
    assert run_all(console).done == 0


def test_a_rejected_request_never_runs(ann, bob, console, conn):
    row = park(conn, payer="acme", amount_minor=200_000)
    request_id = request_id_of(request_bulk(ann, "dismiss", {"payer": "acme"})[1])
    bob.post(f"/console/approvals/{request_id}/reject", data={"csrf_token": token(bob)})
    assert console_bulk.get(conn, request_id)["state"] == "REJECTED"
    run_all(console)
    assert letter(conn, row["id"])["resolution"] is None


def test_an_approval_runs_the_previewed_payments_not_the_filter_again(ann, bob, console, conn):
    first = park(conn, payer="acme", amount_minor=200_000)
    request_id = request_id_of(request_bulk(ann, "dismiss", {"payer": "acme"})[1])
    later = park(conn, payer="acme")  # matches the filter now, was not previewed
    bob.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(bob)})
    run_all(console)
    assert letter(conn, first["id"])["resolution"] == "DISMISSED"
    assert letter(conn, later["id"])["resolution"] is None


# -- audit and cancel ------------------------------------------------------------------


def test_the_audit_page_lists_actions_requests_and_approvals_newest_first(ann, bob, conn):
    row = park(conn, payer="acme", amount_minor=200_000)
    request_id = request_id_of(request_bulk(ann, "dismiss", {"payer": "acme"})[1])
    bob.post(f"/console/approvals/{request_id}/reject", data={"csrf_token": token(bob)})
    ann.post(
        f"/console/dead-letters/{row['id']}/dismiss",
        data={"csrf_token": token(ann), "note": "paid by wire"},
    )
    html = ann.get("/console/audit").get_data(as_text=True)
    events = re.findall(r"<td>(dead_letter\.\w+|console\.bulk_\w+)</td>", html)
    assert events[:3] == ["dead_letter.dismiss", "console.bulk_reject", "console.bulk_request"]
    assert "payer=acme" in html and "cleanup after outage" in html and "1 payments" in html
    csv = ann.get("/console/audit.csv")
    assert csv.mimetype == "text/csv"
    lines = csv.get_data(as_text=True).splitlines()
    assert lines[0].startswith("id,at,event,outcome,actor")
    assert ",dead_letter.dismiss,success,ops-ann," in lines[1]
    assert ",console.bulk_reject,success,ops-bob," in lines[2]


def test_cancel_a_pending_payment_and_see_a_lost_race_honestly(ann, conn):
    pending = insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=1))
    page = ann.get(f"/console/payments/{pending['id']}").get_data(as_text=True)
    assert "Cancel payment" in page
    answer = ann.post(
        f"/console/payments/{pending['id']}/cancel",
        data={"csrf_token": csrf_of(page), "reason": "customer asked"},
    )
    assert answer.status_code == 302
    assert payment(conn, pending["id"])["status"] == "CANCELLED"
    # the page showed PENDING, a worker claimed it first: the API's 409, said so
    claimed = insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=1))
    page = ann.get(f"/console/payments/{claimed['id']}").get_data(as_text=True)
    conn.execute(
        "UPDATE payments SET status = 'PROCESSING', lease_until = now() + interval '1 minute' "
        "WHERE id = %s",
        (claimed["id"],),
    )
    lost = ann.post(
        f"/console/payments/{claimed['id']}/cancel",
        data={"csrf_token": csrf_of(page), "reason": "customer asked"},
    )
    assert lost.status_code == 409
    assert "409 ALREADY_PROCESSING" in lost.get_data(as_text=True)
    assert payment(conn, claimed["id"])["status"] == "PROCESSING"
    no_reason = ann.post(
        f"/console/payments/{claimed['id']}/cancel", data={"csrf_token": csrf_of(page)}
    )
    assert no_reason.status_code == 400


def test_bulk_requests_decisions_expiry_finish_and_cancel_write_audit_lines(
    ann, bob, console, conn, audit_lines
):
    """Each bulk step and a console cancel is a line on the audit log
    (docs/audit-log.md), not only a row of the audit page."""
    park(conn, payer="acme", amount_minor=200_000)
    approved = request_id_of(request_bulk(ann, "dismiss", {"payer": "acme"})[1])
    bob.post(f"/console/approvals/{approved}/approve", data={"csrf_token": token(bob)})
    run_all(console)
    park(conn, payer="zeta", amount_minor=200_000)
    rejected = request_id_of(request_bulk(ann, "dismiss", {"payer": "zeta"})[1])
    bob.post(f"/console/approvals/{rejected}/reject", data={"csrf_token": token(bob)})
    park(conn, payer="yak", amount_minor=200_000)
    expired = request_id_of(request_bulk(ann, "dismiss", {"payer": "yak"})[1])
    conn.execute(
        "UPDATE console_bulk_requests SET expires_at = now() - interval '1 second' WHERE id = %s",
        (expired,),
    )
    assert run_all(console).expired == 1
    pending = insert_payment(conn, due_at=datetime.now(UTC) + timedelta(days=1))
    page = ann.get(f"/console/payments/{pending['id']}").get_data(as_text=True)
    ann.post(
        f"/console/payments/{pending['id']}/cancel",
        data={"csrf_token": csrf_of(page), "reason": "customer asked"},
    )

    def lines(name):
        return [line for line in audit_lines if line["event"] == name]

    assert [line["actor"] for line in lines("console.bulk_request")] == ["ops-ann"] * 3
    assert [line["actor"] for line in lines("console.bulk_approve")] == ["ops-bob"]
    assert [line["actor"] for line in lines("console.bulk_reject")] == ["ops-bob"]
    (expiry,) = lines("console.bulk_expire")
    assert expiry["target"] == f"dismiss request {expired}" and expiry["actor"] is None
    (finish,) = lines("console.bulk_finish")
    assert str(approved) in finish["target"]
    (cancel,) = lines("payment.cancel")
    assert (cancel["outcome"], cancel["actor"], cancel["target"]) == (
        "success",
        "ops-ann",
        str(pending["id"]),
    )
    assert cancel["channel"] == "console" and cancel["reason"] == "customer asked"


# -- bulk cancel of PENDING payments ------------------------------------------------

SOON = timedelta(days=1)


def test_a_bulk_cancel_is_offered_for_pending_and_previewed(ann, console, conn):
    rows = [
        insert_payment(conn, payer="acme", due_at=datetime.now(UTC) + SOON, amount_minor=1000 + n)
        for n in range(3)
    ]
    jpy = insert_payment(conn, payer="acme", due_at=datetime.now(UTC) + SOON, currency="JPY")
    done = insert_payment(conn, payer="acme", status="COMPLETED")
    other = insert_payment(conn, payer="zed", due_at=datetime.now(UTC) + SOON)
    listed = ann.get("/console/payments", query_string={"payer": "acme", "status": "PENDING"})
    assert "Cancel all matching" in listed.get_data(as_text=True)
    unfiltered = ann.get("/console/payments", query_string={"payer": "acme"})
    assert "Cancel all matching" not in unfiltered.get_data(as_text=True)

    preview, answer = request_cancel(ann, {"payer": "acme", "status": "PENDING"})
    assert "4 payments" in preview and "30.03 USD" in preview and "2,500 JPY" in preview
    assert "Confirm" in preview and "Request approval" not in preview
    request_id = request_id_of(answer)
    assert console_bulk.get(conn, request_id)["action"] == "cancel"
    assert all(payment(conn, r["id"])["status"] == "PENDING" for r in rows)  # not yet
    assert run_all(console, chunk=2).finished == 1
    assert {payment(conn, r["id"])["status"] for r in [*rows, jpy]} == {"CANCELLED"}
    assert payment(conn, done["id"])["status"] == "COMPLETED"
    assert payment(conn, other["id"])["status"] == "PENDING"
    page = ann.get(f"/console/bulk/{request_id}").get_data(as_text=True)
    assert "FINISHED" in page and "4 done, 0 refused" in page
    # the dead letters' routes do not take a cancel
    assert ann.get("/console/dead-letters/all/cancel").status_code == 404


def test_a_bulk_cancel_by_due_range_reads_only_that_stretch(ann, console, conn):
    start = datetime.now(UTC).replace(hour=3, minute=0, second=0, microsecond=0) + 2 * SOON
    inside = insert_payment(conn, payer="p1", due_at=start, processor="stripe")
    fake = insert_payment(conn, payer="p2", due_at=start + timedelta(hours=1), processor="fake")
    later = insert_payment(conn, payer="p3", due_at=start + SOON)
    day = start.date().isoformat()
    query = {"status": "PENDING", "due_from": day, "due_to": day, "processor": "stripe"}
    preview, answer = request_cancel(ann, query)
    assert "1 payments" in preview
    run_all(console)
    assert payment(conn, inside["id"])["status"] == "CANCELLED"
    assert payment(conn, fake["id"])["status"] == "PENDING"
    assert payment(conn, later["id"])["status"] == "PENDING"


def test_each_bulk_cancel_is_refused_exactly_as_the_single_cancel_is(ann, console, conn):
    """Parity: the single cancel's 409 and the bulk item's refusal are the
    same words (the same code: console_bulk.cancel)."""
    single = insert_payment(conn, payer="s1", due_at=datetime.now(UTC) + SOON, in_doubt=True)
    page = ann.get(f"/console/payments/{single['id']}").get_data(as_text=True)
    lost = ann.post(
        f"/console/payments/{single['id']}/cancel",
        data={"csrf_token": csrf_of(page), "reason": "customer asked"},
    )
    assert lost.status_code == 409
    single_why = re.search(r"Not cancelled \((409 .+?)\)\.", lost.get_data(as_text=True)).group(1)
    assert single_why.startswith("409 OUTCOME_IN_DOUBT")

    bulk = insert_payment(conn, payer="b1", due_at=datetime.now(UTC) + SOON, in_doubt=True)
    claimed = insert_payment(conn, payer="b1", due_at=datetime.now(UTC) + SOON)
    request_id = request_id_of(request_cancel(ann, {"payer": "b1", "status": "PENDING"})[1])
    # claimed by a worker between the preview and the run
    conn.execute(
        "UPDATE payments SET status = 'PROCESSING', lease_until = now() + interval '1 minute' "
        "WHERE id = %s",
        (claimed["id"],),
    )
    run_all(console)
    details = {i["payment_id"]: (i["outcome"], i["detail"]) for i in items_of(conn, request_id)}
    assert details[bulk["id"]] == ("refused", f"refused: {single_why}")
    assert details[claimed["id"]][0] == "refused"
    assert details[claimed["id"]][1].startswith("refused: 409 ALREADY_PROCESSING: a worker")
    assert payment(conn, bulk["id"])["status"] == "PENDING"
    assert payment(conn, claimed["id"])["status"] == "PROCESSING"
    made = console_bulk.get(conn, request_id)
    assert (made["state"], made["done"], made["refused"]) == ("FINISHED", 0, 2)


def test_a_bulk_cancel_racing_a_claim_has_one_winner(ann, console, database_url, conn):
    """A worker's claim in flight when the runner reaches the payment: the
    cancel waits on the row, then loses (409 ALREADY_PROCESSING); a payment
    the runner cancelled first is never claimed."""
    from paycron.config import Config
    from paycron.store import transitions
    from paycron.store.db import connect

    contested = insert_payment(conn, payer="race")  # due now: a worker may claim it
    cancelled_first = insert_payment(conn, payer="race2")
    first = request_id_of(request_cancel(ann, {"payer": "race2", "status": "PENDING"})[1])
    run_all(console)
    assert [c.payment_id for c in transitions.claim_due(conn, limit=10, lease_seconds=30)] == [
        contested["id"]
    ]
    assert payment(conn, cancelled_first["id"])["status"] == "CANCELLED"
    assert items_of(conn, first)[0]["outcome"] == "done"
    conn.execute(
        "UPDATE payments SET status = 'PENDING', lease_until = NULL WHERE id = %s",
        (contested["id"],),
    )

    request_id = request_id_of(request_cancel(ann, {"payer": "race", "status": "PENDING"})[1])
    with connect(Config(database_url=database_url)) as worker:
        with worker.transaction():  # the claim, not yet committed
            worker.execute(
                "UPDATE payments SET status = 'PROCESSING', attempt = attempt + 1, "
                "lease_until = now() + interval '1 minute' WHERE id = %s",
                (contested["id"],),
            )
            runner = threading.Thread(target=run_all, args=(console,))
            runner.start()
            runner.join(timeout=0.5)
            assert runner.is_alive()  # the cancel waits on the claimed row
        runner.join(timeout=10)
    assert not runner.is_alive()
    (item,) = items_of(conn, request_id)
    assert item["outcome"] == "refused" and "409 ALREADY_PROCESSING" in item["detail"]
    assert payment(conn, contested["id"])["status"] == "PROCESSING"
    assert cancelled_events(conn, contested["id"]) == 0


def test_a_bulk_cancel_over_the_cap_is_refused(ann, conn):
    before = latest_request(conn)
    for _ in range(6):  # CONSOLE_BULK_MAX is 5 here
        insert_payment(conn, payer="many", due_at=datetime.now(UTC) + SOON)
    answer = ann.get(
        "/console/payments/all/cancel", query_string={"payer": "many", "status": "PENDING"}
    )
    assert answer.status_code == 400
    assert "More than 5 payments" in answer.get_data(as_text=True)
    assert latest_request(conn) == before


def test_a_bulk_cancel_confirmation_whose_filter_now_matches_others_is_refused(ann, conn):
    insert_payment(conn, payer="acme", due_at=datetime.now(UTC) + SOON)
    query = {"payer": "acme", "status": "PENDING"}
    html = ann.get("/console/payments/all/cancel", query_string=query).get_data(as_text=True)
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    insert_payment(conn, payer="acme", due_at=datetime.now(UTC) + SOON)  # after the preview
    before = latest_request(conn)
    answer = ann.post(
        "/console/payments/all/cancel",
        data={**query, "csrf_token": csrf_of(html), "digest": digest, "note": "x"},
    )
    assert answer.status_code == 409
    assert latest_request(conn) == before


def test_a_crashed_bulk_cancel_resumes_and_cancels_nothing_twice(ann, console, conn):
    rows = [insert_payment(conn, payer="acme", due_at=datetime.now(UTC) + SOON) for _ in range(3)]
    request_id = request_id_of(request_cancel(ann, {"payer": "acme", "status": "PENDING"})[1])
    # the process dies after the second cancel's compare-and-swap, before its
    # outcome committed
    real, calls = console_bulk.cancel, []

    def dying(conn, payment_id):
        calls.append(payment_id)
        result = real(conn, payment_id)
        if len(calls) == 2:
            raise SystemExit("killed")
        return result

    pool, gateway = console.extensions["paycron.pool"], console.extensions["paycron.gateway"]
    console_bulk.cancel = dying
    try:
        with pytest.raises(SystemExit):
            console_bulk.run_once(pool, gateway)
    finally:
        console_bulk.cancel = real
    outcomes = items_of(conn, request_id)
    assert [o["outcome"] for o in outcomes] == ["done", None, None]
    assert payment(conn, outcomes[1]["payment_id"])["status"] == "PENDING"  # rolled back

    assert run_all(console).finished == 1
    assert [cancelled_events(conn, r["id"]) for r in rows] == [1, 1, 1]
    assert {payment(conn, r["id"])["status"] for r in rows} == {"CANCELLED"}
    made = console_bulk.get(conn, request_id)
    assert (made["state"], made["done"], made["refused"]) == ("FINISHED", 3, 0)


def test_a_bulk_cancel_above_the_threshold_needs_another_operator(ann, bob, console, conn):
    row = insert_payment(conn, payer="big", due_at=datetime.now(UTC) + SOON, amount_minor=200_000)
    preview, answer = request_cancel(ann, {"payer": "big", "status": "PENDING"})
    assert "Request approval" in preview and ">Confirm<" not in preview
    request_id = request_id_of(answer)
    assert run_all(console).done == 0
    mine = ann.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(ann)})
    assert mine.status_code == 403
    assert payment(conn, row["id"])["status"] == "PENDING"
    bob.post(f"/console/approvals/{request_id}/approve", data={"csrf_token": token(bob)})
    run_all(console)
    assert payment(conn, row["id"])["status"] == "CANCELLED"


def test_a_bulk_cancel_writes_audit_rows_and_lines(ann, console, conn, audit_lines):
    won = insert_payment(conn, payer="aud", due_at=datetime.now(UTC) + SOON)
    lost = insert_payment(conn, payer="aud", due_at=datetime.now(UTC) + SOON, in_doubt=True)
    request_id = request_id_of(request_cancel(ann, {"payer": "aud", "status": "PENDING"})[1])
    run_all(console)
    rows = conn.execute(
        "SELECT event, actor, filter, payments, done, refused FROM console_audit "
        "WHERE request_id = %s ORDER BY id",
        (request_id,),
    ).fetchall()
    assert [(r["event"], r["actor"]) for r in rows] == [
        ("console.bulk_request", "ops-ann"),
        ("console.bulk_finish", "ops-ann"),
    ]
    assert rows[1]["filter"] == "payer=aud&status=PENDING"
    assert (rows[1]["payments"], rows[1]["done"], rows[1]["refused"]) == (2, 1, 1)
    cancels = {line["target"]: line for line in audit_lines if line["event"] == "payment.cancel"}
    assert cancels[str(won["id"])]["outcome"] == "success"
    assert cancels[str(won["id"])]["channel"] == "bulk"
    assert cancels[str(won["id"])]["reason"] == f"bulk request {request_id}: merchant closed"
    assert cancels[str(lost["id"])]["outcome"] == "refused"
    assert cancels[str(lost["id"])]["reason"].startswith("409 OUTCOME_IN_DOUBT")


def test_a_bulk_cancel_reads_no_day_below_the_live_bound(conn):
    """A PENDING payment is due at or after the live bound, so the preview
    never plans the settled days below it (a payer alone would plan every day)."""
    from werkzeug.datastructures import MultiDict

    from paycron.store import partitions
    from web.console import bulk, filters

    pending = insert_payment(conn, payer="acme", due_at=datetime.now(UTC) + SOON)
    bound = partitions.day_start(datetime.now(UTC).date() - timedelta(days=2))
    sent = []

    class Recording:
        def execute(self, sql, params=None, **kwargs):
            sent.append(params)
            return conn.execute(sql, params, **kwargs)

    chosen = filters.PaymentFilter.from_args(
        MultiDict({"payer": "acme", "status": "PENDING"}), statuses=["PENDING"]
    )
    conn.execute("UPDATE live_bound SET due_from = %s", (bound,))
    try:
        selection = bulk.select_pending(Recording(), chosen, cap=5, today=datetime.now(UTC).date())
    finally:  # back to the always-safe value other tests expect
        conn.execute("UPDATE live_bound SET due_from = '0001-01-01 00:00:00+00'")
    assert [r["payment_id"] for r in selection.rows] == [pending["id"]]
    (params,) = [p for p in sent if p and "payer" in p]
    assert (params["due_from"], params["due_to"]) == (bound, "infinity")
