"""The Stripe surface's test controls (underscore paths, not part of Stripe).

``GET /_stripe``: the settings (the key masked), the last ``Stripe-Version``
seen and a count of each, the intents still processing. ``POST /_stripe``
with any subset of `stripe_settings.StripeSettings`'s fields (or ``reset:
true``) changes them, or answers 400 and changes nothing. ``POST
/_stripe/settle`` settles processing bank debits now (``{"payment_intent":
id}`` for one) and answers ``{"settled": [ids]}``. ``GET /_stripe/events``
lists every event made, oldest first, each with its deliveries. The
intents, charges and refunds themselves are in ``GET /_ledger``'s
``stripe`` section.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.fake import controls
from gateway.fake.errors import InvalidFaults
from gateway.fake.jsonapi import json_object, json_response, route_table
from gateway.fake.stripe_api import StripeSurface
from gateway.fake.stripe_settings import as_json, updated_settings
from gateway.fake.stripe_wire import mask


def routes(surface: StripeSurface) -> list[web.RouteDef]:
    """The Stripe control routes, over `surface`."""
    handlers = StripeControls(surface)
    return route_table(
        [
            ("GET", "/_stripe", handlers.get_settings),
            ("POST", "/_stripe", handlers.set_settings),
            ("POST", "/_stripe/settle", handlers.settle),
            ("GET", "/_stripe/events", handlers.events),
        ],
        controls.REFUSAL_ANSWERS,
    )


class StripeControls:
    """The Stripe control handlers."""

    def __init__(self, surface: StripeSurface) -> None:
        self.surface = surface

    def _state(self) -> dict[str, Any]:
        surface = self.surface
        settings = as_json(surface.settings)
        settings["api_key"] = mask(settings["api_key"])
        return {
            "settings": settings,
            "last_stripe_version": surface.last_version,
            "stripe_versions": dict(surface.versions_seen),
            "processing": surface.processing(),
        }

    async def get_settings(self, request: web.Request) -> web.StreamResponse:
        return json_response(200, self._state())

    async def set_settings(self, request: web.Request) -> web.StreamResponse:
        surface = self.surface
        surface.settings = updated_settings(
            surface.settings, surface.initial_settings, await json_object(request)
        )
        return json_response(200, self._state())

    async def settle(self, request: web.Request) -> web.StreamResponse:
        body = await json_object(request) if request.can_read_body else {}
        intent_id = body.get("payment_intent")
        if set(body) - {"payment_intent"} or (
            intent_id is not None and not isinstance(intent_id, str)
        ):
            raise InvalidFaults("the body may only name a payment_intent (an id)")
        if intent_id is None:
            settled = self.surface.settle_all()
        else:
            settled = [intent_id] if self.surface.settle(intent_id) else []
        return json_response(200, {"settled": settled})

    async def events(self, request: web.Request) -> web.StreamResponse:
        deliveries: dict[str, list[dict[str, Any]]] = {}
        for delivery in self.surface.webhooks.deliveries:
            deliveries.setdefault(delivery.event_id, []).append(delivery.as_json())
        return json_response(
            200,
            {
                "events": [
                    {
                        "id": event["id"],
                        "type": event["type"],
                        "created": event["created"],
                        "object_id": event["data"]["object"]["id"],
                        "deliveries": deliveries.get(event["id"], []),
                    }
                    for event in self.surface.ledger.events
                ]
            },
        )
