"""The demo's closing table: the figures it promises, the Stripe run's bank
debits and who settled them among them."""

from __future__ import annotations

from rich.console import Console

from devtools import demo

SUMMARY = {
    "completed": 3,
    "declined": 1,
    "parked": 0,
    "cancelled": 0,
    "open": 0,
    "retried": 1,
    "lease_expired": 0,
    "completed_minor": 300,
}
LEDGER = [{"amount": 100, "status": "succeeded"}] * 3
LATE = {"p50": 0.4, "p99": 1.2}


def run_report(monkeypatch, **kwargs) -> tuple[int, str]:
    recording = Console(record=True, width=100, force_terminal=False)
    monkeypatch.setattr(demo, "console", recording)
    code = demo.report(SUMMARY, LATE, LEDGER, {"a": 1, "b": 1, "c": 1}, **kwargs)
    return code, recording.export_text()


def test_the_stripe_run_reports_its_debits_and_who_settled_them(monkeypatch):
    debits = {"debits": 5, "settled_by_event": 4, "settled_by_poll": 1}
    code, text = run_report(monkeypatch, debits=debits)
    assert code == 0
    assert "bank debits (waited AWAITING_GATEWAY)" in text
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in text.splitlines()
        if line.count("│") >= 3
    }
    assert rows["bank debits (waited AWAITING_GATEWAY)"] == "5"
    assert rows["settled by their signed event"] == "4"
    assert rows["settled by the poller (event lost)"] == "1"


def test_the_card_run_has_no_debit_rows(monkeypatch):
    code, text = run_report(monkeypatch)
    assert code == 0 and "bank debits" not in text and "ledger check passed" in text
