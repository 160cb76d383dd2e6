"""``/v1/webhook-endpoints``: where the caller's events are POSTed, signed.

The signing secret is in the create answer only; listings never show it.
Delivery is the scheduler's relay (``scheduler/relay.py``), not this process.
"""

from __future__ import annotations

import uuid

from flask import Blueprint, current_app, g, jsonify
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from paycron import webhooks
from paycron.errors import NotFound, ValidationFailed
from web.auth import require_key
from web.bodies import json_object
from web.schemas import unicode_text

bp = Blueprint("webhooks", __name__, url_prefix="/v1/webhook-endpoints")

#: Long enough for any real receiver, short enough to keep rows and logs sane.
MAX_URL_LENGTH = 2048


class CreateEndpointSchema(Schema):
    class Meta:
        unknown = RAISE

    # require_tld=False: an internal host name or an IP address is a valid receiver.
    url = fields.Url(required=True, schemes={"http", "https"}, require_tld=False,
                     validate=[validate.Length(max=MAX_URL_LENGTH), unicode_text])


_create = CreateEndpointSchema()


def _pool():
    return current_app.extensions["paycron.pool"]


def _endpoint(row: dict) -> dict:
    return {"id": str(row["id"]), "url": row["url"], "createdAt": row["created_at"].isoformat()}


@bp.post("")
@require_key
def create():
    try:
        data = _create.load(json_object())
    except ValidationError as exc:
        raise ValidationFailed(exc.normalized_messages()) from None
    if not current_app.extensions["paycron.config"].webhook_allow_private_hosts:
        reason = webhooks.forbidden_destination(data["url"])
        if reason:
            raise ValidationFailed({"url": [f"not a public destination: {reason}"]})
    with _pool().connection() as conn:
        row = webhooks.create_endpoint(conn, actor=g.principal.actor, url=data["url"])
    response = jsonify({"id": str(row["id"]), "url": row["url"], "secret": row["secret"],
                        "createdAt": row["created_at"].isoformat()})
    response.status_code = 201
    response.headers["Location"] = f"{bp.url_prefix}/{row['id']}"
    return response


@bp.get("")
@require_key
def index():
    with _pool().connection() as conn:
        rows = webhooks.list_endpoints(conn, actor=g.principal.actor)
    return jsonify({"data": [_endpoint(r) for r in rows]})


@bp.delete("/<endpoint_id>")
@require_key
def delete(endpoint_id: str):
    try:
        eid = uuid.UUID(endpoint_id)
    except ValueError:
        raise NotFound("no such webhook endpoint") from None
    with _pool().connection() as conn:
        if not webhooks.delete_endpoint(conn, eid, actor=g.principal.actor):
            raise NotFound("no such webhook endpoint")
    return "", 204
