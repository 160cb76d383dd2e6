"""The fake processor's charge over aiohttp, for a worker's event loop
(``EXECUTOR=asyncio``): the same request and the same reading of its answer
as :class:`~paycron.processors.card.client.CardProcessor` (:func:`classify`),
its whole call bounded by one wall-clock deadline (``asyncio.timeout``
around connect, send and every read, not per socket read), its answer read
to at most MAX_ANSWER_BYTES, its sockets at most ``max_connections``.

Only the charge is here: lookups, refunds and reports are rare and run on
a thread with the blocking client.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from paycron.domain.enums import Outcome
from paycron.domain.processing import CallResult, ChargeRequest
from paycron.processors.card.client import classify
from paycron.processors.wire import MAX_ANSWER_BYTES, AnswerTooLarge
from paycron.processors.wire import Answer as WireAnswer

#: Connecting has at most this long, within the call's deadline (as the
#: blocking client's connect timeout).
CONNECT_SECONDS = 3.0


class AsyncCardProcessor:
    """One per worker process, made and used on its event loop."""

    name = "fake"

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 64):
        self._call_seconds = timeout
        self._url = base_url.rstrip("/") + "/v1/charges"
        # As many sockets as calls in flight at most; a call waits for one
        # within its own deadline. No retries: a POST is never sent twice.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECONDS),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        await self._session.close()

    async def charge(self, request: ChargeRequest, *, timeout: float | None = None) -> CallResult:
        """One charge call, over within ``timeout`` (at most the configured
        one) whatever the processor does; classified as the blocking client does."""
        seconds = min(timeout, self._call_seconds) if timeout else self._call_seconds
        body = json.dumps(
            {"amount": request.amount, "currency": request.currency, "reference": request.reference}
        ).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": request.idempotency_key}
        try:
            async with asyncio.timeout(seconds):
                async with self._session.post(self._url, data=body, headers=headers) as response:
                    answer = WireAnswer(
                        response.status, response.headers, await _read_bounded(response)
                    )
        except aiohttp.ClientConnectorError as exc:
            # The connection was never made: the request never left us.
            return CallResult(Outcome.RETRYABLE_ERROR, error_code=type(exc).__name__)
        except TimeoutError:
            # Sent (or perhaps sent), then no whole answer by the deadline:
            # it may have charged. Never guess.
            return CallResult(Outcome.AMBIGUOUS, error_code="DeadlineExceeded", in_doubt=True)
        except (aiohttp.ClientError, OSError) as exc:
            # A dropped connection or a broken answer after the request may have left.
            return CallResult(Outcome.AMBIGUOUS, error_code=type(exc).__name__, in_doubt=True)
        except AnswerTooLarge:
            return CallResult(Outcome.AMBIGUOUS, error_code="oversized_answer", in_doubt=True)
        return classify(answer)  # type: ignore[arg-type]


async def _read_bounded(response: aiohttp.ClientResponse, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The body, at most ``limit`` bytes (AnswerTooLarge beyond)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(f"the answer is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
