"""The HTTP API. ``gunicorn 'web:create_app()'`` (the parentheses matter)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from flask import Flask

from paycron.config import Config
from paycron.engine.payment_methods import PaymentMethodCheck
from paycron.limits.breaker import CircuitBreaker
from paycron.limits.pacing import CallLimiter
from paycron.limits.rate_limits import ActorRateLimiter
from paycron.observability.audit import configure_audit_log
from paycron.observability.sentry import configure_logging, init_sentry
from paycron.processors.base import PaymentMethodOwners
from paycron.processors.factory import build_processor
from paycron.store.apikeys import PrincipalCache
from paycron.store.db import make_pool, make_redis
from web import (
    admin,
    admin_customers,
    batches,
    console,
    events,
    gateway_events,
    health,
    intake,
    metrics,
    payments,
    webhooks,
)
from web.api import Api
from web.problems import register_error_handlers
from web.schemas import now_utc

#: The API's blueprints: the routes ``/openapi.json`` documents (docs/api.md too).
API_BLUEPRINTS = (
    health.bp,
    payments.bp,
    batches.bp,
    admin.bp,
    admin_customers.bp,
    events.bp,
    webhooks.bp,
    gateway_events.bp,
)


def create_app(config: Config | None = None, clock: Callable[[], datetime] = now_utc) -> Flask:
    """The composition root of the web process: config, Sentry as "web",
    logging (the audit log on standard error), the pool, the Redis client,
    the gateway adapter, the blueprints. ``clock`` is for tests."""
    config = config or Config.from_env()
    init_sentry(config, component="web")
    # Without this the process's log lines (and the audit log) go nowhere:
    # gunicorn configures only its own loggers.
    configure_logging()
    configure_audit_log()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.sort_keys = False
    app.extensions["paycron.config"] = config
    app.extensions["paycron.clock"] = clock
    # Two pools share DB_POOL_MAX: the create's own sessions (web.payments.create),
    # which plan its one statement once rather than on every create
    # (paycron.store.db), and everything else's. No create connection until
    # the first create.
    for_creates = max(1, config.db_pool_max // 2)
    app.extensions["paycron.pool"] = make_pool(
        config,
        max_size=max(1, config.db_pool_max - for_creates),
        name="web",
        statement_timeout=config.web_statement_timeout,
    )
    app.extensions["paycron.create_pool"] = make_pool(
        config,
        min_size=0,
        max_size=for_creates,
        name="web-create",
        statement_timeout=config.web_statement_timeout,
        generic_plans=True,
    )
    app.extensions["paycron.principals"] = PrincipalCache(config.api_key_cache_seconds)
    # Short command timeouts: a readiness probe must answer while Redis hangs.
    app.extensions["paycron.redis"] = make_redis(config, timeout=2)
    # The admin dead-letter actions ask the gateway, one at a time, and
    # creates ask whose a payment method is (a few at a time per request).
    gateway = build_processor(
        config, max_connections=8, call_limiter=CallLimiter(app.extensions["paycron.redis"], config)
    )
    app.extensions["paycron.gateway"] = gateway
    app.extensions["paycron.payment_method_check"] = (
        PaymentMethodCheck(gateway, seconds=config.payment_method_check_seconds)
        if config.payment_method_check and isinstance(gateway, PaymentMethodOwners)
        else None
    )
    app.extensions["paycron.rate_limiter"] = ActorRateLimiter(
        app.extensions["paycron.redis"], config
    )
    breaker = CircuitBreaker(app.extensions["paycron.redis"], config)
    register_error_handlers(app)
    intake.install(app)  # bodies read whole, bounded in size and time
    metrics.install(app, breaker=breaker)
    api = Api(app)  # serves GET /openapi.json, generated from the blueprints' schemas
    for blueprint in API_BLUEPRINTS:
        api.register_blueprint(blueprint)
    console.install(app, breaker=breaker)  # only with CONSOLE_SECRET_KEY
    return app


def close_app(app: Flask) -> None:
    """Close the pools :func:`create_app` opened (a worker that exits closes
    them with its process; tests close them here)."""
    app.extensions["paycron.create_pool"].close()
    app.extensions["paycron.pool"].close()
