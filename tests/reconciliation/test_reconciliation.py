"""Daily reconciliation (docs/operations.md): the settlement report against payments and
attempts, both ways. The pure classification first, then the real command
against the real fake gateway (its ledger is the truth) and real Postgres."""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta

import pytest
import sentry_sdk
from click.testing import CliRunner

from paycron.cli import main
from paycron.domain.enums import Outcome, Status
from paycron.domain.ids import new_payment_id
from paycron.domain.processing import CallResult
from paycron.errors import GatewayError
from paycron.observability.sentry import scrub
from paycron.processors.card.client import HttpGateway
from paycron.store import transitions
from reconciliation import run as run_module
from reconciliation import store
from reconciliation.diff import (
    Completion,
    ItemKind,
    PaymentView,
    Repair,
    Verdict,
    classify,
    judge_charge,
)
from reconciliation.errors import ReconciliationError
from reconciliation.report import COLUMNS, ReportCharge, parse_report
from tests.factories import add_attempt, insert_payment, park
from tests.inprocess import Engine
from tests.rows import attempts_of, letter, payment
from tests.support import CapturingTransport

# --------------------------------------------------------------------------
# The pure heart: no database, no gateway

DAY = date(2026, 3, 14)
NOON = datetime.combine(DAY, time(12), tzinfo=UTC)


def a_payment(status=Status.COMPLETED, amount=2500, currency="USD") -> PaymentView:
    return PaymentView(new_payment_id(NOON - timedelta(hours=1)), Status(status), amount, currency)


def a_charge(
    payment: PaymentView | None = None,
    *,
    at=NOON,
    amount=None,
    currency=None,
    status="succeeded",
    key=None,
    charge_id=None,
) -> ReportCharge:
    reference = str(payment.id) if payment else str(new_payment_id(at))
    return ReportCharge(
        id=charge_id or f"ch_{uuid.uuid4().hex[:24]}",
        idempotency_key=key or reference,
        reference=reference,
        amount=amount if amount is not None else (payment.amount_minor if payment else 2500),
        currency=currency or (payment.currency if payment else "USD"),
        status=status,
        created_at=at,
    )


def a_completion(payment: PaymentView, at=NOON, outcome="SUCCEEDED") -> Completion:
    return Completion(payment.id, outcome, "ch_x", at)


def kinds(diff) -> list[ItemKind]:
    return sorted(item.kind for item in diff.items)


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (Status.COMPLETED, Verdict.MATCHED),
        (Status.FAILED, Verdict.REPAIR),
        (Status.PENDING, Verdict.REPAIR),
        (Status.PROCESSING, Verdict.DEFERRED),
        (Status.AWAITING_GATEWAY, Verdict.DEFERRED),  # settled by its event or the poller
        (Status.CANCELLED, Verdict.MISMATCH),
    ],
)
def test_a_charge_is_judged_by_its_payments_status(status, verdict):
    payment = a_payment(status)
    got, items = judge_charge(a_charge(payment), payment)
    assert got is verdict
    expected = {
        Verdict.DEFERRED: [ItemKind.DEFERRED],
        Verdict.MISMATCH: [ItemKind.CHARGE_FOR_CANCELLED],
    }.get(verdict, [])
    assert [i.kind for i in items] == expected


def test_a_charge_for_no_payment_of_ours_pages():
    verdict, [item] = judge_charge(a_charge(), None)
    assert (verdict, item.kind) == (Verdict.MISMATCH, ItemKind.UNKNOWN_REFERENCE)
    stranger = ReportCharge(
        id="ch_1",
        idempotency_key="k",
        reference="not-a-payment-id",
        amount=100,
        currency="USD",
        status="succeeded",
        created_at=NOON,
    )
    verdict, [item] = judge_charge(stranger, None)
    assert (item.kind, item.payment_id) == (ItemKind.UNKNOWN_REFERENCE, None)


@pytest.mark.parametrize(
    "status", [Status.FAILED, Status.PENDING, Status.CANCELLED, Status.COMPLETED, Status.PROCESSING]
)
def test_a_refunded_charge_is_never_a_miss_nor_a_page(status):
    payment = a_payment(status)
    assert judge_charge(a_charge(payment, status="refunded"), payment) == (Verdict.REFUNDED, [])


