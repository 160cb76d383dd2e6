"""Webhook deliveries: each event POSTed to every endpoint, signed as Stripe signs.

The body is the event as JSON, the same bytes on every attempt; the header
``Stripe-Signature: t=<unix>,v1=<hex>`` carries an HMAC-SHA256 of
``"<t>.<body>"`` under each configured ``whsec_…`` secret (one ``v1`` per
secret, as while Stripe rolls a secret), with a fresh ``t`` on each attempt.
An answer other than 2xx (or none) is retried, waiting ``webhook_retry_ms``
and doubling, up to ``webhook_max_attempts``. The settings can lose an event
for an endpoint, send it twice, or hold each delivery a random extra while so
that events arrive out of order; the dice are thrown as the event is
published, so a seed decides them whatever the timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from gateway.fake.processor import FakeProcessor
from gateway.fake.stripe_objects import StripeObject
from gateway.fake.stripe_settings import StripeSettings

USER_AGENT = "Stripe/1.0 (+https://stripe.com/docs/webhooks)"
#: An endpoint that does not answer within this long has failed the attempt.
DELIVERY_TIMEOUT_SECONDS = 10.0


def signature_header(payload: bytes, secrets: tuple[str, ...], timestamp: int) -> str:
    """`Stripe-Signature` for `payload` at `timestamp`, one `v1` per secret."""
    signed = f"{timestamp}.".encode() + payload
    signatures = [
        hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest() for secret in secrets
    ]
    return ",".join([f"t={timestamp}", *(f"v1={signature}" for signature in signatures)])


@dataclasses.dataclass(slots=True)
class Delivery:
    """One event on its way to one endpoint (a duplicate is a delivery of its own)."""

    event_id: str
    event_type: str
    url: str
    status: str = "pending"  # pending, delivered, failed (attempts used up), lost
    attempts: int = 0
    last_status: int | None = None
    last_error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Webhooks:
    """Publishes events to the endpoints of the current settings."""

    def __init__(self, processor: FakeProcessor, settings: Callable[[], StripeSettings]) -> None:
        self.processor = processor
        self.settings = settings
        self.deliveries: list[Delivery] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    def publish(self, events: list[StripeObject]) -> None:
        """Send each event to every endpoint that wants it (in the background)."""
        settings, dice, stats = self.settings(), self.processor.dice, self.processor.stats
        for event in events:
            if not settings.webhook_urls or not settings.wants(event["type"]):
                continue
            event["pending_webhooks"] = len(settings.webhook_urls)
            payload = json.dumps(event, indent=2).encode()
            for url in settings.webhook_urls:
                if dice.webhook_roll(settings.webhook_loss_rate):
                    stats["events_lost"] += 1
                    self.deliveries.append(Delivery(event["id"], event["type"], url, "lost"))
                    continue
                copies = 2 if dice.webhook_roll(settings.webhook_duplicate_rate) else 1
                for _ in range(copies):
                    delivery = Delivery(event["id"], event["type"], url)
                    self.deliveries.append(delivery)
                    delay_ms = dice.webhook_delay_ms(settings.webhook_reorder_ms)
                    self._spawn(self._deliver(delivery, payload, settings, delay_ms))

    async def _deliver(
        self, delivery: Delivery, payload: bytes, settings: StripeSettings, delay_ms: float
    ) -> None:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        stats = self.processor.stats
        for attempt in range(settings.webhook_max_attempts):
            if attempt:
                await asyncio.sleep(settings.webhook_retry_ms * 2 ** (attempt - 1) / 1000)
            delivery.attempts += 1
            if await self._post(delivery, payload, settings.webhook_secrets):
                delivery.status = "delivered"
                stats["deliveries"] += 1
                return
            stats["delivery_failures"] += 1
        delivery.status = "failed"

    async def _post(self, delivery: Delivery, payload: bytes, secrets: tuple[str, ...]) -> bool:
        """One attempt; True if the endpoint answered 2xx."""
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "User-Agent": USER_AGENT,
            "Stripe-Signature": signature_header(payload, secrets, int(time.time())),
        }
        try:
            async with self._client().post(delivery.url, data=payload, headers=headers) as answer:
                await answer.read()
                delivery.last_status = answer.status
                return 200 <= answer.status < 300
        except (aiohttp.ClientError, TimeoutError) as exc:
            delivery.last_error = f"{type(exc).__name__}: {exc}"
            return False

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=DELIVERY_TIMEOUT_SECONDS)
            )
        return self._session

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def reset(self) -> None:
        """Stop every delivery under way and forget them all."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self.deliveries = []

    async def close(self) -> None:
        self.reset()
        if self._session is not None:
            await self._session.close()
