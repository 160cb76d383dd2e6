"""Configuration, read from the environment once into a frozen, validated object.

Each field made with :func:`setting` is read from the variable of its name
in upper case; the others are constants a test may override.

Nothing else in the code base reads ``os.environ``: the composition roots
(web app factory, scheduler, worker, CLI) call :meth:`Config.from_env` and
pass the result down explicitly.
"""

from __future__ import annotations

import ipaddress
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


_URL_PASSWORD = re.compile(r"(?P<head>^[a-z][a-z0-9+.-]*://[^/@:?#]*:)[^/@?#]*(?=@)", re.I)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.I)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#]*", re.I)


def redact_url(url: str | None) -> str | None:
    """A database or Redis URL as it may be shown: its password, in any of
    the forms libpq and redis-py accept (``user:pw@``, ``?password=``,
    ``password=...`` in a key/value string), replaced by ``***``."""
    if url is None:
        return None
    for pattern in (_URL_PASSWORD, _KV_PASSWORD, _QUERY_PASSWORD):
        url = pattern.sub(lambda m: m.group("head") + "***", url)
    return url


def setting(default, parse: Callable[[str], object], *, secret: bool = False):
    """A field read from the environment by :meth:`Config.from_env`, with
    ``parse`` turning the variable's text into the value. A ``secret`` is
    left out of the object's ``repr`` (it reaches logs and Sentry)."""
    return field(default=default, metadata={"parse": parse}, repr=not secret)


#: The processors an engine can be configured to charge through.
PROCESSORS = ("fake", "stripe")
#: The Stripe API version the adapter pins (the SDK's own; an upgrade only
#: while no payment is in doubt: docs/design.md).
STRIPE_API_VERSION = "2026-10-28.endive"


def _processor(text: str) -> str:
    if text.lower() not in PROCESSORS:
        raise ValueError(f"expected one of {', '.join(PROCESSORS)}")
    return text.lower()


#: How a worker process runs its calls (docs/performance.md); ``auto`` is
#: the faster of the two for the processor (:attr:`Config.execution`).
EXECUTORS = ("auto", "threads", "asyncio")


def _executor(text: str) -> str:
    if text.lower() not in EXECUTORS:
        raise ValueError(f"expected one of {', '.join(EXECUTORS)}")
    return text.lower()


#: How a processor customer comes to belong to an actor (docs/customers.md).
CUSTOMER_BINDINGS = ("first_use", "registered")


def _binding(text: str) -> str:
    if text.lower() not in CUSTOMER_BINDINGS:
        raise ValueError(f"expected one of {', '.join(CUSTOMER_BINDINGS)}")
    return text.lower()


