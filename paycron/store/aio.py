"""The async executor's store (``EXECUTOR=asyncio``): its Redis client, an async psycopg pool
made and checked as :func:`paycron.store.db.make_pool` makes its pool, and
the executor's two statements (start, finish) with the very text
and parameters of paycron/store/transitions.py. A connection is held for
one statement (finish: two), never across a processor call.

What is rare stays on the blocking side (the executor runs it on a
thread: a release while the breaker is open, lookups): a finish whose answer Postgres
cannot store, or that deadlocks with a reap, changed nothing (its statement
failed whole) and is handed to :func:`paycron.store.transitions.finish` on
a thread, which writes it one by one as it always does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TypeAlias

import psycopg
import redis.asyncio
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from paycron.config import Config
from paycron.errors import ConfigError
from paycron.sql import q
from paycron.store import transitions
from paycron.store.db import (
    CHECK_EVERY_SECONDS,
    RECONNECT_SECONDS,
    Pool,
    _readable,
    connection_kwargs,
    require_database_url,
)
from paycron.store.transitions import Claim, Finished

AsyncConnection: TypeAlias = psycopg.AsyncConnection[DictRow]
AsyncPool: TypeAlias = AsyncConnectionPool[AsyncConnection]


#: Redis connections of one worker's loop at most (the breaker and the call
#: window: a few commands per group); a command waits for one rather than
#: opening another.
REDIS_CONNECTIONS = 8


def async_redis(config: Config) -> redis.asyncio.Redis:
    """The loop's Redis client: its sockets bounded by REDIS_CONNECTIONS."""
    if not config.redis_url:
        raise ConfigError("REDIS_URL is not set")
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        config.redis_url, max_connections=REDIS_CONNECTIONS, timeout=10
    )
    return redis.asyncio.Redis(connection_pool=pool)


async def make_async_pool(config: Config, *, max_size: int, name: str) -> AsyncPool:
    """An opened async pool (call on the loop that will use it); the caller closes it."""
    url = require_database_url(config)
    check = _AsyncCheck()
    pool: AsyncPool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs=connection_kwargs(database_url=url),
        name=name,
        open=False,
        check=check,
        reconnect_timeout=RECONNECT_SECONDS,
        timeout=10,
    )
    check.pool = pool
    await pool.open(wait=False)
    return pool


class _AsyncCheck:
    """:class:`paycron.store.db._CheckAll` for an async pool: a round trip
    only for a connection not checked within CHECK_EVERY_SECONDS or whose
    socket has something to read; a failed one checks every idle connection."""

    def __init__(self) -> None:
        self.pool: AsyncPool | None = None
        self._purging = False

    async def __call__(self, conn: AsyncConnection) -> None:
        now = time.monotonic()
        if now - getattr(conn, "_paycron_checked", -CHECK_EVERY_SECONDS) < CHECK_EVERY_SECONDS:
            if not _readable(conn):  # type: ignore[arg-type]
                return
        try:
            await AsyncConnectionPool.check_connection(conn)
            conn._paycron_checked = now  # type: ignore[attr-defined]
        except Exception:
            if self.pool is not None and not self._purging:
                self._purging = True
                try:
                    await self.pool.check()
                finally:
                    self._purging = False
            raise


async def start(
    pool: AsyncPool, claims: Sequence[Claim], *, lease_seconds: float, processor: str
) -> list[dict]:
    """:func:`paycron.store.transitions.start`: fence, renew each lease and
    write IN_FLIGHT, committed before any call."""
    params = transitions.start_params(
        claims, lease_seconds=lease_seconds, processor=processor, worker=None
    )
    async with pool.connection() as conn:
        cursor = await conn.execute(q("start_attempts"), params, prepare=True)
        return await cursor.fetchall()


async def finish(
    pool: AsyncPool,
    done: Sequence[Finished],
    *,
    fallback: Pool,
    land_seconds: float,
    poll_seconds: float,
) -> list[dict]:
    """:func:`paycron.store.transitions.finish`: every outcome recorded and
    every payment CAS'd in one statement; late successes in a second.
    ``fallback``: the blocking pool of the rare paths."""
    if not done:
        return []
    params = transitions.finish_params(done, land_seconds, poll_seconds)
    try:
        async with pool.connection() as conn:
            cursor = await conn.execute(q("finish_attempts"), params, prepare=True)
            rows = await cursor.fetchall()
            late = transitions.late_successes(done, rows)
            if late:
                cursor = await conn.execute(
                    q("complete_late_success"), transitions.late_params(late)
                )
                transitions.log_late(await cursor.fetchall())
    except (*transitions._UNWRITABLE_ERRORS, psycopg.errors.DeadlockDetected):
        # The statement failed whole: the blocking path writes it as it always does.
        return await asyncio.to_thread(
            transitions.finish,
            fallback,
            done,
            land_seconds=land_seconds,
            poll_seconds=poll_seconds,
        )
    transitions.log_finished(done, rows)
    return rows
