"""The human side of the DLQ, through the real CLI: redrive, refund, dismiss."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from paycron.cli import main
from tests.factories import add_attempt, insert_payment, park
from tests.inprocess import Engine
from tests.rows import letter, payment


@pytest.fixture
def cli(config, gateway):
    env = {
        "DATABASE_URL": config.database_url,
        "REDIS_URL": config.redis_url,
        "GATEWAY_URL": gateway.url,
    }

    def run(*args, ok=True):
        result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return run


def test_list_prints_one_line_per_open_letter_starting_with_the_id(cli, conn):
    rows = [park(conn), park(conn, reason="LEASE_EXPIRED_REPEATEDLY")]
    lines = cli("dlq", "list").output.strip().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == sorted(str(r["id"]) for r in rows)
    listed = json.loads(cli("dlq", "list", "--json").output)
    assert {d["paymentId"] for d in listed} == {str(r["id"]) for r in rows}


def test_show_has_the_attempt_history(cli, conn):
    row = park(conn)
    first = datetime.now(UTC) - timedelta(minutes=10)
    for n in range(1, 7):
        add_attempt(
            conn,
            row,
            attempt=n,
            outcome="RETRYABLE_ERROR",
            error_code="http_503",
            finished_at=first + timedelta(minutes=n),
        )
    shown = json.loads(cli("dlq", "show", str(row["id"])).output)
    assert shown["payment"]["status"] == "FAILED"
    assert [(a["attempt"], a["outcome"], a["errorCode"]) for a in shown["payment"]["attempts"]] == [
        (n, "RETRYABLE_ERROR", "http_503") for n in range(1, 7)
    ]
    assert [(d["reason"], d["lastError"]) for d in shown["deadLetters"]] == [
        ("RETRIES_EXHAUSTED", "http_503")
    ]


def test_show_and_list_print_what_the_api_answers(cli, conn, client, make_key):
    """The CLI and /v1/admin/dead-letters speak one shape (camelCase)."""
    row = park(conn)
    add_attempt(
        conn,
        row,
        attempt=1,
        outcome="RETRYABLE_ERROR",
        error_code="http_503",
        finished_at=datetime.now(UTC),
    )
    admin = {"Authorization": f"Bearer {make_key('ops-ann', admin=True)}"}
    api = client.get(f"/v1/admin/dead-letters/{row['id']}", headers=admin).get_json()
    assert json.loads(cli("dlq", "show", str(row["id"])).output) == api
    assert "amount" in api["payment"] and "deadLetters" in api
    listed = client.get("/v1/admin/dead-letters", headers=admin).get_json()["data"]
    assert json.loads(cli("dlq", "list", "--json").output) == listed


def test_redrive_of_a_charged_payment_collapses_into_the_original_charge(cli, conn, gateway):
    row = park(conn, in_doubt=True)
    charge = gateway.charge(row)
    out = cli("dlq", "redrive", str(row["id"]), "--by", "ops-ann").output
    assert "completed" in out
    done = payment(conn, row["id"])
    assert done["status"] == "COMPLETED" and done["attempt"] == 7
    last = conn.execute(
        "SELECT * FROM attempts WHERE payment_id = %s AND attempt = 7", (row["id"],)
    ).fetchone()
    assert (last["outcome"], last["gateway_ref"]) == ("FOUND_BY_LOOKUP", charge["id"])
    dead = letter(conn, row["id"])
    assert (dead["resolution"], dead["resolved_by"]) == ("COMPLETED", "ops-ann")
    assert gateway.charges_per_key() == {str(row["id"]): 1}


def test_redrive_without_a_charge_gets_a_fresh_budget_and_the_next_key(cli, conn, gateway, config):
    # In doubt, but every call is past its in-flight bound: the lookup's
    # "none" is conclusive, and the processor may replay a stored answer for
    # the old key, so the re-drive charges under the next generation.
    row = park(conn, in_doubt=True, calls_land_by=datetime.now(UTC) - timedelta(seconds=1))
    cli("dlq", "redrive", str(row["id"]), "--by", "ops-ann")
    again = payment(conn, row["id"])
    assert (
        again["status"],
        again["failures"],
        again["failure_reason"],
        again["in_doubt"],
        again["key_generation"],
    ) == ("PENDING", 0, None, False, 2)
    assert letter(conn, row["id"])["resolution"] == "REDRIVEN"
    engine = Engine(config)
    try:
        engine.drain()
    finally:
        engine.close()
    assert payment(conn, row["id"])["status"] == "COMPLETED"
    assert gateway.charges_per_key() == {f"{row['id']}:2": 1}


def test_redrive_refused_while_a_call_may_still_land(cli, conn, gateway):
    # docs/design.md: "none" is conclusive only past the in-flight bound; before it a
    # zombie's call could still charge, so nothing changes and the operator
    # is told when to come back.
    bound = datetime.now(UTC) + timedelta(minutes=10)
    row = park(conn, in_doubt=True, calls_land_by=bound)
    result = cli("dlq", "redrive", str(row["id"]), "--by", "ops-ann", ok=False)
    assert result.exit_code != 0 and bound.isoformat()[:16] in result.output
    again = payment(conn, row["id"])
    assert (again["status"], again["in_doubt"], again["key_generation"]) == ("FAILED", True, 1)
    assert letter(conn, row["id"])["resolution"] is None


def test_redrive_refused_when_the_processor_holds_another_amount(cli, conn, gateway):
    row = park(conn, in_doubt=True, calls_land_by=datetime.now(UTC) - timedelta(seconds=1))
    gateway.charge(row, amount=row["amount_minor"] + 1)
    result = cli("dlq", "redrive", str(row["id"]), "--by", "ops-ann", ok=False)
    assert result.exit_code != 0 and "another amount" in result.output
    again = payment(conn, row["id"])
    assert (again["status"], again["key_generation"]) == ("FAILED", 1)
    assert gateway.ledger()[0]["idempotency_key"] == str(row["id"])


def test_a_decline_cannot_be_redriven(cli, conn):
    row = insert_payment(conn, status="FAILED", failure_reason="DECLINED")
    result = cli("dlq", "redrive", str(row["id"]), ok=False)
    assert result.exit_code != 0
    assert payment(conn, row["id"])["status"] == "FAILED"


def test_refund_goes_through_the_gateway_once_and_is_audited(cli, conn, gateway):
    row = park(conn)
    charge = gateway.charge(row)
    cli("dlq", "refund", str(row["id"]), "--by", "ops-bo")
    [ledger] = gateway.ledger()
    assert ledger["id"] == charge["id"] and ledger["status"] == "refunded"
    audit = conn.execute("SELECT * FROM refunds").fetchone()
    assert audit["gateway_key"] == f"refund:{row['id']}" and audit["requested_by"] == "ops-bo"
    after = payment(conn, row["id"])
    assert after["refunded_at"] is not None and after["status"] == "FAILED"
    assert letter(conn, row["id"])["resolution"] == "REFUNDED"
    types = [
        r["type"]
        for r in conn.execute("SELECT type FROM payment_events WHERE payment_id = %s", (row["id"],))
    ]
    assert types == ["payment.refunded"]
    # a second refund is refused: the letter is resolved
    assert cli("dlq", "refund", str(row["id"]), ok=False).exit_code != 0


def test_refund_without_a_charge_is_refused(cli, conn):
    row = park(conn)
    result = cli("dlq", "refund", str(row["id"]), ok=False)
    assert result.exit_code != 0 and "dismiss" in result.output
    assert letter(conn, row["id"])["resolution"] is None


def test_dismiss_records_who_and_why(cli, conn):
    row = park(conn)
    cli("dlq", "dismiss", str(row["id"]), "--by", "ops-cy", "--note", "customer left")
    dead = letter(conn, row["id"])
    assert (dead["resolution"], dead["resolved_by"], dead["note"]) == (
        "DISMISSED",
        "ops-cy",
        "customer left",
    )
    assert dead["resolved_at"] is not None
    assert cli("dlq", "list").output.strip() == ""
