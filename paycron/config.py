"""Configuration, read from the environment once into a frozen, validated object.

Nothing else in the code base reads ``os.environ``: the composition roots
(web app factory, scheduler, worker, CLI) call :meth:`Config.from_env` and
pass the result down explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from paycron.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str) -> float:
    """``30s``, ``5m``, ``2h``, ``1d``, ``250ms`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 30s, 5m, 2h)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_durations(text: str) -> tuple[float, ...]:
    return tuple(parse_duration(part) for part in text.split(",") if part.strip())


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


@dataclass(frozen=True)
class Config:
    database_url: str | None = None
    redis_url: str | None = None
    gateway_url: str = "http://127.0.0.1:9090"
    sentry_dsn: str | None = None
    port: int = 8000
    #: Gateway calls per second, all workers together (and the claim pace).
    gateway_rate_limit: int = 100
    lease_seconds: float = 120.0
    sweep_interval_seconds: float = 2.0
    claim_batch: int = 100
    gateway_timeout_seconds: float = 10.0
    #: With 5 delays a budget allows 6 gateway calls; the 6th retryable failure parks.
    retry_delays: tuple[float, ...] = (60.0, 300.0, 1800.0, 7200.0, 43200.0)
    #: Backoff jitter: each delay is multiplied by uniform(1 - j, 1 + j).
    retry_jitter: float = 0.2
    max_lease_expiries: int = 5
    smear_seconds: float = 0.0
    circuit_failure_ratio: float = 0.5
    circuit_min_calls: int = 20
    circuit_open_seconds: float = 30.0
    #: 1,000,000.00 in a two-decimal currency: a cap that stops fat fingers.
    max_amount_minor: int = 100_000_000
    horizon_days: int = 366
    default_currency: str = "USD"
    max_body_bytes: int = 65536
    partition_retention_days: int = 90
    #: Partitions created past the horizon, so a create at the horizon's edge
    #: never races the partition keeper.
    partition_margin_days: int = 7
    #: Payment ids per Dramatiq message; capped so the whole group's calls fit
    #: well inside one lease (see :attr:`group_size`).
    message_group_size: int = 10
    #: Dramatiq queue the execute actor listens on.
    queue_name: str = "payments"
    #: Prefix of every Redis key paycron writes (broker, rate limits, breaker).
    redis_namespace: str = "paycron"
    #: The circuit breaker judges the gateway on calls of the last this-many seconds.
    circuit_window_seconds: int = 10
    db_pool_max: int = 10
    #: How long a web process trusts an API key it has authenticated: a
    #: revocation reaches every process within this time; 0 checks every request.
    api_key_cache_seconds: float = 10.0
    #: Let webhook endpoints point at loopback/private addresses (tests, on-premise).
    webhook_allow_private_hosts: bool = False
    #: Webhook relay: endpoints served at once, one delivery's time limit,
    #: and the cap of its doubling backoff after failed deliveries.
    webhook_concurrency: int = 8
    webhook_timeout_seconds: float = 5.0
    webhook_backoff_max_seconds: float = 600.0
    #: Scheduler and worker processes serve their counters here (see paycron.metrics).
    metrics_port: int | None = None
    #: Where every process on the host writes its counters (prometheus_client's
    #: multiprocess mode); the web's /metrics then serves them all.
    prometheus_multiproc_dir: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.gateway_timeout_seconds > self.lease_seconds / 3:
            raise ConfigError(
                "GATEWAY_TIMEOUT_SECONDS must be <= LEASE_SECONDS / 3 so a call always "
                "ends well inside its lease"
            )
        if not self.retry_delays:
            raise ConfigError("RETRY_DELAYS needs at least one delay")
        if self.gateway_rate_limit < 1 or self.claim_batch < 1:
            raise ConfigError("GATEWAY_RATE_LIMIT and CLAIM_BATCH must be >= 1")
        if not 0 < self.circuit_failure_ratio <= 1:
            raise ConfigError("CIRCUIT_FAILURE_RATIO must be in (0, 1]")
        if len(self.default_currency) != 3:
            raise ConfigError("DEFAULT_CURRENCY must be an ISO 4217 code")

    @property
    def max_gateway_calls(self) -> int:
        """Gateway calls one budget allows: the first plus one per retry delay."""
        return len(self.retry_delays) + 1

    @property
    def group_size(self) -> int:
        """Ids per message such that every call of the group fits in half a lease."""
        fits = int(self.lease_seconds / 2 // self.gateway_timeout_seconds)
        return max(1, min(self.message_group_size, fits))

    def with_overrides(self, **changes) -> Config:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        env = os.environ if environ is None else environ

        def get(name: str, cast, default):
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                return cast(raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{name}={raw!r}: {exc}") from None

        d = cls()
        return cls(
            database_url=env.get("DATABASE_URL") or None,
            redis_url=env.get("REDIS_URL") or None,
            gateway_url=get("GATEWAY_URL", str, d.gateway_url).rstrip("/"),
            sentry_dsn=env.get("SENTRY_DSN") or None,
            port=get("PORT", int, d.port),
            gateway_rate_limit=get("GATEWAY_RATE_LIMIT", int, d.gateway_rate_limit),
            lease_seconds=get("LEASE_SECONDS", parse_duration, d.lease_seconds),
            sweep_interval_seconds=get(
                "SWEEP_INTERVAL_SECONDS", parse_duration, d.sweep_interval_seconds
            ),
            claim_batch=get("CLAIM_BATCH", int, d.claim_batch),
            gateway_timeout_seconds=get(
                "GATEWAY_TIMEOUT_SECONDS", parse_duration, d.gateway_timeout_seconds
            ),
            retry_delays=get("RETRY_DELAYS", parse_durations, d.retry_delays),
            retry_jitter=get("RETRY_JITTER", float, d.retry_jitter),
            max_lease_expiries=get("MAX_LEASE_EXPIRIES", int, d.max_lease_expiries),
            smear_seconds=get("SMEAR_SECONDS", parse_duration, d.smear_seconds),
            circuit_failure_ratio=get("CIRCUIT_FAILURE_RATIO", float, d.circuit_failure_ratio),
            circuit_min_calls=get("CIRCUIT_MIN_CALLS", int, d.circuit_min_calls),
            circuit_open_seconds=get(
                "CIRCUIT_OPEN_SECONDS", parse_duration, d.circuit_open_seconds
            ),
            max_amount_minor=get("MAX_AMOUNT_MINOR", int, d.max_amount_minor),
            horizon_days=get("HORIZON_DAYS", int, d.horizon_days),
            default_currency=get("DEFAULT_CURRENCY", str, d.default_currency).upper(),
            max_body_bytes=get("MAX_BODY_BYTES", int, d.max_body_bytes),
            partition_retention_days=get(
                "PARTITION_RETENTION_DAYS", int, d.partition_retention_days
            ),
            message_group_size=get("MESSAGE_GROUP_SIZE", int, d.message_group_size),
            db_pool_max=get("DB_POOL_MAX", int, d.db_pool_max),
            api_key_cache_seconds=get("API_KEY_CACHE_SECONDS", parse_duration,
                                      d.api_key_cache_seconds),
            redis_namespace=get("REDIS_NAMESPACE", str, d.redis_namespace),
            metrics_port=get("METRICS_PORT", int, d.metrics_port),
            prometheus_multiproc_dir=env.get("PROMETHEUS_MULTIPROC_DIR") or None,
            webhook_allow_private_hosts=get("WEBHOOK_ALLOW_PRIVATE_HOSTS", _flag,
                                            d.webhook_allow_private_hosts),
            circuit_window_seconds=get("CIRCUIT_WINDOW_SECONDS", int, d.circuit_window_seconds),
            webhook_concurrency=get("WEBHOOK_CONCURRENCY", int, d.webhook_concurrency),
            webhook_timeout_seconds=get("WEBHOOK_TIMEOUT_SECONDS", parse_duration,
                                        d.webhook_timeout_seconds),
            webhook_backoff_max_seconds=get("WEBHOOK_BACKOFF_MAX_SECONDS", parse_duration,
                                            d.webhook_backoff_max_seconds),
        )