def test_a_charge_in_an_unknown_status_pages():
    payment = a_payment(Status.FAILED)
    verdict, [item] = judge_charge(a_charge(payment, status="disputed"), payment)
    assert (verdict, item.kind) == (Verdict.MISMATCH, ItemKind.UNEXPECTED_CHARGE_STATUS)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"amount": 2600}, ItemKind.AMOUNT_MISMATCH),
        ({"currency": "EUR"}, ItemKind.CURRENCY_MISMATCH),
    ],
)
@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
def test_money_that_differs_pages_and_is_never_repaired(change, kind, status):
    payment = a_payment(status)
    diff = classify(DAY, [a_charge(payment, **change)], {payment.id: payment}, [])
    assert kinds(diff) == [kind] and diff.repairs == []
    [item] = diff.items
    assert item.detail["charge"][next(iter(change))] == next(iter(change.values()))
    assert item.detail["paymentAmount"] == 2500 and item.detail["paymentCurrency"] == "USD"


def test_two_charges_for_one_key_page_once_and_block_the_repair():
    payment = a_payment(Status.FAILED)
    first, second = a_charge(payment), a_charge(payment, at=NOON + timedelta(seconds=5))
    diff = classify(DAY, [second, first], {payment.id: payment}, [])
    assert kinds(diff) == [ItemKind.DUPLICATE_CHARGE] and diff.repairs == []
    [item] = diff.items
    assert item.charge_id == second.id and item.payment_id == payment.id
    assert [c["chargeId"] for c in item.detail["charges"]] == [first.id, second.id]


def test_two_charges_under_two_key_generations_of_one_payment_page():
    # Matching is by payment id, not by key (docs/design.md: two succeeded payments
    # for one payment id page, whatever keys they were made under).
    payment = a_payment(Status.COMPLETED)
    first = a_charge(payment)
    second = a_charge(payment, at=NOON + timedelta(seconds=5), key=f"{payment.id}:2")
    assert kinds(classify(DAY, [first, second], {payment.id: payment}, [])) == [
        ItemKind.DUPLICATE_CHARGE
    ]


@pytest.mark.parametrize(
    "status", [Status.COMPLETED, Status.FAILED, Status.PENDING, Status.CANCELLED]
)
def test_a_failed_charge_moved_no_money_and_is_ignored(status):
    # Stripe lists every decline as a failed charge: never a miss, a repair or a page.
    payment = a_payment(status)
    assert judge_charge(a_charge(payment, status="failed"), payment) == (Verdict.IGNORED, [])


def test_a_failed_charge_does_not_vouch_for_a_completion():
    payment = a_payment(Status.COMPLETED)
    diff = classify(
        DAY, [a_charge(payment, status="failed")], {payment.id: payment}, [a_completion(payment)]
    )
    assert kinds(diff) == [ItemKind.COMPLETED_WITHOUT_CHARGE]


def test_a_processing_charge_is_deferred():
    payment = a_payment(Status.PENDING)
    verdict, [item] = judge_charge(a_charge(payment, status="processing"), payment)
    assert (verdict, item.kind) == (Verdict.DEFERRED, ItemKind.DEFERRED)


def test_a_duplicate_across_midnight_pages_in_the_runs_of_both_days():
    payment = a_payment(Status.COMPLETED)
    late = a_charge(payment, at=datetime.combine(DAY, time(23, 59, 59), tzinfo=UTC))
    early = a_charge(
        payment, at=datetime.combine(DAY + timedelta(days=1), time(0, 0, 1), tzinfo=UTC)
    )
    for day in (DAY, DAY + timedelta(days=1)):
        assert kinds(classify(day, [late, early], {payment.id: payment}, [])) == [
            ItemKind.DUPLICATE_CHARGE
        ]
    # a refunded extra charge is a duplicate already undone
    undone = a_charge(payment, at=NOON + timedelta(seconds=1), status="refunded")
    assert kinds(classify(DAY, [a_charge(payment), undone], {payment.id: payment}, [])) == []


