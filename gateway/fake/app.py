"""The fake gateway as an aiohttp application: one processor, its surfaces and controls.

The card surface (`card`) and the Stripe-shaped one (`stripe_api`, under
``/stripe``) share the processor: its key store, faults, dice and counters.
"""

from __future__ import annotations

from aiohttp import web

from gateway.fake import card, controls, stripe_controls
from gateway.fake.keys import DEFAULT_KEY_RETENTION_SECONDS
from gateway.fake.processor import FakeProcessor
from gateway.fake.stripe_api import StripeSurface
from gateway.fake.stripe_settings import StripeSettings

PROCESSOR = web.AppKey("processor", FakeProcessor)
STRIPE = web.AppKey("stripe", StripeSurface)


def make_app(
    retention_seconds: float = DEFAULT_KEY_RETENTION_SECONDS,
    *,
    seed: int | None = None,
    stripe: StripeSettings | None = None,
) -> web.Application:
    """The application, its processor in `app[PROCESSOR]`, the Stripe surface in
    `app[STRIPE]` (`stripe`: its initial settings)."""
    processor = FakeProcessor(retention_seconds=retention_seconds, seed=seed)
    surface = StripeSurface(processor, stripe)
    app = web.Application()
    app[PROCESSOR] = processor
    app[STRIPE] = surface
    app.add_routes(card.routes(processor))
    app.add_routes(surface.routes())
    app.add_routes(controls.routes(processor))
    app.add_routes(stripe_controls.routes(surface))
    app.on_cleanup.append(surface.close)
    return app
