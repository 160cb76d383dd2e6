"""Unauthenticated probes: liveness and readiness."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


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
def readyz():
    checks = {"postgres": _postgres_ok(), "redis": _redis_ok()}
    ready = all(checks.values())
    body = {"status": "ready" if ready else "unavailable",
            "checks": {name: "ok" if ok else "down" for name, ok in checks.items()}}
    return jsonify(body), 200 if ready else 503
