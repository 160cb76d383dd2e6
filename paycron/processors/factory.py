"""The processor adapter a configuration names, for a composition root.
Adding a processor adds a sub-package and one line here."""

from __future__ import annotations

import logging
from types import ModuleType

import redis

from paycron.config import Config
from paycron.errors import GatewayError
from paycron.limits.pacing import CallLimiter
from paycron.processors.base import Processor, TakeToken

log = logging.getLogger("paycron.gateway")


def build_processor(
    config: Config, *, max_connections: int = 64, call_limiter: CallLimiter | None = None
) -> Processor:
    """The processor adapter this configuration names, for a composition root.
    ``call_limiter``: the shared per-second window every request that is not
    a charge (lookups, refunds, report pages) takes a token from."""
    if config.gateway == "stripe":
        from paycron.processors.stripe.client import StripeProcessor

        return StripeProcessor.from_config(
            config, max_connections=max_connections, take_token=_token_taker(call_limiter)
        )
    from paycron.processors.card.client import CardProcessor

    return CardProcessor(
        config.gateway_url, timeout=config.gateway_timeout_seconds, max_connections=max_connections
    )


def build_async_charger(config: Config, *, max_connections: int = 64):
    """The processor's async charge for a worker's event loop
    (``EXECUTOR=asyncio``; call on that loop), or None where it has none
    (Stripe's SDK: its charges run on a thread with the blocking client)."""
    if config.gateway == "stripe":
        return None
    from paycron.processors.card.aio import AsyncCardProcessor

    return AsyncCardProcessor(
        config.gateway_url, timeout=config.gateway_timeout_seconds, max_connections=max_connections
    )


def _token_taker(limiter: CallLimiter | None) -> TakeToken | None:
    if limiter is None:
        return None

    def take(within: float | None = None) -> None:
        try:
            granted = limiter.acquire_some(1, within=within)
        except redis.RedisError as exc:  # an operator's lookup must not wait on Redis
            log.warning("call window unavailable (%s): request sent unpaced", type(exc).__name__)
            return
        if not granted:
            raise GatewayError(f"no call fitted in the shared call window within {within:g} s")

    return take


def amount_rules(config: Config) -> ModuleType | None:
    """The create-time amount and currency rules of the processor this
    configuration names (a module with ``CURRENCIES``, ``MAX_AMOUNT``,
    ``currency_problem`` and ``amount_problem``), or None where it has none."""
    if config.gateway == "stripe":
        from paycron.processors.stripe import amounts

        return amounts
    return None
