"""Console sessions: signed in with an admin API key, kept in a signed cookie.

The cookie (``paycron_console``, path ``/console``) holds the key's row id,
the operator's sign-in time and a CSRF token, signed with
``CONSOLE_SECRET_KEY`` (itsdangerous, through Flask's session); never the
key. On every request the key id is checked through the API's own
:class:`paycron.store.apikeys.PrincipalCache`, so a revoked key ends its sessions
as soon as it stops working on the API (``API_KEY_CACHE_SECONDS``), and a
session ends ``CONSOLE_SESSION_MINUTES`` after its sign-in whatever is done
in it. ``HttpOnly``, ``SameSite=Strict``, and ``Secure`` unless the console
is reached on localhost.

CSRF: every form carries the session's token, and every POST without it is
refused (400) before its view runs. A few lines of our own rather than
Flask-WTF: the console has a handful of plain forms and no use for WTForms,
and the token is all CSRFProtect would add here (SameSite=Strict already
keeps the cookie off cross-site requests; the token covers old browsers
and same-site attackers).
"""

from __future__ import annotations

import hmac
import secrets
from datetime import datetime, timedelta

from flask import Flask, current_app, g, request, session
from flask.sessions import SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer

from paycron.store.apikeys import Principal

PREFIX = "/console"
COOKIE = "paycron_console"
CSRF_FIELD = "csrf_token"
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


class ConsoleRefused(Exception):
    """A console request refused with a page of its own (not problem+json)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _host_name(host: str) -> str:
    if host.startswith("["):  # [::1]:8000
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class ConsoleSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie session, only under ``/console`` and signed
    with the console's own key: the API never opens or sets a session."""

    salt = "paycron-console-session"

    def __init__(self, secret_key: str, *, minutes: float):
        self._secret_key = secret_key
        self._lifetime = timedelta(minutes=minutes)

    def get_signing_serializer(self, app: Flask):
        return URLSafeTimedSerializer(
            self._secret_key,
            salt=self.salt,
            serializer=self.serializer,
            signer_kwargs={
                "key_derivation": self.key_derivation,
                "digest_method": self.digest_method,
            },
        )

    def open_session(self, app, request):
        if not request.path.startswith(PREFIX):
            return None  # a null session: nothing read, nothing written
        found = super().open_session(app, request)
        if found is not None and found.get("signed_in_at") is not None:
            # a cookie past its lifetime is nobody's session, whatever it says
            signed_in = datetime.fromisoformat(found["signed_in_at"])
            if app.extensions["paycron.clock"]() - signed_in >= self._lifetime:
                found.clear()
                found["expired"] = True
        return found

    def get_cookie_name(self, app):
        return COOKIE

    def get_cookie_path(self, app):
        return PREFIX

    def get_cookie_httponly(self, app):
        return True

    def get_cookie_samesite(self, app):
        return "Strict"

    def get_cookie_secure(self, app):
        return _host_name(request.host) not in _LOCAL_HOSTS

    def get_expiration_time(self, app, session):
        # The browser forgets it when the session would end anyway; the
        # server checks the sign-in time itself (open_session).
        signed_in = session.get("signed_in_at")
        return datetime.fromisoformat(signed_in) + self._lifetime if signed_in else None


def csrf_token() -> str:
    """The session's CSRF token, made on first use (the sign-in page too)."""
    if CSRF_FIELD not in session:
        session[CSRF_FIELD] = secrets.token_urlsafe(32)
    return session[CSRF_FIELD]


def check_csrf() -> None:
    expected = session.get(CSRF_FIELD)
    presented = request.form.get(CSRF_FIELD, "")
    if not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise ConsoleRefused(
            400,
            "This form had no valid CSRF token (it may have been "
            "open too long, or sent from elsewhere). Reload the page "
            "and try again.",
        )


def sign_in(principal: Principal) -> None:
    """A new session for ``principal``: whatever the cookie held before is
    dropped, the CSRF token renewed."""
    session.clear()
    session["key_id"] = principal.key_id
    session["signed_in_at"] = current_app.extensions["paycron.clock"]().isoformat()
    session[CSRF_FIELD] = secrets.token_urlsafe(32)


def sign_out() -> None:
    session.clear()


def current_operator() -> Principal | None:
    """The signed-in operator, or None: no session, it expired, or its key
    was revoked or is no longer an admin's (the session is then ended)."""
    key_id = session.get("key_id")
    if key_id is None:
        return None
    principal = current_app.extensions["paycron.principals"].by_id(
        current_app.extensions["paycron.pool"], key_id
    )
    if principal is None or not principal.is_admin:
        session.clear()
        session["ended"] = "revoked"
        return None
    g.operator = principal
    return principal
