"""``python -m gateway.fake [--host 127.0.0.1] [--port 9090]
[--key-retention-seconds 86400] [--seed N]``: serve the fake gateway."""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

from gateway.fake.app import make_app
from gateway.fake.keys import DEFAULT_KEY_RETENTION_SECONDS

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
        "--key-retention-seconds", type=float, default=DEFAULT_KEY_RETENTION_SECONDS,
        help="how long an idempotency key's answer is remembered (default: one day)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault dice")
    args = parser.parse_args(argv)
    if args.key_retention_seconds <= 0:
        parser.error("--key-retention-seconds must be positive")
    return args


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
        make_app(args.key_retention_seconds, seed=args.seed),
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
