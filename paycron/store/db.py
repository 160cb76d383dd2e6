"""Connections: a psycopg pool per process (a web worker has two, see
``web.create_app``), autocommit by default, and the process's Redis client.

Multi-statement units of work open ``conn.transaction()`` explicitly; every
single-statement transition runs in autocommit, so a CAS is one round trip.

``DATABASE_URL`` may name several hosts (``postgresql://u@a:5432,b:5432/db``):
libpq tries them in order and, with ``target_session_attrs=read-write`` (the
default here), keeps only the one that accepts writes, so a pool's new
connections find whichever server is primary after a failover. Each pool
checks a connection before handing it out, so the ones that died with the old
primary are replaced, not given to a request (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import re
import select
import sys
import threading
import time
from collections.abc import Iterator
from typing import TypeAlias

import psycopg
import psycopg.waiting
import redis
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import Diagnostic
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.errors import ConfigError, OutcomeUnknown, Unreachable

log = logging.getLogger("paycron.db")

#: Every connection of ours returns rows as dicts (:func:`connection_kwargs`
#: sets the row factory), so this is the type the store's functions take.
Connection: TypeAlias = psycopg.Connection[DictRow]
#: A pool of such connections (:func:`make_pool`).
Pool: TypeAlias = ConnectionPool[Connection]


def one_row(cursor: psycopg.Cursor[DictRow]) -> DictRow:
    """The row of a statement that always returns exactly one (an aggregate,
    an ``INSERT ... RETURNING`` without a conflict clause)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("a statement that always returns one row returned none")
    return row


#: Every session talks UTC, so timestamptz values come back as aware UTC.
#: Custom plans always: a generic plan of a prepared statement prunes
#: partitions only at run time, after locking every one of them.
_SESSION_OPTIONS = "-c TimeZone=UTC -c plan_cache_mode=force_custom_plan"
#: Generic plans always, for a pool whose sessions run only statements that
#: read no partitioned table (the web's create: its inserts route their rows
#: at run time and lock only the partitions they write). Planned again on
#: every execution, the create spent a third of its time in Postgres planning.
_GENERIC_SESSION_OPTIONS = "-c TimeZone=UTC -c plan_cache_mode=force_generic_plan"

#: libpq settings every connection gets unless ``DATABASE_URL`` gives its own:
#: only a server that accepts writes (with several hosts, the primary); a host
#: that does not answer is given up after 3 s per attempt (libpq then tries
#: the next); a connection to a host that vanished without closing it (a dead
#: machine sends no reset) is dropped after about 25 s, whether it was idle,
#: waiting for an answer (keepalives) or sending (tcp_user_timeout). None of
#: them ends a live server's wait for its standby: its kernel answers.
CONNINFO_DEFAULTS = {
    "target_session_attrs": "read-write",
    "connect_timeout": "3",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "25000",
}


def connection_kwargs(
    *,
    statement_timeout: float | None = None,
    database_url: str | None = None,
    generic_plans: bool = False,
) -> dict:
    """``statement_timeout`` (seconds; None or 0: none) cancels any statement
    of the session that runs longer. Only the web's pools set one; every other
    session sets ``statement_timeout=0`` itself, whatever the server's or
    role's default. A statement timeout never covers a commit's wait for the
    synchronous standby (Postgres disables it before committing: measured,
    tests/store/test_failover.py), so the web bounds that wait itself
    (:func:`bounded_write`); the sweeper and workers never cut it (docs/operations.md:
    a cancelled wait does not undo the commit).

    ``database_url``: the DSN these kwargs go with; the keys of
    :data:`CONNINFO_DEFAULTS` it does not set are added. ``generic_plans``:
    see :data:`_GENERIC_SESSION_OPTIONS`."""
    timeout_ms = max(1, round(statement_timeout * 1000)) if statement_timeout else 0
    session = _GENERIC_SESSION_OPTIONS if generic_plans else _SESSION_OPTIONS
    options = f"{session} -c statement_timeout={timeout_ms}"
    kwargs = {"autocommit": True, "row_factory": dict_row, "options": options}
    if database_url is not None:
        given = conninfo_to_dict(database_url)
        kwargs.update({k: v for k, v in CONNINFO_DEFAULTS.items() if k not in given})
    return kwargs