def test_a_repeated_row_is_one_charge_not_a_duplicate():
    payment = a_payment(Status.FAILED)
    charge = a_charge(payment)
    diff = classify(DAY, [charge, charge], {payment.id: payment}, [])
    assert diff.items == [] and [r.charge for r in diff.repairs] == [charge]


def test_a_completion_needs_a_charge_in_the_three_days_around_it():
    payment = a_payment(Status.COMPLETED)
    payments = {payment.id: payment}
    done = [a_completion(payment, at=datetime.combine(DAY, time(23, 59, 59, 900000), tzinfo=UTC))]
    next_day = datetime.combine(DAY + timedelta(days=1), time(0, 0, 0, 100000), tzinfo=UTC)
    assert kinds(classify(DAY, [], payments, done)) == [ItemKind.COMPLETED_WITHOUT_CHARGE]
    assert classify(DAY, [a_charge(payment, at=next_day)], payments, done).items == []
    assert (
        classify(DAY, [a_charge(payment, at=next_day, status="refunded")], payments, done).items
        == []
    )
    [item] = classify(DAY, [], payments, done).items
    assert (item.payment_id, item.charge_id) == (payment.id, None)
    assert item.detail["outcome"] == "SUCCEEDED" and item.detail["paymentStatus"] == "COMPLETED"


def test_only_the_days_charges_are_judged_the_neighbours_only_match():
    yesterday = a_payment(Status.FAILED)
    charge = a_charge(yesterday, at=NOON - timedelta(days=1))
    diff = classify(DAY, [charge], {yesterday.id: yesterday}, [])
    assert diff.repairs == [] and diff.items == [] and diff.tally["repair"] == 0


def report_text(*charges: ReportCharge) -> str:
    lines = [",".join(COLUMNS)]
    lines += [
        f"{c.id},{c.idempotency_key},{c.reference},{c.amount},{c.currency},"
        f"{c.status},{c.created_at.isoformat()}"
        for c in charges
    ]
    return "\n".join(lines) + "\n"


def test_a_report_parses_into_exact_charges():
    payment = a_payment()
    charge = a_charge(payment)
    assert parse_report(report_text(charge)) == [charge]
    assert parse_report(",".join(COLUMNS) + "\n") == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("amount", "25.0"),
        ("amount", "-5"),
        ("amount", "0"),
        ("amount", "2.5e3"),
        ("created_at", "2026-03-14T12:00:00"),
        ("created_at", "yesterday"),
        ("charge_id", ""),
    ],
)
def test_a_malformed_report_is_refused_whole(field, value):
    good = report_text(a_charge(a_payment())).splitlines()
    row = dict(zip(COLUMNS, good[1].split(","), strict=True))
    row[field] = value
    with pytest.raises(ReconciliationError, match="line 2"):
        parse_report(good[0] + "\n" + ",".join(row.values()) + "\n")


def test_a_file_without_the_columns_is_not_a_report():
    with pytest.raises(ReconciliationError, match="missing columns: .*created_at"):
        parse_report("charge_id,amount\nch_1,100\n")


# --------------------------------------------------------------------------
# The command, against real Postgres and the real fake gateway


@pytest.fixture
def reconcile(config, gateway):
    env = {
        "DATABASE_URL": config.database_url,
        "REDIS_URL": config.redis_url,
        "GATEWAY_URL": gateway.url,
        "SENTRY_DSN": None,
    }

    def run(day, *extra, code=0):
        result = CliRunner().invoke(
            main, ["reconcile", "--date", str(day), *extra], env=env, catch_exceptions=False
        )
        assert result.exit_code == code, result.output
        return result

    return run


def counts(result) -> dict[str, int]:
    """The summary's per-class counts."""
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+) +(\d+)$", result.stdout, re.MULTILINE)
    }


def day_of(charge: dict) -> date:
    """The settlement day a charge is reported on: its UTC created date."""
    return datetime.fromisoformat(charge["created_at"]).astimezone(UTC).date()


