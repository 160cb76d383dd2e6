"""Bearer-key authentication: the key's actor is the payer.

Each decorator documents what it enforces (the security requirement, the
401 and the 429), so no route can require a key without the document saying
so. Once the key is known, the request is charged to its actor's rate limit
(``paycron.limits.rate_limits``): one token, or, for a view that knows its
cost only from its body (a batch create: one per item), what the view
charges itself (:func:`charge`). A request without a valid key is charged
to no one.
"""

from __future__ import annotations

from functools import wraps

from flask import current_app, g, request

from paycron.store.apikeys import Principal
from web.api import BEARER, Blueprint
from web.audit import audit, request_target
from web.problems import PROBLEM_JSON, Problem, ProblemSchema

_UNAUTHENTICATED = {
    "description": "No bearer key, or an unknown or revoked one (UNAUTHENTICATED).",
    "headers": {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
    "content": {PROBLEM_JSON: {"schema": ProblemSchema}},
}
_RATE_LIMITED = {
    "description": "More than API_RATE_LIMIT requests per second from this actor, beyond "
    "its API_RATE_BURST (RATE_LIMITED). Other actors are unaffected.",
    "headers": {
        "Retry-After": {
            "required": True,
            "description": "Whole seconds to wait (at least 1).",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
    "content": {PROBLEM_JSON: {"schema": ProblemSchema}},
}
_NOT_ADMIN = {
    "description": "Not found. A non-admin key gets 404 on every admin endpoint, "
    "as if it did not exist.",
    "content": {PROBLEM_JSON: {"schema": ProblemSchema}},
}


def _principal(*, charged: bool = True) -> Principal:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        audit("api.unauthorized", "refused", target=request_target(), reason="no bearer key")
        raise Problem(401, "UNAUTHENTICATED", "send Authorization: Bearer <api key>")
    principal = current_app.extensions["paycron.principals"].authenticate(
        current_app.extensions["paycron.pool"], key.strip()
    )
    if principal is None:
        audit(
            "api.unauthorized", "refused", target=request_target(), reason="unknown or revoked key"
        )
        raise Problem(401, "UNAUTHENTICATED", "the API key is unknown or revoked")
    if charged:
        charge(principal.actor)
    return principal


def charge(actor: str, tokens: int = 1) -> None:
    """Take ``tokens`` from ``actor``'s rate limit, all or none (429 when
    they are not all there)."""
    current_app.extensions["paycron.rate_limiter"].charge(actor, tokens)


def require_key(view=None, *, charged: bool = True):
    """Views under it see ``g.principal``. Place it above ``@bp.arguments``,
    so a request without a key is a 401 whatever else is wrong with it.
    ``charged=False``: the view charges the actor itself (:func:`charge`)
    before it writes anything."""
    if view is None:
        return lambda inner: require_key(inner, charged=charged)

    @wraps(view)
    def wrapper(*args, **kwargs):
        g.principal = _principal(charged=charged)
        return view(*args, **kwargs)

    return Blueprint.doc(
        security=[{BEARER: []}], responses={401: _UNAUTHENTICATED, 429: _RATE_LIMITED}
    )(wrapper)


def require_admin(view):
    """Admin endpoints: a non-admin key gets 404, as if they did not exist."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        g.principal = _principal()
        if not g.principal.is_admin:
            audit("api.forbidden", "refused", target=request_target(), reason="not an admin key")
            raise Problem(404, "NOT_FOUND", "not found")
        return view(*args, **kwargs)

    return Blueprint.doc(
        security=[{BEARER: []}],
        responses={401: _UNAUTHENTICATED, 404: _NOT_ADMIN, 429: _RATE_LIMITED},
    )(wrapper)
