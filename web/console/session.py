"""Console sessions: signed in with an admin API key, kept on the server.

A session is a record in Redis (:class:`SessionStore`: the key's row id and
the sign-in time, under the sha256 of a random session id, expiring with the
session). The cookie (``paycron_console``, path ``/console``, signed with
``CONSOLE_SECRET_KEY`` through Flask's session) holds only that session id,
the sign-in time and the CSRF token; never the key. So:

- signing out deletes the record: a copy of the cookie replayed afterwards
  is nobody's session;
- signing in makes a new session id (and CSRF token) and deletes the one the
  cookie held, so an id planted before sign-in is never signed in;
- on every request the key is read again from its row (no cache): a revoked
  key, or one that is no longer an admin's, ends its sessions at once;
- a session ends ``CONSOLE_SESSION_MINUTES`` after its sign-in whatever is
  done in it (the record's own expiry, and the sign-in time checked).

``HttpOnly``, ``SameSite=Strict``, and ``Secure`` unless the console is
reached on localhost.

CSRF: every form carries the session's token, and every POST without it is
refused (400) before its view runs. A few lines of our own rather than
Flask-WTF: the console has a handful of plain forms and no use for WTForms,
and the token is all CSRFProtect would add here (SameSite=Strict already
keeps the cookie off cross-site requests; the token covers old browsers
and same-site attackers).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from datetime import datetime, timedelta

from flask import Flask, current_app, g, request, session
from flask.sessions import SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer

from paycron.store import apikeys
from paycron.store.apikeys import Principal
from web.audit import audit

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


class SessionStore:
    """Signed-in sessions in Redis, one key each, expiring with the session."""

    def __init__(self, redis, *, namespace: str, minutes: float):
        self._redis = redis
        self._prefix = f"{namespace}:console:session:"
        self._seconds = max(1, int(minutes * 60))

    def _key(self, session_id: str) -> str:
        # Redis holds a digest: reading Redis gives no cookie's session id.
        return self._prefix + hashlib.sha256(session_id.encode()).hexdigest()

    def create(self, key_id: int, signed_in_at: datetime) -> str:
        session_id = secrets.token_urlsafe(32)
        record = {"key_id": key_id, "signed_in_at": signed_in_at.isoformat()}
        self._redis.set(self._key(session_id), json.dumps(record), ex=self._seconds)
        return session_id

    def get(self, session_id: str) -> dict | None:
        raw = self._redis.get(self._key(session_id))
        return json.loads(raw) if raw else None

    def end(self, session_id: str) -> None:
        self._redis.delete(self._key(session_id))


def _store() -> SessionStore:
    return current_app.extensions["paycron.console.sessions"]


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
    """A new session for ``principal`` under a new session id: the session
    the cookie named before (if any) is ended, the CSRF token renewed."""
    previous = session.get("sid")
    if isinstance(previous, str):
        _store().end(previous)
    session.clear()
    now = current_app.extensions["paycron.clock"]()
    session["sid"] = _store().create(principal.key_id, now)
    session["signed_in_at"] = now.isoformat()
    session[CSRF_FIELD] = secrets.token_urlsafe(32)


def sign_out() -> None:
    session_id = session.get("sid")
    if isinstance(session_id, str):
        _store().end(session_id)
    session.clear()


def _live_key(key_id: int) -> Principal | None:
    """The key's row as it is now: the console never trusts a cached key."""
    with current_app.extensions["paycron.pool"].connection() as conn:
        return apikeys.find_by_id(conn, key_id)


def current_operator() -> Principal | None:
    """The signed-in operator, or None: no session, it was signed out or
    expired, or its key was revoked or is no longer an admin's (the session
    is then ended)."""
    session_id = session.get("sid")
    if not isinstance(session_id, str):
        return None
    record = _store().get(session_id)
    if record is None:  # signed out, expired, or signed in again elsewhere
        session.clear()
        return None
    signed_in = datetime.fromisoformat(record["signed_in_at"])
    lifetime = timedelta(minutes=current_app.extensions["paycron.config"].console_session_minutes)
    if current_app.extensions["paycron.clock"]() - signed_in >= lifetime:
        _store().end(session_id)
        session.clear()
        session["expired"] = True
        return None
    principal = _live_key(record["key_id"])
    if principal is None or not principal.is_admin:
        _store().end(session_id)
        session.clear()
        session["ended"] = "revoked"
        audit(
            "console.session_ended",
            "refused",
            principal=principal,
            key_id=record["key_id"],
            reason="the key was revoked or is no longer an admin key",
            channel="console",
        )
        return None
    g.operator = principal
    return principal
