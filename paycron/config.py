"""Configuration, read from the environment once into a frozen, validated object.

Each field made with :func:`setting` is read from the variable of its name
in upper case; the others are constants a test may override.

Nothing else in the code base reads ``os.environ``: the composition roots
(web app factory, scheduler, worker, CLI) call :meth:`Config.from_env` and
pass the result down explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace

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


def _url(text: str) -> str:
    return text.rstrip("/")


def setting(default, parse: Callable[[str], object], *, secret: bool = False):
    """A field read from the environment by :meth:`Config.from_env`, with
    ``parse`` turning the variable's text into the value. A ``secret`` is
    left out of the object's ``repr`` (it reaches logs and Sentry)."""
    return field(default=default, metadata={"parse": parse}, repr=not secret)


#: The processors an engine can be configured to charge through.
PROCESSORS = ("fake", "stripe")
#: The Stripe API version the adapter pins (the SDK's own; an upgrade only
#: while no payment is in doubt: SPEC §12).
STRIPE_API_VERSION = "2026-10-28.endive"


def _processor(text: str) -> str:
    if text.lower() not in PROCESSORS:
        raise ValueError(f"expected one of {', '.join(PROCESSORS)}")
    return text.lower()


def _secrets(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class Config:
    database_url: str | None = setting(None, str)
    redis_url: str | None = setting(None, str)
    gateway_url: str = setting("http://127.0.0.1:9090", _url)
    sentry_dsn: str | None = setting(None, str, secret=True)
    #: The processor payments are charged through (SPEC §12): the fake
    #: gateway at GATEWAY_URL, or Stripe through its official SDK.
    gateway: str = setting("fake", _processor)
    stripe_api_key: str | None = setting(None, str, secret=True)
    stripe_api_base: str = setting("https://api.stripe.com", _url)
    stripe_api_version: str = setting(STRIPE_API_VERSION, str)
    #: Signing secrets of Stripe's events, comma-separated (rotation).
    stripe_webhook_secret: tuple[str, ...] = setting((), _secrets, secret=True)
    #: How long the processor remembers an idempotency key (Stripe: 24 h).
    gateway_key_retention_seconds: float = setting(86400.0, parse_duration)
    #: The processor's own processing after we gave up on a call (SPEC §3's
    #: in-flight bound): a call can land until lease end + timeout + this.
    gateway_settle_margin_seconds: float = setting(600.0, parse_duration)
    #: A payment AWAITING_GATEWAY without its event is retrieved after this,
    #: then after 30 min, 2 h and every 12 h (SPEC §12).
    gateway_poll_seconds: float = setting(300.0, parse_duration)
    #: Gateway calls per second, all workers together (and the claim pace).
    gateway_rate_limit: int = setting(100, int)
    lease_seconds: float = setting(120.0, parse_duration)
    sweep_interval_seconds: float = setting(2.0, parse_duration)
    claim_batch: int = setting(100, int)
    gateway_timeout_seconds: float = setting(10.0, parse_duration)
    #: With 5 delays a budget allows 6 gateway calls; the 6th retryable failure parks.
    retry_delays: tuple[float, ...] = setting(
        (60.0, 300.0, 1800.0, 7200.0, 43200.0), parse_durations
    )
    #: Backoff jitter: each delay is multiplied by uniform(1 - j, 1 + j).
    retry_jitter: float = setting(0.2, float)
    max_lease_expiries: int = setting(5, int)
    smear_seconds: float = setting(0.0, parse_duration)
    circuit_failure_ratio: float = setting(0.5, float)
    circuit_min_calls: int = setting(20, int)
    circuit_open_seconds: float = setting(30.0, parse_duration)
    #: 1,000,000.00 in a two-decimal currency: a cap that stops fat fingers.
    max_amount_minor: int = setting(100_000_000, int)
    horizon_days: int = setting(366, int)
    default_currency: str = setting("USD", str.upper)
    max_body_bytes: int = setting(65536, int)
    partition_retention_days: int = setting(90, int)
    #: Partitions created past the horizon, so a create at the horizon's edge
    #: never races the partition keeper.
    partition_margin_days: int = 7
    #: Payment ids per Dramatiq message; capped so the whole group's calls fit
    #: well inside one lease (see :attr:`group_size`).
    message_group_size: int = setting(10, int)
    #: Dramatiq queue the execute actor listens on.
    queue_name: str = "payments"
    #: Prefix of every Redis key paycron writes (broker, rate limits, breaker).
    redis_namespace: str = setting("paycron", str)
    #: The circuit breaker judges the gateway on calls of the last this-many seconds.
    circuit_window_seconds: int = setting(10, int)
    db_pool_max: int = setting(10, int)
    #: The web pool's sessions cancel a statement running longer than this
    #: (0: never), so no request holds a connection and a thread for long: a
    #: page reads a few ms; 5 s leaves room for a slow disk, not for a scan.
    web_statement_timeout: float = setting(5.0, parse_duration)
    #: Gateway calls one worker process keeps in flight at most; what it keeps
    #: is sized from the ceiling and the observed latency (paycron/engine/inflight.py).
    #: 256 covers a 200/s ceiling at 1 s with headroom in a single process.
    gateway_max_in_flight: int = setting(256, int)
    #: How long a web process trusts an API key it has authenticated: a
    #: revocation reaches every process within this time; 0 checks every request.
    api_key_cache_seconds: float = setting(10.0, parse_duration)
    #: Requests per second per actor, and the bucket's size: one billing
    #: service's month-start burst (a few thousand creates at once) fits in
    #: the burst, and 500/s refills it in 10 s (paycron/limits/rate_limits.py).
    api_rate_limit: int = setting(500, int)
    api_rate_burst: int = setting(5000, int)
    #: Live webhook endpoints per actor: each is a stream the relay serves.
    max_webhook_endpoints: int = setting(10, int)
    #: Let webhook endpoints point at loopback/private addresses (tests, on-premise).
    webhook_allow_private_hosts: bool = setting(False, _flag)
    #: Webhook relay: endpoints served at once, one delivery's time limit,
    #: and the cap of its doubling backoff after failed deliveries.
    webhook_concurrency: int = setting(8, int)
    webhook_timeout_seconds: float = setting(5.0, parse_duration)
    webhook_backoff_max_seconds: float = setting(600.0, parse_duration)
    #: Scheduler and worker processes serve their counters here (see paycron.observability.metrics).
    metrics_port: int | None = setting(None, int)
    #: The web port serves /metrics only to ``Authorization: Bearer <this>``;
    #: unset, it does not serve /metrics at all (404).
    metrics_token: str | None = setting(None, str, secret=True)
    #: One read of the database gauges answers the scrapes of this many
    #: seconds: a scrape storm (several Prometheus replicas, a dashboard
    #: refreshing) costs one read per interval; 5 s is well under any
    #: scrape interval worth alerting on.
    metrics_cache_seconds: float = 5.0
    #: Where every process on the host writes its counters (prometheus_client's
    #: multiprocess mode); the web's /metrics then serves them all.
    prometheus_multiproc_dir: str | None = setting(None, str)
    #: Signs the operator console's session cookies; the console (``/console/``)
    #: is served only when it is set (web/console/).
    console_secret_key: str | None = setting(None, str, secret=True)
    #: A console session ends this long after its sign-in, whatever is done in it.
    console_session_minutes: float = setting(60.0, float)
    #: One read of the console overview's numbers answers this many seconds
    #: of page views (several operators, a refreshing tab): one read per interval.
    console_cache_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.gateway_timeout_seconds > self.lease_seconds / 3:
            raise ConfigError(
                "GATEWAY_TIMEOUT_SECONDS must be <= LEASE_SECONDS / 3 so a call always "
                "ends well inside its lease"
            )
        if self.gateway_timeout_seconds <= 0:
            raise ConfigError("GATEWAY_TIMEOUT_SECONDS must be > 0")
        if not self.retry_delays:
            raise ConfigError("RETRY_DELAYS needs at least one delay")
        if self.gateway_rate_limit < 1 or self.claim_batch < 1:
            raise ConfigError("GATEWAY_RATE_LIMIT and CLAIM_BATCH must be >= 1")
        if not 0 < self.circuit_failure_ratio <= 1:
            raise ConfigError("CIRCUIT_FAILURE_RATIO must be in (0, 1]")
        if self.api_rate_limit < 1 or self.api_rate_burst < 1:
            raise ConfigError("API_RATE_LIMIT and API_RATE_BURST must be >= 1")
        if self.max_webhook_endpoints < 0:
            raise ConfigError("MAX_WEBHOOK_ENDPOINTS must be >= 0")
        if self.gateway_max_in_flight < self.group_size:
            # a group larger than the bound is admitted only into an idle
            # process, and smaller groups could hold it off indefinitely
            raise ConfigError(
                f"GATEWAY_MAX_IN_FLIGHT must be at least the message group size ({self.group_size})"
            )
        if self.web_statement_timeout < 0:
            raise ConfigError("WEB_STATEMENT_TIMEOUT must be >= 0 (0: no timeout)")
        if self.metrics_token is not None and len(self.metrics_token) < 16:
            raise ConfigError("METRICS_TOKEN must be at least 16 characters")
        if self.console_secret_key is not None and len(self.console_secret_key) < 32:
            raise ConfigError(
                "CONSOLE_SECRET_KEY must be at least 32 characters (it signs "
                "the console's sessions; e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        if self.console_session_minutes <= 0:
            raise ConfigError("CONSOLE_SESSION_MINUTES must be > 0")
        if self.gateway == "stripe" and not self.stripe_api_key:
            raise ConfigError(
                "GATEWAY=stripe needs STRIPE_API_KEY (a secret key, sk_live_… or sk_test_…)"
            )
        if self.gateway_settle_margin_seconds < 0:
            raise ConfigError("GATEWAY_SETTLE_MARGIN_SECONDS must be >= 0")
        if self.gateway_key_retention_seconds <= 2 * self.in_flight_bound_seconds:
            # a key must outlive the calls made under it, with room to look up
            raise ConfigError(
                "GATEWAY_KEY_RETENTION_SECONDS must be more than twice the "
                "in-flight bound (LEASE_SECONDS + GATEWAY_TIMEOUT_SECONDS + "
                "GATEWAY_SETTLE_MARGIN_SECONDS)"
            )
        if len(self.default_currency) != 3:
            raise ConfigError("DEFAULT_CURRENCY must be an ISO 4217 code")

    @property
    def in_flight_bound_seconds(self) -> float:
        """From a claim to the last moment its call can land (SPEC §3): the
        lease, then the call's timeout, then the processor's own processing."""
        return (
            self.lease_seconds + self.gateway_timeout_seconds + self.gateway_settle_margin_seconds
        )

    @property
    def needs_customer(self) -> bool:
        """Whether the processor charges a customer's payment method (Stripe),
        so a create must name both."""
        return self.gateway == "stripe"

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
        """Every :func:`setting` from the variable of its name in upper case
        (``lease_seconds`` from ``LEASE_SECONDS``); unset or empty keeps the default."""
        env = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            parse = f.metadata.get("parse")
            raw = env.get(f.name.upper()) if parse else None
            if parse is None or raw is None or raw == "":
                continue
            try:
                values[f.name] = parse(raw)
            except (TypeError, ValueError, ConfigError) as exc:
                raise ConfigError(f"{f.name.upper()}={raw!r}: {exc}") from None
        return cls(**values)
