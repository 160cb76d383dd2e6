"""/metrics: the process counters, the scrape-time gauges, the alert rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from paycron.observability.metrics import DatabaseCollector
from paycron.sql import q
from tests.factories import insert_payment, park
from tests.support import Clock
from web import close_app

RULES = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "alerts.yml"
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count"),
}


TOKEN = "scrape-token-for-tests-0123456789"
SCRAPER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def config(config):
    """The web app serves /metrics only with a token; these tests read fresh
    gauges on every scrape unless they say otherwise."""
    return config.with_overrides(metrics_token=TOKEN, metrics_cache_seconds=0)


def samples_of(client) -> list:
    response = client.get("/metrics", headers=SCRAPER)
    assert response.status_code == 200
    return [
        sample
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for sample in family.samples
    ]


def scrape(client) -> dict[str, float]:
    """Sample name -> value (for unlabelled samples; a labelled one keeps its last value)."""
    return {sample.name: sample.value for sample in samples_of(client)}


def sample_value(client, name: str, **labels: str) -> float:
    """The value of the one sample ``name{labels}``; 0 before its first count."""
    found = [s.value for s in samples_of(client) if s.name == name and s.labels == labels]
    return found[0] if found else 0.0


def exported_names(client) -> set[str]:
    names = set(scrape(client))
    for family in REGISTRY.collect():  # labelled families with no child yet
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return names


def test_gauges_are_computed_from_the_database_at_scrape_time(client, conn):
    from datetime import UTC, datetime, timedelta

    insert_payment(conn, due_at=datetime.now(UTC) - timedelta(minutes=3))
    insert_payment(conn, due_at=datetime.now(UTC) - timedelta(seconds=30))
    insert_payment(conn, status="PROCESSING")
    park(conn)
    samples = scrape(client)
    assert samples["paycron_backlog_payments"] == 2
    assert 170 <= samples["paycron_oldest_due_pending_age_seconds"] <= 400
    assert samples["paycron_processing_payments"] == 1
    assert samples["paycron_dead_letters_open"] == 1
    assert samples["paycron_due_inflow_5m_payments"] == 4
    assert samples["paycron_partitions_ahead_days"] >= 366
    assert samples["paycron_database_up"] == 1
    assert samples["paycron_circuit_state"] == 0
    assert samples["paycron_reconciliation_mismatches"] == 0
    conn.execute(
        "INSERT INTO reconciliation_runs (day, mismatches, source) VALUES (current_date, 2, 'file')"
    )
    assert scrape(client)["paycron_reconciliation_mismatches"] == 2


def test_requests_are_counted_by_route_and_status(client, alice):
    listed = {"method": "GET", "endpoint": "/v1/scheduled-payments", "status": "200"}
    refused = {**listed, "status": "401"}
    before = {
        name: sample_value(client, "paycron_http_requests_total", **labels)
        for name, labels in (("listed", listed), ("refused", refused))
    }
    for _ in range(2):
        assert client.get("/v1/scheduled-payments", headers=alice).status_code == 200
    assert client.get("/v1/scheduled-payments").status_code == 401
    assert sample_value(client, "paycron_http_requests_total", **listed) == before["listed"] + 2
    assert sample_value(client, "paycron_http_requests_total", **refused) == before["refused"] + 1


def test_unknown_methods_add_no_series_they_are_counted_as_other(client):
    def series() -> set:
        return {
            tuple(sorted(s.labels.items()))
            for family in text_string_to_metric_families(
                client.get("/metrics", headers=SCRAPER).get_data(as_text=True)
            )
            for s in family.samples
            if s.name == "paycron_http_requests_total"
        }

    for n in range(5):  # warm: the scrape itself and the first "other"
        client.open("/healthz", method=f"BREW{n}")
    series()  # the scrape counts itself once
    before = series()
    for n in range(50):
        assert client.open("/healthz", method=f"X{n}QZ").status_code == 405
    assert series() == before
    assert not any(dict(labels)["method"].startswith("X") for labels in series())
    assert any(dict(labels)["method"] == "other" for labels in series())


def test_every_metric_an_alert_names_is_exported(client):
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert len(rules) >= 10
    exported = exported_names(client)
    for rule in rules:
        named = set(re.findall(r"\bpaycron_[a-z0-9_]+", rule["expr"]))
        assert named, rule["alert"]
        missing = named - exported
        assert not missing, f"{rule['alert']} names unexported {missing}"


def test_the_alert_list_covers_the_design_card(client):
    exprs = " ".join(r["expr"] for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"])
    for metric in (
        "paycron_oldest_due_pending_age_seconds",
        "paycron_claims_total",
        "paycron_due_inflow_5m_payments",
        "paycron_lease_expirations_total",
        "paycron_dead_letters_total",
        "paycron_gateway_calls_total",
        "paycron_gateway_call_seconds_bucket",
        "paycron_reconciliation_mismatches",
        "paycron_partitions_ahead_days",
    ):
        assert metric in exprs


def test_with_a_multiprocess_directory_the_scrape_is_that_directorys(config, client, tmp_path):
    """PROMETHEUS_MULTIPROC_DIR comes through Config: with it set, /metrics
    serves the counters the processes wrote there (none, in an empty one)
    instead of this process's own; the scrape-time gauges stay."""
    from paycron.config import Config
    from web import create_app

    assert Config.from_env(
        {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    ).prometheus_multiproc_dir == str(tmp_path)
    client.get("/healthz")
    assert "paycron_http_requests_total" in scrape(client)
    app = create_app(config.with_overrides(prometheus_multiproc_dir=str(tmp_path)))
    try:
        samples = scrape(app.test_client())
    finally:
        close_app(app)
    assert "paycron_http_requests_total" not in samples
    assert "paycron_database_up" in samples


# -- Not on the public port without a token; cheap under a scrape storm -------------


def _app(config, **overrides):
    from web import create_app

    return create_app(config.with_overrides(**overrides))


def test_without_a_token_the_web_port_does_not_serve_metrics(config):
    app = _app(config, metrics_token=None)
    try:
        response = app.test_client().get("/metrics", headers=SCRAPER)
    finally:
        close_app(app)
    assert (response.status_code, response.get_json()["code"]) == (404, "NOT_FOUND")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong-token-of-enough-length",
        f"Basic {TOKEN}",
        TOKEN,
        f"Bearer {TOKEN}x",
    ],
)
def test_a_scrape_without_the_token_is_401(client, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response.mimetype == "application/problem+json"
    assert response.get_json()["code"] == "UNAUTHENTICATED"
    assert "paycron_" not in response.get_data(as_text=True)


def test_a_short_token_refuses_to_start():
    from paycron.config import Config
    from paycron.errors import ConfigError

    with pytest.raises(ConfigError, match="METRICS_TOKEN"):
        Config.from_env({"METRICS_TOKEN": "short"})


def test_two_scrapes_within_the_cache_time_read_the_database_once(config, conn):
    app = _app(config, metrics_cache_seconds=5.0)  # the default
    try:
        client = app.test_client()
        collector = app.extensions["paycron.metrics_collector"]
        assert collector.reads == 0
        assert scrape(client)["paycron_backlog_payments"] == 0
        insert_payment(conn)
        assert scrape(client)["paycron_backlog_payments"] == 0  # the same read's values
        assert collector.reads == 1
    finally:
        close_app(app)


class CountingPool:
    """A pool that counts the connections asked of it: one per database read."""

    def __init__(self, pool):
        self.pool, self.connections = pool, 0

    def connection(self, **kwargs):
        self.connections += 1
        return self.pool.connection(**kwargs)


def test_the_gauges_are_read_again_once_the_cache_time_has_passed(app, conn):
    clock = Clock(start=1000.0)
    pool = CountingPool(app.extensions["paycron.pool"])
    collector = DatabaseCollector(
        pool, queries={"metrics_gauges": q("metrics_gauges")}, ttl=5.0, clock=clock
    )

    def backlog() -> float:
        families = {f.name: f for f in collector.collect()}
        return families["paycron_backlog_payments"].samples[0].value

    assert backlog() == 0
    insert_payment(conn)
    clock.advance(4.9)
    assert (backlog(), pool.connections, collector.reads) == (0, 1, 1)
    clock.advance(0.1)
    assert (backlog(), pool.connections, collector.reads) == (1, 2, 2)
    clock.advance(-60)  # a clock that went back does not freeze the cache
    assert (backlog(), pool.connections) == (1, 3)
