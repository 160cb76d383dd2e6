"""The test controls: underscore paths, not part of a real processor.

``POST /_faults`` with any subset of ``latency_dist`` (``"fixed"``, the
default: every charge waits ``latency_ms``; ``"lognormal"``: median
``latency_p50_ms``, 99th percentile ``latency_p99_ms``, at most
``latency_cap_ms`` if set, drawn from the seeded dice), ``decline_rate``,
``error_rate`` (500/502/503, no charge), ``timeout_rate`` (sleep
``timeout_sleep_ms`` then 504, no charge), ``charge_then_drop_rate``
(charge, store the answer, then close the connection unanswered),
``error_after_charge_rate`` (Stripe surface only: charge, then answer a 500
that is stored for the key and replayed),
``rate_limit_per_s`` (more charge requests than this in the current
one-second window → 429 with ``Retry-After``; 0 or null = unlimited),
``seed`` (reseed the fault dice) and ``reset: true`` (defaults first); it
answers the settings now in force, or 400 and changes nothing. ``GET
/_faults`` shows the settings, ``GET /_stats`` the counters, ``GET
/_ledger`` every card charge (succeeded or refunded) and, under ``stripe``,
every Stripe intent, charge and refund with its status; ``POST /_reset``
forgets everything; ``GET /healthz``. The Stripe surface's own controls are
in `stripe_controls`.
"""

from __future__ import annotations

from aiohttp import web

from gateway.fake import errors
from gateway.fake.jsonapi import ErrorShape, RefusalAnswers, json_object, json_response, route_table
from gateway.fake.processor import FakeProcessor

#: Every refusal of the core a control request can meet.
REFUSAL_ANSWERS: RefusalAnswers = {
    errors.InvalidFaults: ErrorShape(400, "invalid_request"),
}


def routes(processor: FakeProcessor) -> list[web.RouteDef]:
    """The control routes, over `processor`."""
    controls = Controls(processor)
    return route_table(
        [
            ("GET", "/_faults", controls.get_faults),
            ("POST", "/_faults", controls.set_faults),
            ("GET", "/_stats", controls.get_stats),
            ("GET", "/_ledger", controls.get_ledger),
            ("POST", "/_reset", controls.post_reset),
            ("GET", "/healthz", controls.healthz),
        ],
        REFUSAL_ANSWERS,
    )


class Controls:
    """The control handlers."""

    def __init__(self, processor: FakeProcessor) -> None:
        self.processor = processor

    async def get_faults(self, request: web.Request) -> web.StreamResponse:
        """`GET /_faults`: the current fault settings."""
        return json_response(200, self.processor.settings())

    async def set_faults(self, request: web.Request) -> web.StreamResponse:
        """`POST /_faults`: change any subset of the settings (400 and no change if invalid)."""
        self.processor.configure(await json_object(request))
        return json_response(200, self.processor.settings())

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        """`GET /_stats`: request and outcome counters since the last reset."""
        return json_response(200, self.processor.stats)

    async def get_ledger(self, request: web.Request) -> web.StreamResponse:
        """`GET /_ledger`: the truth tests check against: every card charge (succeeded
        or refunded), and every Stripe intent, charge and refund."""
        return json_response(
            200,
            {
                "charges": self.processor.ledger.entries(),
                "stripe": self.processor.stripe_ledger.entries(),
            },
        )

    async def post_reset(self, request: web.Request) -> web.StreamResponse:
        """`POST /_reset`: back to an empty gateway with no faults."""
        self.processor.reset()
        return json_response(200, {"reset": True})

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        """`GET /healthz`: the process is up."""
        return json_response(200, {"status": "ok"})