def completed(conn, *, finished_at, outcome="SUCCEEDED", gateway_ref="ch_ours", **columns):
    """A COMPLETED payment whose success was recorded at ``finished_at``."""
    row = insert_payment(conn, status="COMPLETED", attempt=1, **columns)
    add_attempt(
        conn, row, attempt=1, outcome=outcome, finished_at=finished_at, gateway_ref=gateway_ref
    )
    return row


def events_of(conn, payment_id):
    return conn.execute(
        "SELECT * FROM payment_events WHERE payment_id = %s ORDER BY id", (payment_id,)
    ).fetchall()


def items(conn):
    return conn.execute("SELECT * FROM reconciliation_items ORDER BY id").fetchall()


def runs(conn):
    return conn.execute("SELECT * FROM reconciliation_runs ORDER BY id").fetchall()


def test_a_parked_payment_the_gateway_charged_is_repaired(reconcile, conn, gateway):
    row = park(conn, in_doubt=True)
    charge = gateway.charge(row)
    result = reconcile(day_of(charge))
    assert counts(result)["repaired"] == 1 and counts(result)["mismatches"] == 0
    after = payment(conn, row["id"])
    assert (after["status"], after["attempt"], after["failure_reason"], after["in_doubt"]) == (
        "COMPLETED",
        7,
        None,
        False,
    )
    last = attempts_of(conn, row["id"])[-1]
    assert (last["attempt"], last["outcome"], last["gateway_ref"], last["worker"]) == (
        7,
        "RECONCILED",
        charge["id"],
        "reconciliation",
    )
    [event] = events_of(conn, row["id"])
    assert (event["type"], event["status"], event["attempt"]) == (
        "payment.completed",
        "COMPLETED",
        7,
    )
    assert event["data"] == {
        "outcome": "RECONCILED",
        "gatewayRef": charge["id"],
        "by": "reconciliation",
    }
    dead = letter(conn, row["id"])
    assert (dead["resolution"], dead["resolved_by"]) == ("COMPLETED", "reconciliation")
    [item] = items(conn)
    assert (item["kind"], item["payment_id"], item["charge_id"]) == (
        "REPAIRED",
        row["id"],
        charge["id"],
    )
    assert item["detail"]["paymentStatus"] == "FAILED"
    [stored] = runs(conn)
    assert (
        stored["day"],
        stored["source"],
        stored["charges_seen"],
        stored["repaired"],
        stored["deferred"],
        stored["mismatches"],
    ) == (day_of(charge), "gateway", 1, 1, 0, 0)
    assert stored["finished_at"] >= stored["started_at"]
    assert gateway.charges_per_key() == {str(row["id"]): 1}


def test_a_pending_payment_in_doubt_the_gateway_charged_is_repaired(reconcile, conn, gateway):
    row = insert_payment(conn, status="PENDING", attempt=2, failures=2, in_doubt=True)
    charge = gateway.charge(row)
    reconcile(day_of(charge))
    after = payment(conn, row["id"])
    assert (after["status"], after["attempt"], after["in_doubt"]) == ("COMPLETED", 3, False)
    assert attempts_of(conn, row["id"])[-1]["outcome"] == "RECONCILED"
    assert [i["kind"] for i in items(conn)] == ["REPAIRED"]


def test_a_processing_payment_is_deferred_untouched(reconcile, conn, gateway):
    row = insert_payment(conn, status="PROCESSING", attempt=1)
    charge = gateway.charge(row)
    result = reconcile(day_of(charge))
    assert counts(result)["deferred"] == 1 and counts(result)["repaired"] == 0
    after = payment(conn, row["id"])
    assert (after["status"], after["attempt"], after["lease_until"]) == (
        "PROCESSING",
        1,
        row["lease_until"],
    )
    assert attempts_of(conn, row["id"]) == [] and events_of(conn, row["id"]) == []
    [item] = items(conn)
    assert (item["kind"], item["charge_id"]) == ("DEFERRED", charge["id"])
    assert runs(conn)[0]["deferred"] == 1


