"""``GET /metrics`` (Prometheus text) and the web process's request metrics.

Served only to a bearer of ``METRICS_TOKEN`` (``Authorization: Bearer
<token>``, compared in constant time; 401 otherwise) and not at all when it
is unset (404): the web port is the public one. With
``PROMETHEUS_MULTIPROC_DIR`` set, it aggregates the counters of every
process on the host that writes there (gunicorn workers, scheduler, Dramatiq
workers); without it, this process's own counters. The database gauges are
computed by :class:`paycron.observability.metrics.DatabaseCollector`, at most once per
``Config.metrics_cache_seconds``.
"""

from __future__ import annotations

import hmac
import time

from flask import Blueprint, Flask, Response, current_app, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from paycron.observability.metrics import DatabaseCollector
from paycron.sql import q
from web.audit import audit, request_target
from web.problems import Problem

bp = Blueprint("metrics", __name__)

#: The methods the request counter names; any other (a client may send any
#: token as a method) is counted as "other", so no client can add series.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

HTTP_REQUESTS = Counter(
    "paycron_http_requests", "API requests answered", ["method", "endpoint", "status"]
)
HTTP_LATENCY = Histogram(
    "paycron_http_request_seconds",
    "API request latency",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


def _process_registry():
    directory = current_app.extensions["paycron.config"].prometheus_multiproc_dir
    if directory:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        return registry
    return REGISTRY


def _require_metrics_token() -> None:
    token = current_app.extensions["paycron.config"].metrics_token
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), token.encode()
    ):
        audit("metrics.unauthorized", "refused", target=request_target())
        raise Problem(401, "UNAUTHENTICATED", "/metrics needs Authorization: Bearer METRICS_TOKEN")


@bp.get("/metrics")
def metrics():
    _require_metrics_token()
    body = generate_latest(_process_registry())
    body += generate_latest(current_app.extensions["paycron.metrics_registry"])
    return Response(body, mimetype=CONTENT_TYPE_LATEST)


def install(app: Flask, *, breaker) -> None:
    """The request hooks, the scrape-time gauges, and /metrics when the
    config has a METRICS_TOKEN."""
    config = app.extensions["paycron.config"]
    collector = DatabaseCollector(
        app.extensions["paycron.pool"],
        breaker=breaker,
        queries={"metrics_gauges": q("metrics_gauges")},
        ttl=config.metrics_cache_seconds,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app.extensions["paycron.metrics_collector"] = collector
    app.extensions["paycron.metrics_registry"] = registry
    if config.metrics_token:
        app.register_blueprint(bp)

    @app.before_request
    def _start_timer():
        g.request_started = time.perf_counter()

    @app.after_request
    def _count(response):
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        method = request.method if request.method in METHODS else "other"
        HTTP_REQUESTS.labels(method, endpoint, str(response.status_code)).inc()
        if "request_started" in g:
            HTTP_LATENCY.labels(endpoint).observe(time.perf_counter() - g.request_started)
        return response
