"""Connections: one psycopg pool per process, autocommit by default, and the
process's Redis client.

Multi-statement units of work open ``conn.transaction()`` explicitly; every
single-statement transition runs in autocommit, so a CAS is one round trip.
"""

from __future__ import annotations

import redis
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.errors import ConfigError

#: Every session talks UTC, so timestamptz values come back as aware UTC.
#: Custom plans always: a generic plan of a prepared statement prunes
#: partitions only at run time, after locking every one of them.
_SESSION_OPTIONS = "-c TimeZone=UTC -c plan_cache_mode=force_custom_plan"


def connection_kwargs(*, statement_timeout: float | None = None) -> dict:
    """``statement_timeout`` (seconds; None or 0: none) cancels any statement
    of the session that runs longer. Only the web's pool sets one: the
    sweeper and workers never cancel a statement, least of all a commit
    waiting for a synchronous standby (SPEC §15: a cancelled wait does not
    undo the commit)."""
    options = _SESSION_OPTIONS
    if statement_timeout:
        options += f" -c statement_timeout={max(1, round(statement_timeout * 1000))}"
    return {"autocommit": True, "row_factory": dict_row, "options": options}


def require_database_url(config: Config) -> str:
    if not config.database_url:
        raise ConfigError("DATABASE_URL is not set")
    return config.database_url


def make_pool(config: Config, *, min_size: int = 1, max_size: int | None = None,
              name: str = "paycron", statement_timeout: float | None = None) -> ConnectionPool:
    """An opened pool; the caller closes it (``with make_pool(...) as pool``).
    ``statement_timeout``: see :func:`connection_kwargs` (the web's pool only)."""
    pool = ConnectionPool(
        require_database_url(config),
        min_size=min_size,
        max_size=max_size or config.db_pool_max,
        kwargs=connection_kwargs(statement_timeout=statement_timeout),
        name=name,
        open=False,
        # A dead server must surface as an error quickly, not hang a request.
        timeout=10,
    )
    pool.open(wait=False)
    return pool


def connect(config: Config) -> Connection:
    """One standalone connection (CLI commands, migrations)."""
    return Connection.connect(require_database_url(config), **connection_kwargs())


def make_redis(config: Config, *, timeout: float | None = None) -> redis.Redis:
    """The process's Redis client (broker buffer, pacing, breaker). ``timeout``
    bounds each command (the web's probes must not hang a request)."""
    if not config.redis_url:
        raise ConfigError("REDIS_URL is not set")
    return redis.Redis.from_url(config.redis_url, socket_timeout=timeout,
                                socket_connect_timeout=timeout)
