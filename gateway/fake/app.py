"""The fake gateway as an aiohttp application: one processor, its surfaces and controls.

A second surface (SPEC §12's Stripe-shaped one) is one more module with a
`routes(processor)` function, added here over the same processor.
"""

from __future__ import annotations

from aiohttp import web

from gateway.fake import card, controls
from gateway.fake.keys import DEFAULT_KEY_RETENTION_SECONDS
from gateway.fake.processor import FakeProcessor

PROCESSOR = web.AppKey("processor", FakeProcessor)


def make_app(
    retention_seconds: float = DEFAULT_KEY_RETENTION_SECONDS, *, seed: int | None = None
) -> web.Application:
    """The application, its processor in `app[PROCESSOR]`."""
    processor = FakeProcessor(retention_seconds=retention_seconds, seed=seed)
    app = web.Application()
    app[PROCESSOR] = processor
    app.add_routes(card.routes(processor))
    app.add_routes(controls.routes(processor))
    return app