@pytest.fixture
def sentry_events():
    transport = CapturingTransport()
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=transport, before_send=scrub)
    yield transport
    sentry_sdk.get_client().close()
    sentry_sdk.init(dsn=None)


def test_a_charge_for_a_cancelled_payment_pages(reconcile, conn, gateway, sentry_events, caplog):
    row = insert_payment(conn, status="CANCELLED")
    charge = gateway.charge(row)
    with caplog.at_level(logging.ERROR, logger="reconciliation.page"):
        result = reconcile(day_of(charge), code=1)
    assert counts(result)["charge_for_cancelled"] == 1 and counts(result)["mismatches"] == 1
    assert f"MISMATCH CHARGE_FOR_CANCELLED payment={row['id']}" in result.stdout
    assert payment(conn, row["id"])["status"] == "CANCELLED"
    [item] = items(conn)
    assert (item["kind"], item["payment_id"], item["charge_id"]) == (
        "CHARGE_FOR_CANCELLED",
        row["id"],
        charge["id"],
    )
    assert runs(conn)[0]["mismatches"] == 1
    [line] = [r for r in caplog.records if r.name == "reconciliation.page"]
    assert line.levelno == logging.ERROR
    assert f"kind=CHARGE_FOR_CANCELLED day={day_of(charge)}" in line.getMessage()
    assert f"payment={row['id']} charge={charge['id']}" in line.getMessage()
    sentry_sdk.flush()
    [event] = sentry_events.events()  # one event: the ERROR line itself is not sent again
    assert event["level"] == "error"
    assert event["tags"]["reconciliation.kind"] == "CHARGE_FOR_CANCELLED"
    assert event["fingerprint"] == ["reconciliation", "CHARGE_FOR_CANCELLED"]
    assert event["contexts"]["reconciliation"]["charge_id"] == charge["id"]


def test_a_charge_whose_reference_is_no_payment_of_ours_pages(reconcile, conn, gateway):
    stranger = {"id": new_payment_id(datetime.now(UTC)), "amount_minor": 700}
    charge = gateway.charge(stranger)
    result = reconcile(day_of(charge), code=1)
    assert counts(result)["unknown_reference"] == 1
    [item] = items(conn)
    assert (item["kind"], item["payment_id"], item["charge_id"]) == (
        "UNKNOWN_REFERENCE",
        stranger["id"],
        charge["id"],
    )


def test_a_completed_payment_without_a_charge_pages(reconcile, conn, gateway):
    now = datetime.now(UTC)
    row = completed(conn, finished_at=now)
    result = reconcile(now.date(), code=1)
    assert counts(result)["completed_without_charge"] == 1
    assert counts(result)["completions"] == 1
    [item] = items(conn)
    assert (item["kind"], item["payment_id"], item["charge_id"]) == (
        "COMPLETED_WITHOUT_CHARGE",
        row["id"],
        None,
    )
    assert item["detail"]["gatewayRef"] == "ch_ours"


def test_a_completed_payment_with_its_charge_is_clean(reconcile, conn, gateway):
    row = insert_payment(conn, status="COMPLETED", attempt=1)
    charge = gateway.charge(row)
    add_attempt(
        conn,
        row,
        attempt=1,
        outcome="SUCCEEDED",
        finished_at=datetime.fromisoformat(charge["created_at"]),
        gateway_ref=charge["id"],
    )
    result = reconcile(day_of(charge))
    assert counts(result)["matched"] == 1 and counts(result)["completions"] == 1
    assert counts(result)["mismatches"] == 0 and items(conn) == []


