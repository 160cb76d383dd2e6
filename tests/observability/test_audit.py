"""The audit log's own rules: its line, its vocabulary, and whose address
it believes."""

from __future__ import annotations

import io
import ipaddress
import json

import pytest

from paycron.config import Config
from paycron.observability import audit

PROXIES = Config.from_env({"TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).trusted_proxies


def test_trusted_proxies_are_read_as_networks():
    assert PROXIES == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))


@pytest.mark.parametrize(
    "peer, forwarded, expected",
    [
        # a peer that is no trusted proxy: its header is anybody's claim
        ("203.0.113.9", "198.51.100.1", "203.0.113.9"),
        # a trusted proxy: the hop it saw
        ("10.1.2.3", "198.51.100.1", "198.51.100.1"),
        # a client writes what it likes on the left; the right-most untrusted hop counts
        ("10.1.2.3", "1.1.1.1, 198.51.100.7, 10.9.9.9", "198.51.100.7"),
        # every hop a trusted proxy: the left-most of them
        ("10.1.2.3", "10.0.0.5", "10.0.0.5"),
        # garbage ends the walk at the last address known
        ("10.1.2.3", "1.1.1.1, not-an-address", "10.1.2.3"),
        ("::1", "[2001:db8::5]", "2001:db8::5"),
        ("10.1.2.3", None, "10.1.2.3"),
    ],
)
def test_x_forwarded_for_is_believed_only_from_trusted_proxies(peer, forwarded, expected):
    assert audit.remote_address(peer, forwarded, PROXIES) == expected


def test_without_trusted_proxies_the_peer_is_the_client():
    assert audit.remote_address("10.1.2.3", "198.51.100.1", ()) == "10.1.2.3"


def test_a_line_has_every_field_in_order_and_bounded_text(audit_lines):
    line = audit.record(
        "dead_letter.dismiss",
        "success",
        actor="ops",
        key_id=3,
        remote_addr="127.0.0.1",
        target="x" * 500,
        reason="paid by pm_1AbCdEfGhIjK and cus_QwErTy",
    )
    assert list(line)[:8] == [
        "time",
        "event",
        "outcome",
        "actor",
        "key_id",
        "remote_addr",
        "target",
        "reason",
    ]
    assert line["time"].endswith("Z") and len(line["target"]) == audit.MAX_TEXT
    assert "pm_1AbC" not in line["reason"] and "cus_QwE" not in line["reason"]
    assert audit_lines == [line]


def test_unknown_events_and_outcomes_are_refused():
    with pytest.raises(ValueError):
        audit.record("console.sign_on", "success")
    with pytest.raises(ValueError):
        audit.record("console.sign_in", "ok")


def test_configured_the_lines_go_to_their_stream_as_bare_json():
    stream = io.StringIO()
    logger = audit.log
    saved = (logger.handlers[:], logger.propagate)
    logger.handlers = []
    try:
        audit.configure_audit_log(stream)
        audit.configure_audit_log(stream)  # once per process, however often called
        audit.record("api.unauthorized", "refused", remote_addr="127.0.0.1", target="GET /v1/x")
    finally:
        logger.handlers, logger.propagate = saved
    (text,) = stream.getvalue().splitlines()
    assert json.loads(text)["event"] == "api.unauthorized"
