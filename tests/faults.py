"""Deterministic fault injection at statement boundaries, for Postgres and Redis.

A :class:`Injector` names every boundary the engine crosses as it runs: each
statement it sends to Postgres (by the name of its SQL block in
``paycron/store/sql``), before it is sent and after it ran; each commit of an
explicit transaction, before it is sent and after it took effect (its
answer lost); and each command it sends to Redis, before and after it ran.
A :class:`Fault` picks one boundary (``name``, ``phase``, the how-many-th
time it is crossed) and the injector makes the engine fail there exactly as
a dropped connection does: Postgres connections raise
``psycopg.OperationalError`` and are closed (the pool discards them);
Redis connections raise ``redis.ConnectionError`` and disconnect. "After"
means the server did the work: a statement in autocommit committed, a
transaction's COMMIT took effect, a Redis command ran (and redis-py may send
it again: that is what a client with retries does).

:class:`FaultPool` wraps a psycopg pool so every connection it hands out
reports to the injector; :func:`faulty_redis` builds a Redis client whose
connections do. :class:`AsyncFaultPool` and :func:`faulty_async_redis` are
the same for the async executor's psycopg pool and ``redis.asyncio`` client
(``EXECUTOR=asyncio``). Nothing else changes: the engine's own code runs
unmodified.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import redis
import redis.asyncio

from paycron.sql import queries

BEFORE, AFTER = "before", "after"


@dataclass(frozen=True)
class Fault:
    """Fail at the ``occurrence``-th crossing of boundary (``name``, ``phase``);
    ``always``: at that one and every later one (a crash loop)."""

    name: str
    phase: str
    occurrence: int = 1
    always: bool = False

    def __str__(self) -> str:
        kind = "always" if self.always else "once"
        return f"{kind}:{self.name}:{self.phase}:{self.occurrence}"

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, name, phase, occurrence = text.split(":")
        return cls(name, phase, int(occurrence), always=kind == "always")


class InjectedFault(Exception):
    """Marks an exception as the injector's own (for reports)."""


@dataclass
class Injector:
    """Counts boundary crossings and fails at the chosen one."""

    fault: Fault | None = None
    trace: list[tuple[str, str, int]] = field(default_factory=list)
    crossed: Counter = field(default_factory=Counter)
    fired: int = 0
    enabled: bool = True
    #: Crossings may come from several threads at once (the async executor's
    #: rare paths run on threads beside its loop): each is counted whole.
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def cross(self, name: str, phase: str) -> bool:
        """Record a crossing; True when the fault fires here."""
        if not self.enabled:
            return False
        with self.lock:
            self.crossed[(name, phase)] += 1
            n = self.crossed[(name, phase)]
            self.trace.append((name, phase, n))
            fault = self.fault
            if fault is None or (fault.name, fault.phase) != (name, phase):
                return False
            if n == fault.occurrence or (fault.always and n > fault.occurrence):
                self.fired += 1
                return True
            return False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The harness's own statements (checks, time moving) cross nothing."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled


_NAMES: dict[str, str] = {}


def statement_name(query) -> str:
    """The SQL block a statement comes from; ``sql`` for any other text."""
    if not _NAMES:
        _NAMES.update({" ".join(text.split()): name for name, text in queries().items()})
    text = query if isinstance(query, str) else str(query)
    return _NAMES.get(" ".join(text.split()), "sql")


def _drop(conn: psycopg.Connection, what: str) -> psycopg.OperationalError:
    conn.close()
    return psycopg.OperationalError(f"server closed the connection unexpectedly ({what})")


class FaultConnection:
    """A psycopg connection that reports each statement and commit."""

    def __init__(self, conn: psycopg.Connection, injector: Injector):
        self._conn = conn
        self._injector = injector
        self._last = "sql"

    def execute(self, query, params=None, **kwargs):
        name = statement_name(query)
        self._last = name
        if self._injector.cross(name, BEFORE):
            raise _drop(self._conn, f"injected before {name}")
        cursor = self._conn.execute(query, params, **kwargs)
        if self._injector.cross(name, AFTER):
            raise _drop(self._conn, f"injected after {name} ran")
        return cursor

    @contextlib.contextmanager
    def transaction(self, *args, **kwargs):
        with self._conn.transaction(*args, **kwargs):
            yield self
            name = f"commit:{self._last}"
            if self._injector.cross(name, BEFORE):
                raise _drop(self._conn, f"injected before {name}")
        if self._injector.cross(f"commit:{self._last}", AFTER):
            # COMMIT sent and done; its answer never arrives.
            raise _drop(self._conn, f"injected after commit:{self._last}")

    def __getattr__(self, name):
        return getattr(self._conn, name)


class FaultPool:
    """A psycopg pool whose connections report to ``injector``."""

    def __init__(self, pool, injector: Injector):
        self._pool = pool
        self._injector = injector

    @contextlib.contextmanager
    def connection(self, *args, **kwargs):
        with self._pool.connection(*args, **kwargs) as conn:
            yield FaultConnection(conn, self._injector)

    def __getattr__(self, name):
        return getattr(self._pool, name)