@pytest.mark.parametrize(
    ("charged", "kind"),
    [
        ({"amount": 2600}, "AMOUNT_MISMATCH"),
        ({"currency": "EUR"}, "CURRENCY_MISMATCH"),
    ],
)
def test_a_charge_for_other_money_pages(reconcile, conn, gateway, charged, kind):
    row = insert_payment(conn, status="COMPLETED", attempt=1, amount_minor=2500)
    charge = gateway.charge(row, **charged)
    parked = park(conn, in_doubt=True)  # also a miss: wrong money is no proof, it is not repaired
    other = gateway.charge(parked, **charged)
    result = reconcile(day_of(charge), code=1)
    assert counts(result)[kind.lower()] == 2 and counts(result)["repaired"] == 0
    assert payment(conn, parked["id"])["status"] == "FAILED"
    assert letter(conn, parked["id"])["resolution"] is None
    found = {(i["kind"], i["payment_id"], i["charge_id"]) for i in items(conn)}
    assert found == {(kind, row["id"], charge["id"]), (kind, parked["id"], other["id"])}
    detail = items(conn)[0]["detail"]
    assert (detail["paymentAmount"], detail["paymentCurrency"]) == (2500, "USD")


def test_two_charges_for_one_key_page(reconcile, conn, gateway, tmp_path):
    """The fake gateway never double-charges: the report is written by hand."""
    now = datetime.now(UTC)
    row = completed(conn, finished_at=now)
    key = str(row["id"])
    lines = [",".join(COLUMNS)] + [
        f"{charge_id},{key},{key},2500,USD,succeeded,{(now + timedelta(seconds=n)).isoformat()}"
        for n, charge_id in enumerate(("ch_first", "ch_second"))
    ]
    report = tmp_path / "report.csv"
    report.write_text("\n".join(lines) + "\n")
    result = reconcile(now.date(), "--report", str(report), code=1)
    assert counts(result)["duplicate_charge"] == 1 and counts(result)["mismatches"] == 1
    [item] = items(conn)
    assert (item["kind"], item["payment_id"], item["charge_id"]) == (
        "DUPLICATE_CHARGE",
        row["id"],
        "ch_second",
    )
    assert [c["chargeId"] for c in item["detail"]["charges"]] == ["ch_first", "ch_second"]
    assert runs(conn)[0]["source"] == "file"


def test_a_refunded_charge_is_not_a_miss(reconcile, conn, gateway):
    row = park(conn, in_doubt=True)
    charge = gateway.charge(row)
    refund = gateway.http.post(
        "/v1/refunds",
        json={"charge": charge["id"]},
        headers={"Idempotency-Key": f"refund:{row['id']}"},
    )
    assert refund.status_code == 201
    result = reconcile(day_of(charge))
    assert counts(result)["refunded"] == 1 and counts(result)["repaired"] == 0
    assert payment(conn, row["id"])["status"] == "FAILED"
    assert letter(conn, row["id"])["resolution"] is None
    assert items(conn) == [] and attempts_of(conn, row["id"]) == []


def test_a_completion_before_midnight_matches_a_charge_reported_the_next_day(
    reconcile, conn, gateway, tmp_path
):
    now = datetime.now(UTC)
    yesterday = now.date() - timedelta(days=1)
    row = insert_payment(
        conn,
        status="COMPLETED",
        attempt=1,
        due_at=datetime.combine(yesterday, time(23, 59), tzinfo=UTC),
    )
    charge = gateway.charge(row)
    charge_day = day_of(charge)
    before_midnight = datetime.combine(
        charge_day - timedelta(days=1), time(23, 59, 59, 900000), tzinfo=UTC
    )
    add_attempt(
        conn,
        row,
        attempt=1,
        outcome="SUCCEEDED",
        finished_at=before_midnight,
        gateway_ref=charge["id"],
    )
    result = reconcile(charge_day - timedelta(days=1))
    assert counts(result)["completions"] == 1 and counts(result)["charges"] == 0
    assert counts(result)["matched_by_lookup"] == 0  # the next day's report matched it
    assert items(conn) == []
    assert counts(reconcile(charge_day))["matched"] == 1
    # the control: the day's report alone holds no charge for it
    empty = tmp_path / "day.csv"
    empty.write_text(",".join(COLUMNS) + "\n")
    result = reconcile(charge_day - timedelta(days=1), "--report", str(empty), code=1)
    assert counts(result)["completed_without_charge"] == 1


