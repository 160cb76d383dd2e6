"""The Stripe SDK's HTTP transport, over urllib3.

The SDK takes any :class:`stripe.HTTPClient`; this one gives it what the
engine needs and the SDK's own clients do not: a **wall-clock deadline** per
call (a call never outlives its lease; the SDK's clients take one timeout at
construction, and a socket timeout bounds each read only: see
paycron/deadline.py), set by the adapter around each call; one
thread-safe keep-alive pool shared by a worker's call threads; and errors
that say whether the request left us (a refused connection is a definitive
non-charge). urllib3 because it is the cheapest client measured here
(paycron/processors/card/client.py's note) and already a dependency.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping

import stripe
import urllib3

from paycron.deadline import deadline, pool_manager
from paycron.processors.wire import (
    MAX_ANSWER_BYTES,
    MAX_REPORT_BYTES,
    NOT_SENT,
    AnswerTooLarge,
    read_bounded,
)


class NotSent(stripe.APIConnectionError):
    """The connection was refused or never made: nothing reached Stripe."""


class PooledHttpClient(stripe.HTTPClient):
    name = "urllib3"

    def __init__(self, *, timeout: float, max_connections: int = 64):
        super().__init__()
        self._seconds = timeout
        self._local = threading.local()
        self._pool = pool_manager(num_pools=4, maxsize=max_connections, block=False, retries=False)

    @contextlib.contextmanager
    def timeout(self, seconds: float | None) -> Iterator[None]:
        """Calls made by this thread inside the block end within ``seconds``
        in total (connect and every read), at most the configured timeout."""
        self._local.seconds = min(seconds, self._seconds) if seconds else self._seconds
        try:
            yield
        finally:
            self._local.seconds = None

    # The SDK annotates the body as str, but its own clients answer bytes and
    # it decodes them itself (a body that is not UTF-8 becomes its APIError):
    # so do we, and the override's return type differs from the annotation.
    def request(  # type: ignore[override]
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data=None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[bytes, int, Mapping[str, str]]:
        seconds = getattr(self._local, "seconds", None) or self._seconds
        try:
            with deadline(seconds):
                response = self._pool.request(
                    method.upper(),
                    url,
                    body=post_data,
                    headers=dict(headers or {}),
                    timeout=urllib3.Timeout(connect=min(seconds, 3.0), read=seconds),
                    redirect=False,
                    preload_content=False,
                )
                # bounded like every answer (a list page of 100 charges is
                # ~300 KiB), and read within the same deadline
                answer = read_bounded(
                    response, MAX_REPORT_BYTES if method.lower() == "get" else MAX_ANSWER_BYTES
                )
        except NOT_SENT as exc:
            raise NotSent(f"could not connect to Stripe: {type(exc).__name__}") from exc
        except urllib3.exceptions.HTTPError as exc:
            # Sent, then no (whole) answer in time: the outcome is unknown.
            raise stripe.APIConnectionError(f"no answer from Stripe: {type(exc).__name__}") from exc
        except AnswerTooLarge as exc:
            # Sent, then an answer we do not read: as unknown as no answer.
            raise stripe.APIConnectionError(f"no usable answer from Stripe: {exc}") from exc
        return answer.data, answer.status, answer.headers

    def request_stream(self, method, url, headers, post_data=None):
        raise NotImplementedError("paycron makes no streaming requests")

    def close(self) -> None:
        self._pool.clear()
