"""Stripe's idempotency, as the Stripe surface applies it to every POST.

Stripe saves the status and body of a request's answer once the endpoint
has begun executing, and answers a request with the same key and the same
parameters with them again (``Idempotent-Replayed: true``) — a success, a
decline, a state error, even a 500. A request rejected before executing (a
validation error, 401, 429, a 5xx before anything ran) saves nothing; a
request under a key whose first request is still running gets 409
``idempotency_key_in_use``; other parameters (or another endpoint) under a
key get 400 ``idempotency_error``. Keys live in the processor's key store
(its retention), in a namespace apart from the card surface's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.fake.errors import KeyInUse, KeyMismatch
from gateway.fake.jsonapi import MAX_KEY_LENGTH, REPLAYED_HEADERS, dumps, raw_json_response
from gateway.fake.processor import FakeProcessor
from gateway.fake.stripe_ledger import Origin
from gateway.fake.stripe_objects import new_id
from gateway.fake.stripe_wire import Params, StripeError, fingerprint, invalid

#: Stripe keys live apart from the card surface's in the shared key store.
KEY_NAMESPACE = "stripe\x00"


class Call:
    """One API request: its id, the Stripe-Version and the Idempotency-Key it named."""

    __slots__ = ("request_id", "version", "key")

    def __init__(self, request: web.Request) -> None:
        self.request_id = new_id("req_")
        self.version = request.headers.get("Stripe-Version")
        self.key = request.headers.get("Idempotency-Key")

    def origin(self) -> Origin:
        return Origin(self.request_id, self.key, self.version)


class Answer:
    """An executed request's answer, to store for its key: status, encoded body,
    headers (not stored), and whether the connection is then dropped (a fault)."""

    __slots__ = ("status", "encoded", "headers", "drop")

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.encoded = dumps(body)
        self.headers = headers or {}
        self.drop = False


Execution = Callable[[], Awaitable[Answer]]


async def once(
    processor: FakeProcessor, request: web.Request, call: Call, params: Params, run: Execution
) -> web.StreamResponse:
    """Run a POST's execution at most once per idempotency key."""
    if call.key is None:  # no key (curl): no idempotency
        return send(request, await stored_or_raise(run))
    if len(call.key) > MAX_KEY_LENGTH:
        raise invalid(f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters")
    try:
        entry = processor.claim(
            KEY_NAMESPACE + call.key, fingerprint(request.method, request.path, params)
        )
    except KeyInUse:
        raise StripeError(
            409,
            "There is currently another in-progress request using this Idempotent "
            "Key (that probably means you submitted twice, and the other request is still "
            f"going through): {call.key}. Please try again later.",
            code="idempotency_key_in_use",
            headers={"Stripe-Should-Retry": "true"},
        ) from None
    except KeyMismatch:
        raise StripeError(
            400,
            "Keys for idempotent requests can only be used with the same parameters "
            f"they were first used with. Try using a key other than '{call.key}' if you "
            "meant to execute a different request.",
            type="idempotency_error",
        ) from None
    if entry.answered:
        assert entry.status is not None
        return raw_json_response(entry.status, entry.body, headers=dict(REPLAYED_HEADERS))
    try:
        answer = await stored_or_raise(run)
        processor.keys.store(entry, answer.status, answer.encoded)
        return send(request, answer)
    finally:
        processor.keys.release(entry)


async def stored_or_raise(run: Execution) -> Answer:
    """Run an execution: an error raised after it began becomes the answer to store."""
    try:
        return await run()
    except StripeError as exc:
        if not exc.stored:
            raise
        return Answer(exc.status, exc.body, exc.headers)


def send(request: web.Request, answer: Answer) -> web.StreamResponse:
    response = raw_json_response(answer.status, answer.encoded, headers=answer.headers)
    if answer.drop and request.transport is not None:
        request.transport.close()  # executed and stored, but the client hears nothing
    return response