def test_a_charge_outside_the_three_days_is_asked_for_before_paging(
    reconcile, conn, gateway, tmp_path
):
    """A re-drive found the charge two days after it was made: the day of the
    completion has no charge in its reports, but the gateway holds one."""
    row = insert_payment(conn, status="COMPLETED", attempt=7)
    charge = gateway.charge(row)
    found_on = day_of(charge) + timedelta(days=2)
    add_attempt(
        conn,
        row,
        attempt=7,
        outcome="FOUND_BY_LOOKUP",
        gateway_ref=charge["id"],
        finished_at=datetime.combine(found_on, time(9), tzinfo=UTC),
    )
    result = reconcile(found_on)
    assert counts(result)["matched_by_lookup"] == 1 and counts(result)["mismatches"] == 0
    empty = tmp_path / "day.csv"
    empty.write_text(",".join(COLUMNS) + "\n")
    reconcile(found_on, "--report", str(empty), code=1)  # a file is all there is


def test_a_second_run_repairs_nothing_twice(reconcile, conn, gateway):
    parked = park(conn, in_doubt=True)
    pending = insert_payment(conn, status="PENDING", in_doubt=True, attempt=1, failures=1)
    cancelled = insert_payment(conn, status="CANCELLED")
    charges = [gateway.charge(r) for r in (parked, pending, cancelled)]
    day = day_of(charges[0])
    first = counts(reconcile(day, code=1))
    attempts_before = {r["id"]: attempts_of(conn, r["id"]) for r in (parked, pending)}
    events_before = {r["id"]: events_of(conn, r["id"]) for r in (parked, pending)}
    second = counts(reconcile(day, code=1))
    assert (first["repaired"], second["repaired"]) == (2, 0)
    assert (first["charge_for_cancelled"], second["charge_for_cancelled"]) == (1, 1)
    assert second["matched"] == 2
    for r in (parked, pending):
        assert attempts_of(conn, r["id"]) == attempts_before[r["id"]]
        assert events_of(conn, r["id"]) == events_before[r["id"]]
        # the repair itself is a CAS that no longer finds FAILED or PENDING
        assert not transitions.complete_from_gateway(
            conn,
            r["id"],
            outcome=Outcome.RECONCILED,
            gateway_ref="ch_again",
            actor="reconciliation",
        )
    first_run, second_run = runs(conn)
    assert (first_run["repaired"], second_run["repaired"]) == (2, 0)
    assert [i["kind"] for i in items(conn) if i["run_id"] == second_run["id"]] == [
        "CHARGE_FOR_CANCELLED"
    ]
    assert gateway.charges_per_key() == {str(r["id"]): 1 for r in (parked, pending, cancelled)}


def test_a_repair_that_loses_its_race_is_judged_again(conn):
    """Between the read and the CAS a worker claimed the payment: deferred."""
    row = insert_payment(conn, status="PROCESSING", attempt=4)
    stale = PaymentView(row["id"], Status.FAILED, row["amount_minor"], "USD")
    charge = a_charge(stale, at=datetime.now(UTC))
    run_id = store.start_run(conn, charge.day, source="file")["id"]
    [item] = run_module._repair(conn, run_id, Repair(row["id"], charge), stale, Counter())
    assert item.kind is ItemKind.DEFERRED
    assert payment(conn, row["id"])["status"] == "PROCESSING"
    assert items(conn) == []  # stored with the run's other items, at its end


class ResponsesLost(HttpGateway):
    """Every answer to us is lost on its way back, and lookups fail too.

    The fake gateway drops its first answer (``charge_then_drop_rate``) but
    replays the stored one to every retry with the key, so the retries'
    answers are lost here, as a broken network between us would lose them.
    """

    def charge(self, request, **kwargs) -> CallResult:
        result = super().charge(request, **kwargs)
        if result.outcome is Outcome.SUCCEEDED:
            return CallResult(Outcome.AMBIGUOUS, error_code="ProtocolError", in_doubt=True)
        return result

    def find_charges(self, request):
        raise GatewayError("gateway unreachable: lookups are down")


