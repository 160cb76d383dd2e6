"""Configuration: read once from the environment, validated, documented."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from paycron.config import STRIPE_API_VERSION, Config
from paycron.errors import ConfigError

CONFIGURATION = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
SETTINGS = [f.name.upper() for f in fields(Config) if "parse" in f.metadata]


def test_each_setting_is_read_from_its_variable():
    config = Config.from_env(
        {
            "DATABASE_URL": "postgresql://db/x",
            "GATEWAY_URL": "http://gw:1/",
            "LEASE_SECONDS": "2m",
            "RETRY_DELAYS": "30s, 5m",
            "RETRY_JITTER": "0.1",
            "DEFAULT_CURRENCY": "eur",
            "WEBHOOK_ALLOW_PRIVATE_HOSTS": "yes",
            "GATEWAY_MAX_IN_FLIGHT": "64",
            "METRICS_PORT": "9100",
            "API_KEY_CACHE_SECONDS": "250ms",
        }
    )
    assert (config.database_url, config.gateway_url, config.lease_seconds) == (
        "postgresql://db/x",
        "http://gw:1",
        120.0,
    )
    assert (config.retry_delays, config.retry_jitter, config.default_currency) == (
        (30.0, 300.0),
        0.1,
        "EUR",
    )
    assert (
        config.webhook_allow_private_hosts,
        config.gateway_max_in_flight,
        config.metrics_port,
        config.api_key_cache_seconds,
    ) == (True, 64, 9100, 0.25)


def test_unset_and_empty_variables_keep_the_defaults():
    assert Config.from_env({}) == Config()
    assert Config.from_env({name: "" for name in SETTINGS}) == Config()


@pytest.mark.parametrize(
    "name, value",
    [
        ("CLAIM_BATCH", "ten"),
        ("LEASE_SECONDS", "soon"),
        ("WEBHOOK_ALLOW_PRIVATE_HOSTS", "maybe"),
        ("RETRY_DELAYS", "1m,later"),
        ("CLAIM_BATCH", "0"),
        ("GATEWAY_MAX_IN_FLIGHT", "0"),
        ("GATEWAY_TIMEOUT_SECONDS", "50"),  # more than LEASE_SECONDS / 3
        ("GATEWAY_TIMEOUT_SECONDS", "0"),
        ("GATEWAY_MAX_IN_FLIGHT", "5"),  # below the group size
        ("GATEWAY", "paypal"),
        ("GATEWAY", "stripe"),  # a Stripe gateway without STRIPE_API_KEY
        ("GATEWAY_KEY_RETENTION_SECONDS", "10m"),  # shorter than twice the in-flight bound
        ("BATCH_MAX_ITEMS", "0"),
        ("BATCH_MAX_ITEMS", "5001"),  # more than API_RATE_BURST: never granted
    ],
)
def test_a_bad_value_refuses_to_start_naming_the_variable(name, value):
    with pytest.raises(ConfigError) as refused:
        Config.from_env({name: value})
    assert name in str(refused.value)


@pytest.mark.parametrize("name", SETTINGS)
def test_every_setting_is_documented(name):
    assert f"`{name}`" in CONFIGURATION


def test_stripe_is_chosen_with_its_key_and_the_pinned_version():
    config = Config.from_env(
        {
            "GATEWAY": "Stripe",
            "STRIPE_API_KEY": "sk_test_abc123",
            "STRIPE_WEBHOOK_SECRET": "whsec_a, whsec_b",
        }
    )
    assert (config.gateway, config.stripe_api_version, config.stripe_webhook_secret) == (
        "stripe",
        STRIPE_API_VERSION,
        ("whsec_a", "whsec_b"),
    )
    assert config.needs_customer and not Config().needs_customer


def test_secrets_are_never_in_the_configs_repr():
    config = Config(
        gateway="stripe",
        stripe_api_key="sk_live_secret_key",
        stripe_webhook_secret=("whsec_secret",),
        sentry_dsn="https://k@sentry/1",
        metrics_token="a-long-metrics-token",
    )
    text = repr(config)
    for secret in (
        "sk_live_secret_key",
        "whsec_secret",
        "https://k@sentry/1",
        "a-long-metrics-token",
    ):
        assert secret not in text


@pytest.mark.parametrize(
    "db_url, cache_url",
    [
        ("postgresql://app:db-pass-1@db:5432/paycron", "redis://:redis-pass-2@cache:6379/0"),
        (
            "postgresql://db/paycron?password=db-pass-1&sslmode=require",
            "rediss://u:redis-pass-2@c/1",
        ),
        ("host=db,db2 user=app password=db-pass-1 target_session_attrs=read-write", None),
        ("host=db password='db-pass-1' dbname=x", "redis://c/0?password=redis-pass-2"),
    ],
)
def test_passwords_inside_the_urls_are_never_in_the_configs_repr(db_url, cache_url):
    text = repr(Config(database_url=db_url, redis_url=cache_url))
    assert "db-pass-1" not in text and "redis-pass-2" not in text
    assert "***" in text and "lease_seconds=120.0" in text  # the rest is shown


def test_the_metrics_listener_is_on_loopback_unless_opened():
    from devtools.procs import free_port
    from paycron.observability.metrics import serve_metrics

    assert Config().metrics_host == "127.0.0.1"
    assert Config.from_env({"METRICS_HOST": "0.0.0.0"}).metrics_host == "0.0.0.0"
    port = serve_metrics(free_port(), component="test")
    listening = {
        (line.split()[1])
        for line in open("/proc/net/tcp").read().splitlines()[1:]
        if line.split()[3] == "0A"
    }
    assert f"0100007F:{port:04X}" in listening  # 127.0.0.1, little-endian in /proc
    assert f"00000000:{port:04X}" not in listening


@pytest.mark.parametrize(
    ("environ", "execution"),
    [
        ({}, "asyncio"),  # the card processor has an async client
        ({"EXECUTOR": "threads"}, "threads"),
        ({"GATEWAY": "stripe", "STRIPE_API_KEY": "sk_test_x"}, "threads"),  # the SDK blocks
        ({"GATEWAY": "stripe", "STRIPE_API_KEY": "sk_test_x", "EXECUTOR": "asyncio"}, "asyncio"),
        ({"EXECUTOR": "Auto"}, "asyncio"),
    ],
)
def test_the_executor_is_the_faster_for_the_processor_unless_chosen(environ, execution):
    assert Config.from_env(environ).execution == execution


def test_an_unknown_executor_refuses_to_start():
    with pytest.raises(ConfigError, match="EXECUTOR"):
        Config.from_env({"EXECUTOR": "fibers"})


@pytest.mark.parametrize(
    "environ, size",
    [
        ({}, 20),  # the loop starts each batch as its tokens come: as set
        ({"MESSAGE_GROUP_SIZE": "50"}, 50),
        ({"EXECUTOR": "threads"}, 6),  # batch after batch: 6 x 10 s calls in half a 120 s lease
        ({"EXECUTOR": "threads", "GATEWAY_TIMEOUT_SECONDS": "5"}, 12),
        ({"GATEWAY": "stripe", "STRIPE_API_KEY": "sk_test_x"}, 6),
    ],
)
def test_a_message_groups_size_is_cut_to_the_lease_only_where_batches_run_in_turn(environ, size):
    assert Config.from_env(environ).group_size == size