def require_database_url(config: Config) -> str:
    if not config.database_url:
        raise ConfigError("DATABASE_URL is not set")
    return config.database_url


def make_pool(
    config: Config,
    *,
    min_size: int = 1,
    max_size: int | None = None,
    name: str = "paycron",
    statement_timeout: float | None = None,
    generic_plans: bool = False,
) -> Pool:
    """An opened pool; the caller closes it (``with make_pool(...) as pool``).
    ``statement_timeout``: see :func:`connection_kwargs` (the web's pools
    only); so is ``generic_plans`` (the web's create pool only).

    Every connection is checked (one empty round trip) before it is handed
    out: one that died with its server (a failover, a restart) is discarded
    and the pool connects again, to whichever host is primary now. A request
    therefore never gets a dead connection; it waits for a live one for at
    most ``timeout`` (10 s). While no host accepts writes the pool tries again
    after 1 s, then 2 s, and after :data:`RECONNECT_SECONDS` starts over
    (:func:`_reconnect_again`), so a primary promoted after a long outage is
    found within about 2 s, not after a backoff that doubles without limit."""
    cooperate_with_gevent()
    url = require_database_url(config)
    check = _CheckAll()
    pool: Pool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size or config.db_pool_max,
        kwargs=connection_kwargs(
            statement_timeout=statement_timeout, database_url=url, generic_plans=generic_plans
        ),
        name=name,
        open=False,
        check=check,
        reconnect_timeout=RECONNECT_SECONDS,
        reconnect_failed=_reconnect_again,
        # A dead server must surface as an error quickly, not hang a request.
        timeout=10,
    )
    check.pool = pool
    pool.open(wait=False)
    return pool


def cooperate_with_gevent() -> None:
    """Under gevent's monkey-patching (gunicorn's gevent worker), wait on
    Postgres the way the other greenlets can run meanwhile.

    psycopg chooses its wait when first imported, and only sees a patched
    ``select`` if that import came after the patching. gunicorn's master
    imports it before forking the worker that patches, so psycopg keeps its
    C wait, which blocks the whole worker: every request stopped while one
    waited on Postgres, and a wait for a row another greenlet's transaction
    held lasted until the statement timeout. psycopg's own choice for a
    patched process is ``wait_select`` (gevent's ``select``, no fd limit)."""
    global _select_now
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("select"):
        psycopg.waiting.wait = psycopg.waiting.wait_select
        # A zero-timeout select never blocks: the system's own costs no switch
        # to gevent's hub (1-2% of a busy web worker).
        _select_now = monkey.get_original("select", "select")


class _CheckAll:
    """A pool's check of a connection it is about to hand out: one empty
    round trip, unless the connection passed one within the last
    :data:`CHECK_EVERY_SECONDS` and its socket has nothing to read (a server
    that died, or ended the session, has sent its end of the connection, so
    the socket is readable): a busy worker no longer pays a round trip per
    checkout (5% of its time), and a connection that died is still never
    handed out. When the round trip fails, every idle connection is checked at once
    (``pool.check()``: they most likely died with the same server) rather
    than one per attempt of the waiting request, which psycopg_pool spaces
    1, 2, 4 s apart: measured, a worker pool holding its dead connections
    kept a request waiting its whole 10 s after a failover while fresh
    connections to the new primary sat behind them (bench.failover)."""

    def __init__(self):
        self.pool: Pool | None = None
        self._purging = threading.Lock()

    def __call__(self, conn: Connection) -> None:
        now = time.monotonic()
        if now - getattr(conn, "_paycron_checked", -CHECK_EVERY_SECONDS) < CHECK_EVERY_SECONDS:
            if not _readable(conn):
                return
        try:
            ConnectionPool.check_connection(conn)
            conn._paycron_checked = now  # type: ignore[attr-defined]
        except Exception:
            if self.pool is not None and self._purging.acquire(blocking=False):
                try:
                    self.pool.check()
                finally:
                    self._purging.release()
            raise