def test_a_charge_whose_every_answer_was_lost_is_completed_by_reconciliation(
    reconcile, conn, gateway, config
):
    gateway.faults(charge_then_drop_rate=1.0)
    row = insert_payment(conn)
    engine = Engine(config)
    engine.executor.gateway = ResponsesLost(
        config.gateway_url, timeout=config.gateway_timeout_seconds
    )
    try:
        engine.drain()
    finally:
        engine.executor.gateway.close()
        engine.close()
    parked = payment(conn, row["id"])
    assert (parked["status"], parked["failure_reason"], parked["in_doubt"]) == (
        "FAILED",
        "RETRIES_EXHAUSTED",
        True,
    )
    assert parked["attempt"] == config.max_gateway_calls
    assert letter(conn, row["id"])["resolution"] is None
    [charge] = gateway.ledger()
    assert gateway.stats()["dropped"] == 1
    gateway.faults(reset=True)

    result = reconcile(day_of(charge))
    assert counts(result)["repaired"] == 1
    done = payment(conn, row["id"])
    assert (done["status"], done["attempt"]) == ("COMPLETED", config.max_gateway_calls + 1)
    last = attempts_of(conn, row["id"])[-1]
    assert (last["outcome"], last["gateway_ref"]) == ("RECONCILED", charge["id"])
    dead = letter(conn, row["id"])
    assert (dead["resolution"], dead["resolved_by"]) == ("COMPLETED", "reconciliation")
    assert gateway.charges_per_key() == {str(row["id"]): 1}


# --------------------------------------------------------------------------
# Bad input, storage, partitions


def test_a_bad_date_changes_nothing(reconcile, conn):
    for bad in ("2026-13-01", "20260314", "yesterday"):
        result = reconcile(bad, code=2)
        assert "YYYY-MM-DD" in result.output
    assert runs(conn) == []


def test_a_malformed_report_file_changes_nothing(reconcile, conn, tmp_path):
    report = tmp_path / "report.csv"
    report.write_text(
        ",".join(COLUMNS) + "\nch_1,k,r,25.0,USD,succeeded,2026-03-14T12:00:00+00:00\n"
    )
    result = reconcile("2026-03-14", "--report", str(report), code=2)
    assert "line 2" in result.output and "minor units" in result.output
    assert runs(conn) == []


def test_an_unreachable_gateway_changes_nothing(config, conn):
    env = {
        "DATABASE_URL": config.database_url,
        "GATEWAY_URL": "http://127.0.0.1:9",
        "SENTRY_DSN": None,
    }
    result = CliRunner().invoke(main, ["reconcile", "--date", "2026-03-14"], env=env)
    assert result.exit_code == 2 and "settlement report for 2026-03-13" in result.output
    assert runs(conn) == []


def test_the_item_kinds_mirror_the_enum(conn):
    checks = conn.execute(
        "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint "
        "WHERE conrelid = 'reconciliation_items'::regclass AND contype = 'c'"
    )
    [check] = [r["def"] for r in checks if "kind" in r["def"]]
    assert set(re.findall(r"'(\w+)'::text", check)) == {k.value for k in ItemKind}
    assert {k for k in ItemKind if not k.pages} == {ItemKind.REPAIRED, ItemKind.DEFERRED}


def test_every_reconciliation_table_and_column_is_commented(conn):
    missing = conn.execute(
        "SELECT c.relname, a.attname FROM pg_class c "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE c.relname IN ('reconciliation_runs', 'reconciliation_items') "
        "AND (col_description(c.oid, a.attnum) IS NULL OR obj_description(c.oid) IS NULL)"
    ).fetchall()
    assert missing == []


def test_the_reads_touch_only_the_partitions_they_name(conn):
    now = datetime.now(UTC)
    rows = [insert_payment(conn, due_at=now + timedelta(days=d, hours=1)) for d in (0, 3, 40)]
    with conn.transaction(force_rollback=True):
        found = store.load_payments(conn, [r["id"] for r in rows] + [new_payment_id(now)])
        store.completions_on(conn, now.date())
        taken = conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE pid = pg_backend_pid()"
        ).fetchone()["n"]
    assert set(found) == {r["id"] for r in rows}
    assert taken <= 120, f"reconciliation's reads took {taken} locks"
