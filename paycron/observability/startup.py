"""What every process does before it serves: settings read, servers reached,
schema current. A person's mistake (an unset or wrong setting, a server that
does not answer) ends the process with one line naming the setting and exit
status 2, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import sentry_sdk

from paycron.config import Config
from paycron.errors import ConfigError
from paycron.store.db import connect, ping_database, ping_redis
from paycron.store.migrate import pending_migrations

#: The exit status of a process stopped by a setting (as a shell's usage error).
EXIT_CONFIG = 2


def report(line: str) -> None:
    """Print ``line`` on stderr and, when Sentry is on (the setting at fault
    may be another), send it there too: a process that cannot start is
    worth knowing about, and it never reaches a log collector."""
    print(line, file=sys.stderr, flush=True)
    if sentry_sdk.get_client().is_active():
        sentry_sdk.capture_message(line, level="error")
        sentry_sdk.flush(timeout=2)


def say_and_exit(component: str, exc: ConfigError) -> None:
    report(f"paycron {component}: {exc}")
    raise SystemExit(EXIT_CONFIG)


@contextmanager
def one_line_errors(component: str) -> Iterator[None]:
    """Within the block, a :class:`ConfigError` (an :class:`Unreachable` too)
    prints ``paycron <component>: <message>`` and exits with status 2."""
    try:
        yield
    except ConfigError as exc:
        say_and_exit(component, exc)


def preflight(config: Config, *, redis: bool = True) -> None:
    """Raise :class:`ConfigError` unless ``DATABASE_URL`` (and ``REDIS_URL``)
    name servers that answer."""
    ping_database(config)
    if redis:
        ping_redis(config)


def schema_pending(config: Config) -> list[str]:
    """The migrations this code expects that the database lacks."""
    with connect(config) as conn:
        return pending_migrations(conn)