#: A connection checked by a round trip this recently is only checked for
#: something to read (no round trip).
CHECK_EVERY_SECONDS = 1.0


#: select() for a zero timeout (:func:`cooperate_with_gevent` may replace it).
_select_now = select.select


def _readable(conn: Connection) -> bool:
    """Whether an idle connection's socket has anything to read: between
    statements the server sends nothing unless the session ended (a closed
    socket reads as end of file), so anything is a reason to check."""
    try:
        readable, _, _ = _select_now([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True  # no socket any more: let the round trip fail
    return bool(readable)


#: How long one reconnection of a pool's slot backs off (attempts 0, 1, 3 and 4 s
#: after the first failure) before it starts over.
RECONNECT_SECONDS = 4.0


def _reconnect_again(pool: Pool) -> None:
    """psycopg_pool gives a slot up after ``reconnect_timeout``; ask for a new
    connection at once (``check`` grows a pool that lacks one), whose own
    attempts start again at no delay. Measured: with the library's unbounded
    backoff a primary promoted 8 s after the kill was reached by the workers
    9 s after the promotion (bench.failover --promote-after 8)."""
    with contextlib.suppress(Exception):  # the pool may be closing
        pool.check()


def connect(config: Config) -> Connection:
    """One standalone connection (CLI commands, migrations). A server that
    does not answer, or a ``DATABASE_URL`` libpq cannot read, raises
    :class:`Unreachable` naming the setting."""
    url = require_database_url(config)
    try:
        return psycopg.Connection.connect(url, **connection_kwargs(database_url=url))
    except psycopg.Error as exc:
        raise Unreachable(f"DATABASE_URL ({where(url)}): {first_line(exc)}") from None


def where(url: str) -> str:
    """``url``'s hosts, ports and database, never its user or password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "unreadable"
    host = parts.get("host") or "local socket"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{host}{port}/{parts.get('dbname', '')}"


def first_line(exc: BaseException) -> str:
    """An error's first line, without the password a DSN error may quote."""
    text = str(exc).strip().split("\n", 1)[0] or type(exc).__name__
    return re.sub(r"(password=|://[^:/@]*:)[^@\s]*", r"\1***", text)


def ping_database(config: Config) -> None:
    """One round trip to ``DATABASE_URL``'s server, or :class:`Unreachable`."""
    with connect(config) as conn:
        conn.execute("SELECT 1")


def ping_redis(config: Config) -> None:
    """One PING to ``REDIS_URL``'s server, or :class:`Unreachable` naming it."""
    client = make_redis(config, timeout=3)
    try:
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        host = client.connection_pool.connection_kwargs.get("host", "unix socket")
        port = client.connection_pool.connection_kwargs.get("port", "")
        raise Unreachable(f"REDIS_URL ({host}:{port}): {first_line(exc)}") from None
    finally:
        client.close()


# -- a bounded wait for the synchronous standby ------------------------------------


@contextlib.contextmanager
def bounded_write(conn: Connection, seconds: float | None) -> Iterator[None]:
    """Run the block's statements (autocommit writes) for at most ``seconds``,
    their commits' wait for the synchronous standby included, and raise
    :class:`OutcomeUnknown` when what they wrote may or may not stand.

    Past ``seconds`` a running statement is cancelled. Before its commit that
    is an error (``QueryCanceled``) and nothing was written. In its commit's
    wait for the standby, Postgres has already committed locally: it warns
    ("canceling wait for synchronous replication ... already committed
    locally") and answers success, and the write becomes visible though only
    one server holds it. Any warning during the block, or a connection lost
    mid-statement (its commit may have happened), raises
    :class:`OutcomeUnknown` here. A connection that was sent a cancel is
    closed on the way out, so its pool never reuses it (a cancel that arrives
    late would cut that connection's next statement). ``seconds`` None or 0:
    no bound."""
    warnings: list[str] = []

    def on_notice(diagnostic: Diagnostic) -> None:
        if diagnostic.severity_nonlocalized == "WARNING":
            warnings.append(diagnostic.message_primary or "")

    conn.add_notice_handler(on_notice)
    watch = _watchdog().watch(conn, seconds) if seconds else None
    try:
        yield
    except psycopg.Error as exc:
        if conn.broken:
            log.warning("connection lost mid-write: %s", type(exc).__name__)
            raise OutcomeUnknown(
                "the database connection was lost before it answered: this "
                "may or may not have taken effect; retry with the same "
                "Idempotency-Key"
            ) from exc
        raise
    finally:
        cancelled = watch.stop() if watch else False
        conn.remove_notice_handler(on_notice)
        if cancelled:
            conn.close()
    if warnings:
        log.warning("a write's commit is on the primary alone: %s", warnings[0])
        raise OutcomeUnknown(
            "the database could not confirm this in time (its standby did "
            "not answer): it may or may not have taken effect; retry with "
            "the same Idempotency-Key"
        )


class _Watch:
    def __init__(self, conn: Connection, deadline: float):
        self.conn, self.deadline = conn, deadline
        self.lock = threading.Lock()
        self.done = self.fired = False

    def fire(self) -> None:
        with self.lock:
            if self.done:
                return
            self.fired = True
            with contextlib.suppress(Exception):  # the connection may be gone already
                self.conn.cancel_safe(timeout=5)

    def stop(self) -> bool:
        """The block is over: no cancel from now on. Whether one was sent."""
        with self.lock:
            self.done = True
            return self.fired


class _Watchdog:
    """One thread per process cancels what outlived its deadline (a thread
    per request would cost the create path more than it guards)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()

    def start(self) -> None:
        threading.Thread(target=self._run, name="paycron-watchdog", daemon=True).start()

    def watch(self, conn: Connection, seconds: float) -> _Watch:
        watch = _Watch(conn, time.monotonic() + seconds)
        with self._cond:
            heapq.heappush(self._heap, (watch.deadline, next(self._seq), watch))
            if self._heap[0][2] is watch:
                self._cond.notify()
        return watch

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, watch = self._heap[0]
                if not watch.done and deadline > time.monotonic():
                    self._cond.wait(deadline - time.monotonic())
                    continue
                heapq.heappop(self._heap)
            if not watch.done:
                watch.fire()


_watchdogs: dict[int, _Watchdog] = {}


def _watchdog() -> _Watchdog:
    """This process's watchdog (a forked child starts its own).

    No lock: a module-level lock is made when gunicorn's master imports this
    module, before its gevent worker patches ``threading``, so it stays a
    real lock; held across the thread's start (where a greenlet yields), a
    second request's wait for it blocked the whole worker. The dict's
    ``setdefault`` is atomic, and only the watchdog it keeps is started."""
    pid = os.getpid()
    watchdog = _watchdogs.get(pid)
    if watchdog is None:
        made = _Watchdog()
        watchdog = _watchdogs.setdefault(pid, made)
        if watchdog is made:
            made.start()
    return watchdog


def make_redis(config: Config, *, timeout: float | None = None) -> redis.Redis:
    """The process's Redis client (broker buffer, pacing, breaker). ``timeout``
    bounds each command (the web's probes must not hang a request)."""
    if not config.redis_url:
        raise ConfigError("REDIS_URL is not set")
    try:
        return redis.Redis.from_url(
            config.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    except ValueError as exc:  # not a redis:// URL
        raise ConfigError(f"REDIS_URL: {exc}") from None