def _networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated addresses or CIDR networks (``10.0.0.0/8, ::1``)."""
    return tuple(
        ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip()
    )


def _secrets(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class Config:
    #: The Postgres DSN; it may name several hosts, so pools follow a
    #: failover to whichever accepts writes (docs/operations.md).
    database_url: str | None = setting(None, str)
    #: The Redis URL: Dramatiq's queue, the call pacing, the breaker, rate limits.
    redis_url: str | None = setting(None, str)
    #: The fake processor's base URL (``GATEWAY=fake``: development and tests).
    gateway_url: str = setting("http://127.0.0.1:9090", _url)
    #: Errors to Sentry, scrubbed of payers, payees, tokens and bodies; unset: off.
    sentry_dsn: str | None = setting(None, str, secret=True)
    #: The processor payments are charged through: ``fake`` (the fake
    #: processor at GATEWAY_URL) or ``stripe`` (through its official SDK).
    gateway: str = setting("fake", _processor)
    #: Stripe's secret key (``sk_live_…``/``sk_test_…``); required with ``GATEWAY=stripe``.
    stripe_api_key: str | None = setting(None, str, secret=True)
    #: Stripe's API base URL (the fake processor's Stripe surface in tests and the demo).
    stripe_api_base: str = setting("https://api.stripe.com", _url)
    #: The pinned Stripe API version; register the events endpoint with the
    #: same one, and change it only while no payment is in doubt.
    stripe_api_version: str = setting(STRIPE_API_VERSION, str)
    #: Signing secrets of Stripe's events, comma-separated (rotation).
    stripe_webhook_secret: tuple[str, ...] = setting((), _secrets, secret=True)
    #: Which processor customers an actor may name (docs/customers.md):
    #: ``first_use``, the first actor to name an unregistered customer gets it
    #: (registered ones stay their actor's); ``registered``, only customers an
    #: admin registered to the actor (``paycron customer register``).
    customer_binding: str = setting("first_use", _binding)
    #: Ask the processor, at create, whose a payment method is, and refuse a
    #: method attached to another customer (PAYMENT_METHOD_NOT_CUSTOMERS).
    #: Only processors that can tell (Stripe) are asked.
    payment_method_check: bool = setting(True, _flag)
    #: The wall-clock bound of that check for one request (a batch's every
    #: new pair included): past it the create answers 503
    #: PROCESSOR_UNAVAILABLE and writes nothing.
    payment_method_check_seconds: float = setting(5.0, parse_duration)
    #: How long the processor remembers an idempotency key (Stripe: 24 h).
    gateway_key_retention_seconds: float = setting(86400.0, parse_duration)
    #: The processor's own processing after we gave up on a call: a call can
    #: land until its lease end + GATEWAY_TIMEOUT_SECONDS + this (the in-flight
    #: bound); a lookup that finds nothing is conclusive only after it.
    gateway_settle_margin_seconds: float = setting(600.0, parse_duration)
    #: A payment AWAITING_GATEWAY without its event is retrieved after this,
    #: then after 30 min, 2 h and every 12 h (when its event was lost).
    gateway_poll_seconds: float = setting(300.0, parse_duration)
    #: Processor calls per second, all workers together (and the claim pace).
    gateway_rate_limit: int = setting(100, int)
    #: How long a claim is a worker's before the reaper hands it back.
    lease_seconds: float = setting(120.0, parse_duration)
    #: How often the sweeper looks for due payments when the last sweep came back short.
    sweep_interval_seconds: float = setting(2.0, parse_duration)
    #: A prompt start: the sweep also wakes when a payment created due within
    #: the interval is announced (LISTEN/NOTIFY) and at the next known run_at,
    #: and workers look for messages at least every 50 ms when idle; false:
    #: the sweep runs every SWEEP_INTERVAL_SECONDS only (the safety net either way).
    prompt_start: bool = setting(True, _flag)
    #: Due payments one sweep claims at most (fairly across payers).
    claim_batch: int = setting(100, int)
    #: One processor call's limit; at most LEASE_SECONDS / 3 (checked at start).
    gateway_timeout_seconds: float = setting(10.0, parse_duration)
    #: The backoff after each retryable failure (``30s``, ``5m``, ``2h``); with 5
    #: delays a budget allows 6 gateway calls, and the 6th retryable failure parks.
    retry_delays: tuple[float, ...] = setting(
        (60.0, 300.0, 1800.0, 7200.0, 43200.0), parse_durations
    )
    #: Backoff jitter: each delay is multiplied by uniform(1 - j, 1 + j).
    retry_jitter: float = setting(0.2, float)
    #: Lease expiries before a payment parks as LEASE_EXPIRED_REPEATEDLY.
    max_lease_expiries: int = setting(5, int)
    #: Each payment runs at due time + uniform(0, this): spreads a midnight spike.
    smear_seconds: float = setting(0.0, parse_duration)
    #: The breaker opens when at least this share of at least CIRCUIT_MIN_CALLS
    #: calls in CIRCUIT_WINDOW_SECONDS failed retryably, for CIRCUIT_OPEN_SECONDS;
    #: then one sweeper claims one payment as the probe.
    circuit_failure_ratio: float = setting(0.5, float)
    circuit_min_calls: int = setting(20, int)
    circuit_open_seconds: float = setting(30.0, parse_duration)
    #: 1,000,000.00 in a two-decimal currency: a cap that stops fat fingers.
    max_amount_minor: int = setting(100_000_000, int)
    #: How far ahead a payment may be due (and partitions are kept ready).
    horizon_days: int = setting(366, int)
    #: The currency of a create that names none.
    default_currency: str = setting("USD", str.upper)
    #: A request body larger than this is refused (413).
    max_body_bytes: int = setting(65536, int)
    #: Items one batch create may carry (web/batches.py): 1,000 payments are
    #: about 150 KB of JSON and one set-based write of a few tens of ms, well
    #: inside WEB_STATEMENT_TIMEOUT; a month's import is then a few thousand
    #: requests. At most API_RATE_BURST, since a batch costs one token per item.
    batch_max_items: int = setting(1000, int)
    #: A batch create's body limit (MAX_BODY_BYTES is every other body's):
    #: 2 MiB holds a full batch whose every text field is at its longest
    #: (an item is at most about 1.1 KB of ASCII).
    max_batch_body_bytes: int = setting(2 * 1024 * 1024, int)
    #: Settled day partitions older than this are detached (their keys forgotten).
    partition_retention_days: int = setting(90, int)
    #: Partitions created past the horizon, so a create at the horizon's edge
    #: never races the partition keeper.
    partition_margin_days: int = 7
    #: Payment ids per Dramatiq message. With the threaded executor it is
    #: capped so a group's calls, made batch after batch when the shared
    #: window grants part of it, fit well inside one lease; the event loop
    #: starts each batch as soon as its tokens are granted, uncapped (see
    #: :attr:`group_size`).
    message_group_size: int = setting(20, int)
    #: Dramatiq queue the execute actor listens on.
    queue_name: str = "payments"
    #: Prefix of every Redis key paycron writes (broker, rate limits, breaker).
    redis_namespace: str = setting("paycron", str)
    #: The circuit breaker judges the gateway on calls of the last this-many seconds.
    circuit_window_seconds: int = setting(10, int)
    #: Connections in each process's pool; a web worker splits them between
    #: two pools: half for creates (opened at the first), the rest for
    #: everything else.
    db_pool_max: int = setting(10, int)
    #: The web pools' sessions cancel a statement running longer than this
    #: (0: never), so no request holds a connection and a thread for long: a
    #: page reads a few ms; 5 s leaves room for a slow disk, not for a scan.
    web_statement_timeout: float = setting(5.0, parse_duration)
    #: Processor calls one worker process keeps in flight at most; what it keeps
    #: is sized from the ceiling and the observed latency (paycron/engine/inflight.py).
    #: 256 covers a 200/s ceiling at 1 s with headroom in a single process.
    gateway_max_in_flight: int = setting(256, int)
    #: How a worker process makes its calls: ``threads`` (a thread per call
    #: in flight, blocking clients) or ``asyncio`` (one event loop per
    #: process: Dramatiq's AsyncIO middleware, psycopg's async pool, the
    #: charge's own HTTP/1.1 connections; the fake processor's charges only,
    #: every other request on a thread).
    #: Same statements, same guarantees (docs/performance.md). ``auto``: the
    #: faster for the processor, ``asyncio`` for the card processor and
    #: ``threads`` for Stripe (its SDK blocks: on the loop every charge would
    #: wait for one of a few threads).
    executor: str = setting("auto", _executor)
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
    #: ...on this address: loopback unless an operator opens it (the
    #: listener has no authentication; ``0.0.0.0`` for a scraper elsewhere).
    metrics_host: str = setting("127.0.0.1", str)
    #: Proxies (addresses or CIDR networks, comma-separated) whose
    #: ``X-Forwarded-For`` the audit log believes; from any other peer the
    #: header is ignored and the peer's address is the client's.
    trusted_proxies: tuple = setting((), _networks)
    #: A request body must arrive whole within this time (slow senders hold
    #: a connection, not a worker: web/intake.py).
    web_body_timeout_seconds: float = setting(10.0, parse_duration)
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
    #: A console bulk action over a filter acts on at most this many payments;
    #: a filter matching more is refused at its preview (narrow it).
    console_bulk_max: int = setting(1000, int)
    #: A console bulk action whose total in any one currency is above this many
    #: minor units needs a second operator's approval (a bulk refund always does).
    console_approval_above_minor: int = setting(1_000_000, int)
    #: A console approval request not decided within this many minutes expires.
    console_approval_minutes: float = setting(60.0, float)

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
        if self.batch_max_items < 1 or self.batch_max_items > self.api_rate_burst:
            # a batch is charged one token per item, all at once: a larger
            # one could never be granted
            raise ConfigError("BATCH_MAX_ITEMS must be between 1 and API_RATE_BURST")
        if self.max_batch_body_bytes < 1:
            raise ConfigError("MAX_BATCH_BODY_BYTES must be >= 1")
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
        if self.console_bulk_max < 1:
            raise ConfigError("CONSOLE_BULK_MAX must be >= 1")
        if self.console_approval_above_minor < 0:
            raise ConfigError("CONSOLE_APPROVAL_ABOVE_MINOR must be >= 0")
        if self.console_approval_minutes <= 0:
            raise ConfigError("CONSOLE_APPROVAL_MINUTES must be > 0")
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
        if self.payment_method_check_seconds <= 0:
            raise ConfigError("PAYMENT_METHOD_CHECK_SECONDS must be > 0")
        if len(self.default_currency) != 3:
            raise ConfigError("DEFAULT_CURRENCY must be an ISO 4217 code")

    @property
    def in_flight_bound_seconds(self) -> float:
        """From a claim to the last moment its call can land (docs/design.md): the
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
    def execution(self) -> str:
        """The executor a worker runs: ``EXECUTOR``, or for ``auto`` the
        event loop where the processor has an async client (the card
        processor) and threads where it has none (Stripe's SDK is blocking:
        on the loop each charge would wait for one of a few threads)."""
        if self.executor != "auto":
            return self.executor
        return "threads" if self.gateway == "stripe" else "asyncio"

    @property
    def max_gateway_calls(self) -> int:
        """Gateway calls one budget allows: the first plus one per retry delay."""
        return len(self.retry_delays) + 1

    @property
    def group_size(self) -> int:
        """Ids per message. Threads: such that every call of the group fits
        in half a lease, were each batch granted one token (its batches run
        one after another). The event loop: as set (its batches start as
        their tokens come, side by side, so a claim waits for the window
        and a place among the process's calls, never for its own group's
        other batches)."""
        if self.execution == "asyncio":
            return max(1, self.message_group_size)
        fits = int(self.lease_seconds / 2 // self.gateway_timeout_seconds)
        return max(1, min(self.message_group_size, fits))

    def __repr__(self) -> str:
        # The generated repr, less the secrets (``repr=False`` fields) and
        # with the passwords inside the database and Redis URLs hidden: a
        # Config reaches logs, tracebacks and Sentry.
        shown = []
        for f in fields(self):
            if not f.repr:
                continue
            value = getattr(self, f.name)
            if f.name in ("database_url", "redis_url"):
                value = redact_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"Config({', '.join(shown)})"

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
                shown = "(secret)" if not f.repr else repr(raw)
                raise ConfigError(f"{f.name.upper()}={shown}: {exc}") from None
        return cls(**values)
