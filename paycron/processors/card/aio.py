"""The fake processor's charge for a worker's event loop
(``EXECUTOR=asyncio``): the same request and the same reading of its answer
as :class:`~paycron.processors.card.client.CardProcessor` (:func:`classify`),
its whole call bounded by one wall-clock deadline (``asyncio.timeout``
around the wait for a socket, connect, send and every read, not per socket
read), its answer read to at most MAX_ANSWER_BYTES, its sockets at most
``max_connections``.

The request goes over keep-alive HTTP/1.1 connections this module keeps
itself, its answer parsed by httptools (llhttp, Node's parser): a charge is
one small POST to one host, and aiohttp's general request path (cookies,
redirects, auto headers, tracing, multidicts) cost twice the CPU of the
whole call here (docs/performance.md, "The charge's own connections").

- Nothing sent (no socket free within the deadline, a connect refused or
  timed out): the request never left, ``RETRYABLE_ERROR``, not in doubt,
  under the blocking client's error codes.
- Sent, then no whole answer (the deadline, a dropped connection, an
  answer that does not parse, one that ends with the connection instead
  of declaring its length): in doubt, ``AMBIGUOUS``.
- A connection is used again only after a whole answer that allows it;
  one cut by the deadline, or idle longer than IDLE_SECONDS, is closed.

Only the charge is here: lookups, refunds and reports are rare and run on
a thread with the blocking client.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from urllib.parse import urlsplit

import httptools
import orjson

from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult, ChargeRequest
from paycron.processors.card.client import classify
from paycron.processors.wire import MAX_ANSWER_BYTES, AnswerTooLarge
from paycron.processors.wire import Answer as WireAnswer

#: Connecting has at most this long, within the call's deadline (as the
#: blocking client's connect timeout).
CONNECT_SECONDS = 3.0
#: An idle connection is not used after this long: the processor (or a
#: balancer before it) may close it at any moment, and a request written
#: as it closes is in doubt. aiohttp's default keep-alive, well under the
#: usual server's.
IDLE_SECONDS = 15.0
#: The most of an answer's status line and headers read.
MAX_HEAD_BYTES = 64 << 10

#: The error codes of a call that never left, the blocking client's (urllib3's
#: exception names), so both executors write the same attempts.
NO_SOCKET_FREE = "EmptyPoolError"
CONNECT_TIMEOUT = "ConnectTimeoutError"
CONNECT_FAILED = "NewConnectionError"


class _Headers(dict[str, str]):
    """An answer's headers by lower-cased name, read in any case."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)


