"""``python -m gateway.fake [--host 127.0.0.1] [--port 9090]
[--key-retention-seconds 86400] [--seed N] [--stripe-api-key sk_test_…]
[--stripe-webhook-url URL]… [--stripe-webhook-secret whsec_…]…
[--stripe-settle-seconds 5] [--stripe-search-lag-seconds 60]``: serve the
fake gateway (its card surface, and the Stripe-shaped one under ``/stripe``)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

from gateway.fake.app import make_app
from gateway.fake.keys import DEFAULT_KEY_RETENTION_SECONDS
from gateway.fake.stripe_settings import (
    DEFAULT_API_KEY,
    DEFAULT_SEARCH_LAG_MS,
    DEFAULT_SETTLE_DELAY_MS,
    DEFAULT_WEBHOOK_SECRET,
    StripeSettings,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9090
#: In-flight handlers get this long to finish at shutdown; a sleeping
#: "timeout" handler must not hold the process for 30 s.
SHUTDOWN_TIMEOUT_SECONDS = 1.0
#: Pending connections the listening socket queues: a burst of engine workers
#: connecting at once must not see refusals (aiohttp's default is 128).
LISTEN_BACKLOG = 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of `python -m gateway.fake`."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.fake", description="Serve the fake card processor."
    )
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--key-retention-seconds",
        type=float,
        default=DEFAULT_KEY_RETENTION_SECONDS,
        help="how long an idempotency key's answer is remembered (default: one day)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault dice")
    stripe = parser.add_argument_group("the Stripe surface")
    stripe.add_argument(
        "--stripe-api-key",
        default=DEFAULT_API_KEY,
        help=f"the secret key requests must present (default: {DEFAULT_API_KEY})",
    )
    stripe.add_argument(
        "--stripe-webhook-url",
        action="append",
        default=[],
        help="an endpoint events are POSTed to (repeat for more)",
    )
    stripe.add_argument(
        "--stripe-webhook-secret",
        action="append",
        default=[],
        help="a whsec_ secret events are signed with (repeat to roll one; "
        f"default: {DEFAULT_WEBHOOK_SECRET})",
    )
    stripe.add_argument(
        "--stripe-settle-seconds",
        type=float,
        default=DEFAULT_SETTLE_DELAY_MS / 1000,
        help="how long a bank debit stays processing",
    )
    stripe.add_argument(
        "--stripe-search-lag-seconds",
        type=float,
        default=DEFAULT_SEARCH_LAG_MS / 1000,
        help="how far the search index lags behind",
    )
    args = parser.parse_args(argv)
    if args.key_retention_seconds <= 0:
        parser.error("--key-retention-seconds must be positive")
    if not args.stripe_api_key.startswith(("sk_test_", "sk_live_")):
        parser.error("--stripe-api-key must be a secret key (sk_test_… or sk_live_…)")
    if args.stripe_settle_seconds < 0 or args.stripe_search_lag_seconds < 0:
        parser.error("--stripe-settle-seconds and --stripe-search-lag-seconds must be >= 0")
    return args


def stripe_settings(args: argparse.Namespace) -> StripeSettings:
    """The Stripe surface's initial settings (what `/_reset` returns to)."""
    return StripeSettings(
        api_key=args.stripe_api_key,
        webhook_urls=tuple(args.stripe_webhook_url),
        webhook_secrets=tuple(args.stripe_webhook_secret) or (DEFAULT_WEBHOOK_SECRET,),
        settle_delay_ms=round(args.stripe_settle_seconds * 1000),
        search_lag_ms=round(args.stripe_search_lag_seconds * 1000),
    )


def _announce(message: str) -> None:
    """Where aiohttp's start-up banner goes: stderr, so stdout stays quiet."""
    print(message, file=sys.stderr, flush=True)


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (about a quarter less CPU per request)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str] | None = None) -> None:
    """Serve the fake gateway until SIGINT/SIGTERM (no access log: it is on the hot path)."""
    args = parse_args(argv)
    web.run_app(
        make_app(args.key_retention_seconds, seed=args.seed, stripe=stripe_settings(args)),
        host=args.host,
        port=args.port,
        access_log=None,
        print=_announce,
        shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
        backlog=LISTEN_BACKLOG,
        loop=_event_loop(),
    )


if __name__ == "__main__":
    main()