class _FaultRedisConnection(redis.Connection):
    """A Redis connection that reports each command, before it is sent and
    after it ran (its reply then lost)."""

    injector: Injector  # set on the subclass faulty_redis makes

    def send_command(self, *args, **kwargs):
        self._command = f"redis:{str(args[0]).lower()}"
        if self._command.startswith("redis:script"):
            # SCRIPT LOAD fills Redis's script cache, which every client of
            # the server shares: whether it is sent at all depends on what
            # other processes loaded before, so a schedule found in one run
            # might never cross it in the next. A failure there is the
            # EVALSHA's failure before it ran, which the schedules cover.
            self._sent_by_command = True
            return super().send_command(*args, **kwargs)
        if self.injector.cross(self._command, BEFORE):
            self.disconnect()
            raise redis.ConnectionError(f"injected before {self._command}")
        self._sent_by_command = True
        return super().send_command(*args, **kwargs)

    def send_packed_command(self, command, check_health=True):
        if not getattr(self, "_sent_by_command", False):
            self._command = "redis:pipeline"
            if self.injector.cross(self._command, BEFORE):
                self.disconnect()
                raise redis.ConnectionError(f"injected before {self._command}")
        self._sent_by_command = False
        return super().send_packed_command(command, check_health)

    def read_response(self, *args, **kwargs):
        response = super().read_response(*args, **kwargs)
        command = getattr(self, "_command", "redis:?")
        if not command.startswith("redis:script") and self.injector.cross(command, AFTER):
            self.disconnect()
            raise redis.ConnectionError(f"injected after {self._command} ran")
        return response


def faulty_redis(url: str, injector: Injector) -> redis.Redis:
    """A Redis client (redis-py's defaults, retries included) whose
    connections report to ``injector``."""
    connection_class = type(
        "FaultRedisConnection", (_FaultRedisConnection,), {"injector": injector}
    )
    pool = redis.ConnectionPool.from_url(url, connection_class=connection_class)
    return redis.Redis(connection_pool=pool)


# -- the async executor's clients (EXECUTOR=asyncio) -------------------------------------


async def _adrop(conn: psycopg.AsyncConnection, what: str) -> psycopg.OperationalError:
    await conn.close()
    return psycopg.OperationalError(f"server closed the connection unexpectedly ({what})")


class AsyncFaultConnection:
    """:class:`FaultConnection` for an async psycopg connection (its
    statements; the async executor runs no explicit transaction)."""

    def __init__(self, conn: psycopg.AsyncConnection, injector: Injector):
        self._conn = conn
        self._injector = injector

    async def execute(self, query, params=None, **kwargs):
        name = statement_name(query)
        if self._injector.cross(name, BEFORE):
            raise await _adrop(self._conn, f"injected before {name}")
        cursor = await self._conn.execute(query, params, **kwargs)
        if self._injector.cross(name, AFTER):
            raise await _adrop(self._conn, f"injected after {name} ran")
        return cursor

    def transaction(self, *args, **kwargs):
        raise NotImplementedError("the async executor runs no explicit transaction")

    def __getattr__(self, name):
        return getattr(self._conn, name)


class AsyncFaultPool:
    """An async psycopg pool whose connections report to ``injector`` (a
    connection the injector closed is discarded when it is given back)."""

    def __init__(self, pool, injector: Injector):
        self._pool = pool
        self._injector = injector

    @contextlib.asynccontextmanager
    async def connection(self, *args, **kwargs):
        async with self._pool.connection(*args, **kwargs) as conn:
            yield AsyncFaultConnection(conn, self._injector)

    def __getattr__(self, name):
        return getattr(self._pool, name)


class _AsyncFaultRedisConnection(redis.asyncio.Connection):
    """:class:`_FaultRedisConnection` for ``redis.asyncio``."""

    injector: Injector  # set on the subclass faulty_async_redis makes

    async def send_command(self, *args, **kwargs):
        self._command = f"redis:{str(args[0]).lower()}"
        if self._command.startswith("redis:script"):
            self._sent_by_command = True  # as the blocking client's: not a boundary
            return await super().send_command(*args, **kwargs)
        if self.injector.cross(self._command, BEFORE):
            await self.disconnect()
            raise redis.ConnectionError(f"injected before {self._command}")
        self._sent_by_command = True
        return await super().send_command(*args, **kwargs)

    async def send_packed_command(self, command, check_health=True):
        if not getattr(self, "_sent_by_command", False):
            self._command = "redis:pipeline"
            if self.injector.cross(self._command, BEFORE):
                await self.disconnect()
                raise redis.ConnectionError(f"injected before {self._command}")
        self._sent_by_command = False
        return await super().send_packed_command(command, check_health)

    async def read_response(self, *args, **kwargs):
        response = await super().read_response(*args, **kwargs)
        command = getattr(self, "_command", "redis:?")
        if not command.startswith("redis:script") and self.injector.cross(command, AFTER):
            await self.disconnect()
            raise redis.ConnectionError(f"injected after {self._command} ran")
        return response


def faulty_async_redis(url: str, injector: Injector) -> redis.asyncio.Redis:
    """:func:`faulty_redis` for the async executor (call on its loop)."""
    connection_class = type(
        "AsyncFaultRedisConnection", (_AsyncFaultRedisConnection,), {"injector": injector}
    )
    pool = redis.asyncio.ConnectionPool.from_url(url, connection_class=connection_class)
    return redis.asyncio.Redis(connection_pool=pool)