class _NotSent(Exception):
    """No request was written: the processor cannot have it."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


class _Connection(asyncio.Protocol):
    """One connection to the processor, one request on it at a time; the
    callbacks of httptools' parser fill the answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[WireAnswer] | None = None
        self._headers = _Headers()
        self._body: list[bytes] = []
        self._in_head = False
        self._head_size = 0
        self._body_size = 0
        self._reusable = False
        self._unasked = False

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():
            # Bytes nobody asked for: the connection is not trusted again.
            self._unasked = True
            self.close()
            return
        try:
            while data:
                if not self._in_head:
                    self._parser.feed_data(data)
                    break
                # httptools holds a header's bytes until the header ends:
                # a head is fed at most MAX_HEAD_BYTES, so one endless header
                # is cut there, not held.
                room = MAX_HEAD_BYTES - self._head_size
                if room <= 0:
                    raise AnswerTooLarge(f"the answer's head is larger than {MAX_HEAD_BYTES} bytes")
                piece, data = data[:room], data[room:]
                self._head_size += len(piece)
                self._parser.feed_data(piece)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, AnswerTooLarge) as exc:
            self._fail(exc)
            return
        if self._body_size > MAX_ANSWER_BYTES:
            self._fail(AnswerTooLarge(f"the answer is larger than {MAX_ANSWER_BYTES} bytes"))
        elif self._unasked:
            self._fail(ConnectionError("the processor answered what was not asked"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._reusable = False
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(
                ConnectionResetError("the processor closed the connection before its answer")
            )

    # the parser's side

    def on_message_begin(self) -> None:
        if self._answer is None or self._answer.done():
            # A second answer behind the first: nobody asked for it.
            self._unasked = True
            return
        # The answer, or the final one after an interim (1xx) answer (the
        # heads of both count against MAX_HEAD_BYTES).
        self._headers = _Headers()
        self._body = []
        self._in_head = True
        self._body_size = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # not a chunked answer's trailers
            self._headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self._in_head = False

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size <= MAX_ANSWER_BYTES:
            self._body.append(body)

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is None or answer.done() or self._body_size > MAX_ANSWER_BYTES:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                # Switching protocols on a charge: no HTTP answer follows.
                self._unasked = True
                answer.set_exception(ConnectionError("the processor switched protocols"))
            # Otherwise an interim answer (100, 102, 103): the answer follows.
            return
        self._reusable = self._parser.should_keep_alive()
        answer.set_result(WireAnswer(status, self._headers, b"".join(self._body)))

    # the charge's side

    def usable(self, now: float) -> bool:
        return (
            self.transport is not None
            and not self.transport.is_closing()
            and now - self.idle_since < IDLE_SECONDS
        )

    def exchange(self, request: bytes) -> asyncio.Future[WireAnswer]:
        """Write one request; its answer, once whole."""
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._in_head = True
        self._head_size = self._body_size = 0
        self._reusable = False
        self.transport.write(request)
        return self._answer

    def reusable(self) -> bool:
        """A whole answer was read and the connection may carry another."""
        return (
            self._reusable
            and not self._unasked
            and self._answer is not None
            and self._answer.done()
            and not self._answer.cancelled()
            and self._answer.exception() is None
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        """Closed at once: over TLS a graceful close would wait for the
        processor's reply (30 s) with its socket still open, outside the
        count of ``max_connections``."""
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        self._reusable = False
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self.close()


class AsyncCardProcessor:
    """One per worker process, made and used on its event loop."""

    name = "fake"

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 64):
        self._call_seconds = timeout
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._tls = ssl.create_default_context() if url.scheme == "https" else None
        # The request's head up to its key, made once.
        self._head = (
            f"POST {url.path.rstrip('/')}/v1/charges HTTP/1.1\r\n"
            f"Host: {url.netloc.rpartition('@')[2]}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: application/json\r\n"
            "Idempotency-Key: "
        )
        # As many sockets as calls in flight at most: a socket is made only
        # when none is idle, so those open never outnumber the calls holding
        # this. A call waits for one within its own deadline. No retries: a
        # POST is never sent twice.
        self._room = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def charge(self, request: ChargeRequest, *, timeout: float | None = None) -> CallResult:
        """One charge call, over within ``timeout`` (at most the configured
        one) whatever the processor does; classified as the blocking client does."""
        seconds = min(timeout, self._call_seconds) if timeout else self._call_seconds
        key = request.idempotency_key
        if "\r" in key or "\n" in key:
            raise ValueError("an idempotency key holds a line break")
        body = orjson.dumps(
            {"amount": request.amount, "currency": request.currency, "reference": request.reference}
        )
        message = (
            f"{self._head}{key}\r\nContent-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        )
        stage = NO_SOCKET_FREE  # what a deadline now would have stopped
        try:
            async with asyncio.timeout(seconds):
                async with self._room:
                    stage = CONNECT_TIMEOUT
                    connection = await self._connection()
                    stage = ""
                    try:
                        answer = await connection.exchange(message)
                    finally:
                        self._put_back(connection)
        except _NotSent as exc:
            return CallResult(Outcome.RETRYABLE_ERROR, error_code=exc.code)
        except TimeoutError:
            if stage:
                # No socket came free, or none connected, in time: the
                # request never left.
                return CallResult(Outcome.RETRYABLE_ERROR, error_code=stage)
            # Sent, then no whole answer by the deadline: it may have
            # charged. Never guess.
            return CallResult(Outcome.AMBIGUOUS, error_code="DeadlineExceeded", in_doubt=True)
        except AnswerTooLarge:
            return CallResult(Outcome.AMBIGUOUS, error_code="oversized_answer", in_doubt=True)
        except (OSError, httptools.HttpParserError) as exc:
            # A dropped connection or a broken answer after the request left.
            return CallResult(Outcome.AMBIGUOUS, error_code=type(exc).__name__, in_doubt=True)
        return classify(answer)  # type: ignore[arg-type]

    async def _connection(self) -> _Connection:
        """An idle connection still fit to use, else a new one."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable(now):
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                _, connection = await loop.create_connection(
                    _Connection,
                    self._host,
                    self._port,
                    ssl=self._tls,
                    server_hostname=self._host if self._tls is not None else None,
                )
        except TimeoutError:
            raise _NotSent(CONNECT_TIMEOUT) from None
        except OSError as exc:
            raise _NotSent(CONNECT_FAILED) from exc
        return connection

    def _put_back(self, connection: _Connection) -> None:
        if connection.reusable():
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
