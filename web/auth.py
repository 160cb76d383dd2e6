"""Bearer-key authentication: the key's actor is the payer."""

from __future__ import annotations

from functools import wraps

from flask import current_app, g, request

from paycron.apikeys import Principal
from web.problems import Problem


def _principal() -> Principal:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Problem(401, "UNAUTHENTICATED", "send Authorization: Bearer <api key>")
    principal = current_app.extensions["paycron.principals"].authenticate(
        current_app.extensions["paycron.pool"], key.strip())
    if principal is None:
        raise Problem(401, "UNAUTHENTICATED", "the API key is unknown or revoked")
    return principal


def require_key(view):
    """Views under it see ``g.principal``."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        g.principal = _principal()
        return view(*args, **kwargs)

    return wrapper


def require_admin(view):
    """Admin endpoints: a non-admin key gets 404, as if they did not exist."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        g.principal = _principal()
        if not g.principal.is_admin:
            raise Problem(404, "NOT_FOUND", "not found")
        return view(*args, **kwargs)

    return wrapper
