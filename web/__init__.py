"""The HTTP API. ``gunicorn 'web:create_app()'`` (the parentheses matter)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import redis
from flask import Flask

from paycron.apikeys import PrincipalCache
from paycron.breaker import CircuitBreaker
from paycron.config import Config
from paycron.db import make_pool
from paycron.gateway_client import HttpGateway
from paycron.observability import init_sentry
from web import admin, events, health, metrics, payments, webhooks
from web.api import Api
from web.problems import register_error_handlers
from web.schemas import now_utc


def create_app(config: Config | None = None, clock: Callable[[], datetime] = now_utc) -> Flask:
    """The composition root of the web process. ``clock`` is for tests."""
    config = config or Config.from_env()
    init_sentry(config, component="web")
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.sort_keys = False
    app.extensions["paycron.config"] = config
    app.extensions["paycron.clock"] = clock
    app.extensions["paycron.pool"] = make_pool(config, name="web")
    app.extensions["paycron.principals"] = PrincipalCache(config.api_key_cache_seconds)
    app.extensions["paycron.redis"] = (
        redis.Redis.from_url(config.redis_url, socket_timeout=2, socket_connect_timeout=2)
        if config.redis_url else None
    )
    app.extensions["paycron.gateway"] = HttpGateway(
        config.gateway_url, timeout=config.gateway_timeout_seconds, max_connections=4)
    breaker = (CircuitBreaker(app.extensions["paycron.redis"], config)
               if app.extensions["paycron.redis"] is not None else None)
    register_error_handlers(app)
    metrics.install(app, breaker=breaker)
    api = Api(app)  # serves GET /openapi.json, generated from the blueprints' schemas
    for blueprint in (health.bp, payments.bp, admin.bp, events.bp, webhooks.bp):
        api.register_blueprint(blueprint)
    return app
