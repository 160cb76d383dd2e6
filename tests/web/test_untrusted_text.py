"""Text from outside printed or stored as it came (docs/design.md): a gateway's
decline code is bounded and printable before it is stored, and
``paycron dlq list`` escapes control characters, so no stored text can forge
an output line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from paycron.cli import main
from paycron.domain.enums import Outcome
from paycron.domain.processing import ChargeRequest
from paycron.processors.card.client import HttpGateway
from tests.factories import insert_payment


@pytest.fixture
def declining(scripted):
    """decline(code) -> the code as stored, after the gateway answered a
    charge 402 ``{"error": {"code": <code>}}``, the decline's wire format."""
    client = HttpGateway(scripted.url, timeout=2)

    def decline(code: object) -> str:
        scripted.answers[100] = (
            402,
            {"Content-Type": "application/json"},
            json.dumps({"error": {"code": code}}).encode(),
        )
        result = client.charge(
            ChargeRequest(reference="r", idempotency_key="k", amount=100, currency="USD")
        )
        assert result.outcome is Outcome.DECLINED
        return result.error_code

    yield decline
    client.close()


@pytest.mark.parametrize(
    "sent, stored",
    [
        ("card_declined", "card_declined"),
        ("insufficient_funds", "insufficient_funds"),
        ("do_not_honor:05", "do_not_honor:05"),
        ("card_declined\n2026-01-01 FORGED line", "card_declined_2026-01-01_FORGED_line"),
        ("\x1b[2Jcleared", "_[2Jcleared"),  # a terminal escape
        ("ok\u202edesrever", "ok_desrever"),  # a bidi override
        ("déclinée", "d_clin_e"),
        ("", "declined"),
        ("\n\t", "declined"),
        (42, "declined"),
        (None, "declined"),
        ({"nested": "x"}, "declined"),
    ],
)
def test_a_decline_code_is_stored_printable(declining, sent, stored):
    assert declining(sent) == stored


def test_a_decline_code_is_bounded(declining):
    assert declining("x" * 100_000) == "x" * 64


def test_dlq_list_escapes_what_it_prints(config, conn):
    """A newline stored in last_error (as a gateway's code once was) stays
    inside its line: one line per letter, the id first."""
    forged = "http_503\n00000000-0000-0000-0000-000000000000\tRETRIES_EXHAUSTED\t-"
    row = insert_payment(conn, status="FAILED", failure_reason="RETRIES_EXHAUSTED", attempt=6)
    conn.execute(
        "INSERT INTO dead_letters (payment_id, due_at, payer, reason, last_error) "
        "VALUES (%s, %s, %s, 'RETRIES_EXHAUSTED', %s)",
        (row["id"], row["due_at"], row["payer"], forged + "\x1b[0m\\"),
    )
    result = CliRunner().invoke(
        main, ["dlq", "list"], env={"DATABASE_URL": config.database_url}, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    [line] = result.output.splitlines()
    fields = line.split("\t")
    assert fields[0] == str(row["id"]) and fields[1] == "RETRIES_EXHAUSTED"
    assert fields[2] == (
        r"http_503\n00000000-0000-0000-0000-000000000000\tRETRIES_EXHAUSTED"
        r"\t-\x1b[0m\\"
    )
    assert len(fields) == 4 and fields[3].startswith("parked ")


def test_dlq_dismiss_prints_the_note_on_one_line(config, conn):
    row = insert_payment(conn, status="FAILED", failure_reason="RETRIES_EXHAUSTED", attempt=6)
    conn.execute(
        "INSERT INTO dead_letters (payment_id, due_at, payer, reason) "
        "VALUES (%s, %s, %s, 'RETRIES_EXHAUSTED')",
        (row["id"], row["due_at"], row["payer"]),
    )
    result = CliRunner().invoke(
        main,
        ["dlq", "dismiss", str(row["id"]), "--by", "ops", "--note", "left\nOK: all fine"],
        env={"DATABASE_URL": config.database_url},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"{row['id']} dismissed: left\\nOK: all fine"]


def test_api_key_list_prints_an_actor_on_one_line(config):
    env = {"DATABASE_URL": config.database_url}
    created = CliRunner().invoke(main, ["api-key", "create", "--actor", "ann\nbob"], env=env)
    assert created.exit_code == 0, created.output
    listed = CliRunner().invoke(main, ["api-key", "list"], env=env).output
    [line] = listed.splitlines()
    assert line.split("\t")[1] == "ann\\nbob"
