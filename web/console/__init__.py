"""The operator console at ``/console/`` (docs/operations.md): server-rendered pages
(Jinja) over the engine's own reads and the dead-letter tools.

Served by the web process only when ``CONSOLE_SECRET_KEY`` is set. Every
page but the sign-in page needs a session (``web.console.session``); every
action that moves money is a plain form with a confirmation step, so the
console works without JavaScript (the History page's live refresh is its
only script, and optional).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import Blueprint, Flask, render_template, request
from markupsafe import Markup, escape

from paycron.domain.money import major_units
from paycron.limits.breaker import CircuitBreaker
from web.console import reads
from web.console.session import (
    ConsoleRefused,
    ConsoleSessionInterface,
    SessionStore,
    csrf_token,
)

bp = Blueprint(
    "console", __name__, url_prefix="/console", template_folder="templates", static_folder="static"
)


def money(amount_minor: int | None, currency: str | None) -> Markup:
    """An amount as people read it, in major units with its currency's
    decimals (``500.03 USD``, ``500 JPY``, ``5.120 BHD``); the stored minor
    units on hover (the title), as the API and the database have them."""
    if amount_minor is None or not currency:
        return Markup("—")
    return Markup('<span class="money" title="{} minor units">{} {}</span>').format(
        amount_minor, major_units(amount_minor, currency), escape(currency)
    )


def utc(value: datetime | None) -> str:
    """A time as operators read it: UTC, to the second, with its offset."""
    if value is None:
        return "—"
    return value.astimezone(UTC).replace(microsecond=0).isoformat(sep=" ")


def age(value: float | timedelta | None) -> str:
    """A duration in its two largest units: ``3h 20m``, ``45s``."""
    if value is None:
        return "—"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    if seconds < 0:
        return f"in {age(-seconds)}"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


@bp.errorhandler(ConsoleRefused)
def _refused(error: ConsoleRefused):
    return render_template(
        "console/error.html", status=error.status, message=error.message
    ), error.status


def install(app: Flask, *, breaker: CircuitBreaker) -> None:
    """Serve the console when the config has a CONSOLE_SECRET_KEY."""
    config = app.extensions["paycron.config"]
    if not config.console_secret_key:
        return
    # Their routes join bp as they are imported.
    from web.console import actions, bulk, deliveries, export, history, views  # noqa: F401

    app.session_interface = ConsoleSessionInterface(
        config.console_secret_key, minutes=config.console_session_minutes
    )
    app.extensions["paycron.console.sessions"] = SessionStore(
        app.extensions["paycron.redis"],
        namespace=config.redis_namespace,
        minutes=config.console_session_minutes,
    )
    app.permanent_session_lifetime = timedelta(minutes=config.console_session_minutes)
    app.jinja_env.filters.update(utc=utc, age=age)
    app.jinja_env.globals.update(csrf_token=csrf_token, money=money)
    pool = app.extensions["paycron.pool"]
    clock = app.extensions["paycron.clock"]

    def read():
        with pool.connection() as conn:
            return reads.read_overview(
                conn, now=clock(), circuit=lambda: breaker.state().value, processor=config.gateway
            )

    app.extensions["paycron.console.overview"] = reads.Cached(
        read, ttl=config.console_cache_seconds
    )
    app.register_blueprint(bp)


def page_cursor() -> str | None:
    return request.args.get("cursor") or None
