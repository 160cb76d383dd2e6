"""``/v1/events``: the caller's payment events as a resumable feed.

``nextCursor`` is always present: the position after the last event
returned, or the given one when nothing is new, so a client polls with it.
"""

from __future__ import annotations

from flask import current_app, g
from marshmallow import fields, validate

from paycron.domain.enums import Status
from paycron.store import events
from paycron.store.events import Position
from web.api import Blueprint
from web.auth import require_key
from web.problems import problem
from web.schemas import Cursor, ResponseSchema, Strict

bp = Blueprint(
    "events",
    __name__,
    url_prefix="/v1/events",
    description="The caller's payment events, as a resumable feed.",
)

#: Events per page unless ``limit`` says otherwise, and the most it may say.
DEFAULT_LIMIT = 100
MAX_LIMIT = 500


def _cursor(**kwargs) -> Cursor:
    return Cursor(int, int, into=Position, **kwargs)


class FeedQuerySchema(Strict):
    after = _cursor(
        metadata={
            "format": "event-cursor",
            "description": "Opaque: a nextCursor this feed returned; absent = from the start.",
        }
    )
    limit = fields.Integer(
        load_default=DEFAULT_LIMIT, validate=validate.Range(min=1, max=MAX_LIMIT)
    )


class EventSchema(ResponseSchema):
    """One entry of the feed; webhooks POST the same (``paycron.store.events.to_wire``)."""

    id = fields.Integer()
    type = fields.String(metadata={"description": "payment.created, payment.completed, ..."})
    payment_id = fields.UUID(data_key="paymentId")
    status = fields.String(metadata={"enum": [s.value for s in Status]})
    attempt = fields.Integer()
    data = fields.Dict(keys=fields.String())
    created_at = fields.AwareDateTime(data_key="createdAt")


class EventPageSchema(ResponseSchema):
    data = fields.List(fields.Nested(EventSchema))
    next_cursor = _cursor(
        data_key="nextCursor",
        metadata={
            "format": "event-cursor",
            "description": "Always present: pass it as after to poll for newer events.",
        },
    )


@bp.get("")
@require_key
@bp.arguments(FeedQuerySchema(), location="query", as_kwargs=True)
@bp.response(200, EventPageSchema, description="Events after the cursor.")
@bp.alt_response(400, **problem("A bad after or limit."))
def feed(limit: int, after: Position | None = None):
    """The caller's payment events, oldest first, resumable."""
    after = after or events.START
    with current_app.extensions["paycron.pool"].connection() as conn:
        page = events.read_feed(conn, payer=g.principal.actor, after=after, limit=limit)
    return {"data": page, "next_cursor": events.position_of(page[-1]) if page else after}
