"""A wall-clock deadline for a whole HTTP exchange over urllib3.

urllib3's timeouts bound each socket operation, not the exchange: its read
timeout applies to every ``recv`` afresh, and ``Timeout(total=…)`` only caps
the read timeout computed once the request is sent. A server that trickles
its answer (a byte every quarter second) keeps a ``total=2`` call alive for
as long as it likes — measured here, 13.5 s. A processor call that outlives
its timeout can land after its lease, and a trickling webhook receiver holds
a relay thread.

:func:`deadline` bounds everything a thread does with connections of a
:func:`pool_manager` inside the block — connect, send, the status line, the
headers and the body — by one monotonic deadline. When it passes, a watchdog
thread shuts the connection's socket down: the blocked read fails at once,
urllib3 discards the connection, and the block raises
:class:`DeadlineExceeded`, an urllib3 ``TimeoutError`` (the request may have
been sent: a charge past its deadline is in doubt).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class DeadlineExceeded(urllib3.exceptions.TimeoutError):
    """The exchange passed its deadline and its connection was cut."""


class Exchange:
    """One deadline and the connections used under it (one thread's)."""

    def __init__(self, at: float):
        self.at = at
        self.fired = False
        self.done = False
        self._connections: list[HTTPConnection] = []
        self._lock = threading.Lock()

    def attach(self, connection: HTTPConnection) -> None:
        with self._lock:
            if connection not in self._connections:
                self._connections.append(connection)
            fired = self.fired
        if fired:
            _shut(connection)
            raise DeadlineExceeded("the exchange's deadline passed")

    def detach(self, connection: HTTPConnection) -> None:
        """A connection back in its pool is no longer this exchange's to cut."""
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)

    def fire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.fired = True
            connections = list(self._connections)
        for connection in connections:
            _shut(connection)

    def finish(self) -> None:
        with self._lock:
            self.done = True


def _shut(connection: HTTPConnection) -> None:
    """Shut the socket down under whoever is blocked on it (the plain socket's
    shutdown, under TLS too: the TLS object is left to its reader)."""
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One daemon thread per process firing exchanges whose deadline passed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._heap: list[tuple[float, int, Exchange]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._pid: int | None = None

    def arm(self, exchange: Exchange) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use, or a fork: a thread of our own
                self._pid = os.getpid()
                self._heap = []
                threading.Thread(target=self._run, name="http-deadlines", daemon=True).start()
            heapq.heappush(self._heap, (exchange.at, next(self._seq), exchange))
            if self._heap[0][2] is exchange:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                at, _, exchange = self._heap[0]
                now = self._clock()
                if at > now:
                    self._cond.wait(at - now)
                    continue
                heapq.heappop(self._heap)
            exchange.fire()


_WATCHDOG = _Watchdog()
_current = threading.local()


@contextlib.contextmanager
def deadline(seconds: float, *, clock: Callable[[], float] = time.monotonic) -> Iterator[Exchange]:
    """Everything this thread does over a :func:`pool_manager`'s connections
    inside the block ends within ``seconds``; past it, :class:`DeadlineExceeded`."""
    exchange = Exchange(clock() + seconds)
    outer = getattr(_current, "exchange", None)
    _current.exchange = exchange
    _WATCHDOG.arm(exchange)
    try:
        yield exchange
    except DeadlineExceeded:
        raise
    except Exception as exc:
        if exchange.fired:
            raise DeadlineExceeded(
                f"no whole answer within {seconds:g} s ({type(exc).__name__})"
            ) from exc
        raise
    finally:
        exchange.finish()
        _current.exchange = outer


def _attach(connection: HTTPConnection) -> None:
    exchange = getattr(_current, "exchange", None)
    if exchange is not None:
        exchange.attach(connection)


class _DeadlineHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _attach(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)
        super().request(*args, **kwargs)


class _DeadlineHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _attach(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)
        super().request(*args, **kwargs)


def _detach(connection: HTTPConnection | None) -> None:
    exchange = getattr(_current, "exchange", None)
    if exchange is not None and connection is not None:
        exchange.detach(connection)


class _DeadlineHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection

    def _put_conn(self, conn: Any) -> None:
        _detach(conn)
        super()._put_conn(conn)


class _DeadlineHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection

    def _put_conn(self, conn: Any) -> None:
        _detach(conn)
        super()._put_conn(conn)


def pool_manager(**kwargs: Any) -> urllib3.PoolManager:
    """A ``urllib3.PoolManager`` (same arguments) whose connections keep the
    deadline of the :func:`deadline` block they are used in."""
    manager = urllib3.PoolManager(**kwargs)
    manager.pool_classes_by_scheme = {
        "http": _DeadlineHTTPConnectionPool,
        "https": _DeadlineHTTPSConnectionPool,
    }
    return manager
