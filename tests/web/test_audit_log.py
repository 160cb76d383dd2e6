"""The API's audit lines: every 401 and admin refusal, every admin read of
payer data and every admin action, with who, from where and how it ended
(docs/audit-log.md)."""

from __future__ import annotations

import pytest

from tests.factories import park
from web import close_app

URL = "/v1/admin/dead-letters"


@pytest.fixture
def admin(make_key) -> dict:
    return {"Authorization": f"Bearer {make_key('ops-ann', admin=True)}"}


def events(lines, name):
    return [line for line in lines if line["event"] == name]


def test_a_request_without_a_valid_key_is_logged_without_the_key(client, audit_lines):
    client.get("/v1/scheduled-payments")
    client.get("/v1/scheduled-payments", headers={"Authorization": "Bearer pc_dead_beef"})
    missing, unknown = events(audit_lines, "api.unauthorized")
    assert missing["outcome"] == unknown["outcome"] == "refused"
    assert missing["target"] == "GET /v1/scheduled-payments"
    assert (missing["reason"], unknown["reason"]) == ("no bearer key", "unknown or revoked key")
    assert missing["remote_addr"] == "127.0.0.1" and missing["actor"] is None
    assert "pc_dead_beef" not in str(audit_lines)


def test_a_payer_key_on_an_admin_route_is_logged_with_its_actor(client, alice, audit_lines):
    assert client.get(URL, headers=alice).status_code == 404
    (line,) = events(audit_lines, "api.forbidden")
    assert (line["actor"], line["outcome"], line["target"]) == ("alice", "refused", f"GET {URL}")
    assert isinstance(line["key_id"], int)


def test_admin_reads_of_payer_data_are_logged(client, admin, conn, audit_lines):
    row = park(conn)
    client.get(URL, headers=admin)
    client.get(f"{URL}/{row['id']}", headers=admin)
    listing, shown = events(audit_lines, "admin.read")
    assert listing["actor"] == shown["actor"] == "ops-ann"
    assert listing["outcome"] == shown["outcome"] == "success"
    assert shown["target"] == f"dead letter {row['id']}" and shown["channel"] == "api"


def test_admin_actions_are_logged_with_their_outcome(client, admin, conn, gateway, audit_lines):
    charged, other = park(conn), park(conn)
    gateway.charge(charged)
    assert client.post(f"{URL}/{charged['id']}/refund", headers=admin).status_code == 200
    assert client.post(f"{URL}/{charged['id']}/refund", headers=admin).status_code == 409
    assert client.post(f"{URL}/{other['id']}/redrive", headers=admin).status_code == 200
    client.post(f"{URL}/{other['id']}/dismiss", headers=admin, json={"note": "by wire"})
    refunded, again = events(audit_lines, "dead_letter.refund")
    assert (refunded["outcome"], refunded["target"]) == ("success", str(charged["id"]))
    assert refunded["actor"] == "ops-ann" and refunded["remote_addr"] == "127.0.0.1"
    assert again["outcome"] == "refused" and "resolved" in again["reason"]
    (redriven,) = events(audit_lines, "dead_letter.redrive")
    assert redriven["outcome"] == "success"
    (dismissed,) = events(audit_lines, "dead_letter.dismiss")
    assert dismissed["outcome"] == "refused"  # re-driven already


def test_an_action_the_gateway_cannot_answer_is_a_failure(config, make_key, conn, audit_lines):
    from web import create_app

    app = create_app(config.with_overrides(gateway_url="http://127.0.0.1:9"))
    try:
        admin = {"Authorization": f"Bearer {make_key('ops-ann', admin=True)}"}
        row = park(conn)
        assert app.test_client().post(f"{URL}/{row['id']}/refund", headers=admin).status_code == 502
    finally:
        close_app(app)
    (line,) = events(audit_lines, "dead_letter.refund")
    assert line["outcome"] == "failure" and line["reason"]


def test_a_scrape_without_the_token_is_logged(config, audit_lines):
    from web import create_app

    app = create_app(config.with_overrides(metrics_token="t" * 20))
    try:
        assert app.test_client().get("/metrics").status_code == 401
    finally:
        close_app(app)
    (line,) = events(audit_lines, "metrics.unauthorized")
    assert line["outcome"] == "refused"


def test_the_client_address_comes_from_x_forwarded_for_only_behind_a_trusted_proxy(
    config, audit_lines
):
    from web import create_app

    forwarded = {"X-Forwarded-For": "198.51.100.7"}
    for proxies, peer, expected in [
        ((), "10.0.0.2", "10.0.0.2"),
        (
            config.from_env({"TRUSTED_PROXIES": "10.0.0.0/8"}).trusted_proxies,
            "10.0.0.2",
            "198.51.100.7",
        ),
        (
            config.from_env({"TRUSTED_PROXIES": "10.0.0.0/8"}).trusted_proxies,
            "192.0.2.4",
            "192.0.2.4",
        ),
    ]:
        app = create_app(config.with_overrides(trusted_proxies=proxies))
        try:
            app.test_client().get(
                "/v1/scheduled-payments", headers=forwarded, environ_base={"REMOTE_ADDR": peer}
            )
        finally:
            close_app(app)
        assert audit_lines[-1]["remote_addr"] == expected


def test_every_audit_event_kind_is_asserted_by_a_test():
    """Each event the audit log knows (docs/audit-log.md) is one a test
    reads back: a new kind comes with its test, or this fails."""
    from pathlib import Path

    from paycron.observability.audit import EVENTS

    tests = Path(__file__).resolve().parent.parent
    texts = "\n".join(
        path.read_text()
        for path in tests.rglob("test_*.py")
        if path.resolve() != Path(__file__).resolve()
    )
    texts += Path(__file__).read_text().split("def test_every_audit_event_kind")[0]
    assert [name for name in EVENTS if f'"{name}"' not in texts] == []
