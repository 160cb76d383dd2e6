"""Unauthenticated probes: liveness and readiness."""

from __future__ import annotations

from flask import current_app
from marshmallow import fields

from paycron.store.migrate import describe_pending, pending_migrations
from web.api import Blueprint
from web.schemas import Answer

bp = Blueprint("health", __name__, description="Unauthenticated probes.")


class HealthSchema(Answer):
    status = fields.String(metadata={"enum": ["ok"]})


class ReadinessSchema(Answer):
    status = fields.String(metadata={"enum": ["ready", "unavailable"]})
    checks = fields.Dict(
        keys=fields.String(metadata={"enum": ["postgres", "redis", "schema"]}),
        values=fields.String(metadata={"enum": ["ok", "down", "pending", "unknown"]}),
    )
    detail = fields.String(
        allow_none=True,
        metadata={"description": "What to do when the schema is behind the code; else null."},
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


def _schema_pending() -> list[str] | None:
    """The migrations this code expects that the database lacks (None: the
    database did not answer). Once current it stays current for this
    process (its code does not change), so that answer is remembered."""
    if current_app.extensions.get("paycron.schema_current"):
        return []
    try:
        with current_app.extensions["paycron.pool"].connection(timeout=2) as conn:
            pending = pending_migrations(conn)
    except Exception:
        return None
    if not pending:
        current_app.extensions["paycron.schema_current"] = True
    return pending


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
    """Readiness: Postgres and Redis are reachable, and every migration this
    code expects is applied (else 503 and ``detail`` says to run ``paycron migrate``)."""
    checks = {
        "postgres": "ok" if _postgres_ok() else "down",
        "redis": "ok" if _redis_ok() else "down",
    }
    pending = _schema_pending() if checks["postgres"] == "ok" else None
    checks["schema"] = "unknown" if pending is None else "pending" if pending else "ok"
    ready = all(state == "ok" for state in checks.values())
    body = {
        "status": "ready" if ready else "unavailable",
        "checks": checks,
        "detail": describe_pending(pending) if pending else None,
    }
    return body, 200 if ready else 503
