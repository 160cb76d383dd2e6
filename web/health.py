"""Unauthenticated probes: liveness and readiness."""

from __future__ import annotations

from flask import current_app
from marshmallow import fields

from web.api import Blueprint
from web.schemas import ResponseSchema

bp = Blueprint("health", __name__, description="Unauthenticated probes.")


class HealthSchema(ResponseSchema):
    status = fields.String(metadata={"enum": ["ok"]})


class ReadinessSchema(ResponseSchema):
    status = fields.String(metadata={"enum": ["ready", "unavailable"]})
    checks = fields.Dict(
        keys=fields.String(metadata={"enum": ["postgres", "redis"]}),
        values=fields.String(metadata={"enum": ["ok", "down"]}),
    )


@bp.get("/healthz")
@bp.response(200, HealthSchema, description="Up.")
def healthz():
    """Liveness: the process is up."""
    return {"status": "ok"}


def _postgres_ok() -> bool:
    try:
        with current_app.extensions["paycron.pool"].connection(timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def _redis_ok() -> bool:
    try:
        return bool(current_app.extensions["paycron.redis"].ping())
    except Exception:
        return False


@bp.get("/readyz")
@bp.response(200, ReadinessSchema, description="Ready.")
@bp.alt_response(
    503, schema=ReadinessSchema, description="A dependency is down; checks says which."
)
def readyz():
    """Readiness: Postgres and Redis are reachable."""
    checks = {"postgres": _postgres_ok(), "redis": _redis_ok()}
    ready = all(checks.values())
    body = {
        "status": "ready" if ready else "unavailable",
        "checks": {name: "ok" if ok else "down" for name, ok in checks.items()},
    }
    return body, 200 if ready else 503
