"""Prometheus metrics: the processes' own counters, and the database-derived
gauges computed at scrape time.

Where they are exposed: the web process serves ``GET /metrics`` (its own
counters plus the gauges below) to a bearer of ``METRICS_TOKEN``, and not at
all without one (``web/metrics.py``). The scheduler and each worker process serve
their counters over HTTP when ``METRICS_PORT`` is set: on that port, or the
next free one of the 32 after it (``dramatiq tasks --processes N`` starts N
processes; each logs the port it took). With ``PROMETHEUS_MULTIPROC_DIR``
set (a directory shared by the processes of one host, as
prometheus_client's multiprocess mode wants), the web's ``/metrics``
aggregates every process's counters of that host.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from paycron.store.partitions import days_ahead

log = logging.getLogger("paycron.metrics")

CLAIMS = Counter("paycron_claims", "Payments claimed by sweeps (PENDING -> PROCESSING)")
LEASE_EXPIRATIONS = Counter("paycron_lease_expirations", "Leases that ran out and were reaped")
DEAD_LETTERS = Counter(
    "paycron_dead_letters", "Payments parked in the dead-letter table", ["reason"]
)
GATEWAY_CALLS = Counter("paycron_gateway_calls", "Gateway charge calls by outcome", ["outcome"])
GATEWAY_LATENCY = Histogram(
    "paycron_gateway_call_seconds",
    "Gateway charge call latency",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TRIGGER_LATENESS = Histogram(
    "paycron_trigger_lateness_seconds",
    "First attempt's start minus the due time",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900, 3600),
)
PROCESSOR_PAYMENT_MISSING = Counter(
    "paycron_processor_payment_missing",
    "Waiting payments whose processor-side payment the processor does not hold (paged)",
)
BREAKER_RELEASES = Counter(
    "paycron_breaker_releases", "Claims handed back unspent while the breaker was open"
)
RATE_LIMITER_ERRORS = Counter(
    "paycron_rate_limiter_errors",
    "Requests served unchecked because the rate limiter could not ask Redis",
)

#: circuit state as a number, for alerting
BREAKER_STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}


class DatabaseCollector(Collector):
    """Gauges read from Postgres (and the breaker from Redis) at scrape time,
    at most once per ``ttl`` seconds (``Config.metrics_cache_seconds``):
    scrapes within it, concurrent ones included (they wait for the one
    read), get the same values. ``reads`` counts the reads made."""

    def __init__(
        self, pool, *, breaker=None, queries: dict[str, str], ttl: float, clock=time.monotonic
    ):
        self._pool = pool
        self._breaker = breaker
        self._queries = queries
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list] | None = None
        self.reads = 0

    def collect(self):
        with self._lock:
            now = self._clock()
            if self._cached is None or not 0 <= now - self._cached[0] < self._ttl:
                self.reads += 1
                self._cached = (now, list(self._read()))
            families = self._cached[1]
        yield from families

    def _read(self):
        now = datetime.now(UTC)
        try:
            with self._pool.connection(timeout=5) as conn:
                row = conn.execute(
                    self._queries["metrics_gauges"],
                    {"now": now, "since": now - timedelta(minutes=5)},
                ).fetchone()
                ahead = days_ahead(conn)
        except Exception:  # a scrape must answer even when Postgres is down
            log.exception("metrics: database gauges unavailable")
            yield GaugeMetricFamily("paycron_database_up", "Postgres answered the scrape", 0)
            return
        yield GaugeMetricFamily("paycron_database_up", "Postgres answered the scrape", 1)
        gauges = {
            "paycron_oldest_due_pending_age_seconds": (
                "Age of the oldest due PENDING payment (0 when none)",
                row["oldest_due_age"] or 0,
            ),
            "paycron_backlog_payments": ("Due PENDING payments", row["backlog"]),
            "paycron_processing_payments": ("PROCESSING payments", row["processing"]),
            "paycron_due_inflow_5m_payments": (
                "Payments that fell due in the last 5 minutes",
                row["due_5m"],
            ),
            "paycron_dead_letters_open": ("Open dead letters", row["dlq_open"]),
            "paycron_awaiting_gateway_payments": (
                "Payments the processor accepted and settles later",
                row["awaiting"],
            ),
            "paycron_oldest_awaiting_gateway_age_seconds": (
                "Age of the oldest payment AWAITING_GATEWAY (0 when none)",
                row["oldest_awaiting_age"] or 0,
            ),
            "paycron_gateway_events_pending": (
                "Processor events stored and not yet applied",
                row["gateway_events_pending"],
            ),
            "paycron_partitions_ahead_days": ("Days ahead covered by partitions", ahead),
            "paycron_reconciliation_mismatches": (
                "Mismatches in the latest reconciliation run",
                row["mismatches"] or 0,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=float(value))
        if self._breaker is not None:
            try:
                state = self._breaker.state().value
                yield GaugeMetricFamily(
                    "paycron_circuit_state",
                    "Circuit breaker: 0 closed, 1 half-open, 2 open",
                    value=BREAKER_STATE_VALUE[state],
                )
            except Exception:
                log.exception("metrics: breaker state unavailable")


#: How many ports after METRICS_PORT a process may try.
METRICS_PORT_SPAN = 32


def serve_metrics(base_port: int | None, *, component: str, host: str = "127.0.0.1") -> int | None:
    """Serve this process's counters on ``host`` (``METRICS_HOST``: loopback
    unless opened; the listener has no authentication), on the first free
    port from ``base_port``."""
    if not base_port:
        return None
    from prometheus_client import start_http_server

    for port in range(base_port, base_port + METRICS_PORT_SPAN):
        try:
            start_http_server(port, addr=host)
        except OSError:
            continue
        log.info("%s metrics on %s:%d/metrics", component, host, port)
        return port
    log.warning(
        "%s: no free metrics port in %d..%d",
        component,
        base_port,
        base_port + METRICS_PORT_SPAN - 1,
    )
    return None
