"""``/v1/events``: the caller's payment events as a resumable feed.

``nextCursor`` is always present: the position after the last event
returned, or the given one when nothing is new, so a client polls with it.
"""

from __future__ import annotations

import base64
import binascii

from flask import Blueprint, current_app, g, jsonify, request
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from paycron import events
from paycron.errors import ValidationFailed
from paycron.events import Position
from web.auth import require_key

bp = Blueprint("events", __name__, url_prefix="/v1/events")

#: Events per page unless ``limit`` says otherwise, and the most it may say.
DEFAULT_LIMIT = 100
MAX_LIMIT = 500


class FeedQuerySchema(Schema):
    class Meta:
        unknown = RAISE

    after = fields.String(load_default=None, metadata={
        "format": "event-cursor",
        "description": "Opaque: a nextCursor this feed returned; absent = from the start."})
    limit = fields.Integer(load_default=DEFAULT_LIMIT,
                           validate=validate.Range(min=1, max=MAX_LIMIT))


_query = FeedQuerySchema()


def encode_cursor(position: Position) -> str:
    raw = f"{position.txid}.{position.event_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        txid, event_id = raw.split(".")
        if not (txid.isdigit() and event_id.isdigit()):
            raise ValueError("not two unsigned integers")
        position = Position(int(txid), int(event_id))
        if position.txid >= 2 ** 63 or position.event_id >= 2 ** 63:
            raise ValueError("out of range")
        return position
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed({"after": ["not a cursor this API returned"]}) from None


@bp.get("")
@require_key
def feed():
    try:
        query = _query.load(request.args.to_dict())
    except ValidationError as exc:
        raise ValidationFailed(exc.normalized_messages()) from None
    after = decode_cursor(query["after"]) if query["after"] else events.START
    with current_app.extensions["paycron.pool"].connection() as conn:
        page = events.read_feed(conn, payer=g.principal.actor, after=after,
                                limit=query["limit"])
    position = events.position_of(page[-1]) if page else after
    return jsonify({"data": [events.to_wire(e) for e in page],
                    "nextCursor": encode_cursor(position)})
