"""``/v1/webhook-endpoints``: where the caller's events are POSTed, signed.

The signing secret is in the create answer only; listings never show it.
Delivery is the scheduler's relay (``scheduler/relay.py``), not this process.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from flask import current_app, g
from marshmallow import Schema, fields, validate

from paycron.errors import NotFound, ValidationFailed
from paycron.store import webhooks
from web.api import Blueprint, links
from web.auth import require_key
from web.problems import NOT_JSON, TOO_LARGE, problem
from web.schemas import Cursor, PathId, ResponseSchema, Strict, parse_uuid, unicode_text

bp = Blueprint(
    "webhooks",
    __name__,
    url_prefix="/v1/webhook-endpoints",
    description="Where the caller's events are POSTed, signed.",
)

#: Long enough for any real receiver, short enough to keep rows and logs sane.
MAX_URL_LENGTH = 2048


class CreateEndpointSchema(Strict):
    # require_tld=False: an internal host name or an IP address is a valid receiver.
    url = fields.Url(
        required=True,
        schemes={"http", "https"},
        require_tld=False,
        validate=[validate.Length(max=MAX_URL_LENGTH), unicode_text],
    )


class EndpointPath(Schema):
    endpoint_id = PathId(parse_uuid, "no such webhook endpoint")


class WebhookEndpointSchema(ResponseSchema):
    id = fields.UUID()
    url = fields.Url()
    created_at = fields.AwareDateTime(data_key="createdAt")


class CreatedWebhookEndpointSchema(WebhookEndpointSchema):
    class Meta:
        fields = ("id", "url", "secret", "created_at")

    secret = fields.String(
        metadata={"description": "The HMAC-SHA256 signing key. Shown in this answer only."}
    )


class EndpointListQuerySchema(Strict):
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))
    cursor = Cursor(
        datetime,
        UUID,
        metadata={
            "format": "endpoint-cursor",
            "description": "Opaque: the nextCursor of the previous page.",
        },
    )


class WebhookEndpointPageSchema(ResponseSchema):
    data = fields.List(fields.Nested(WebhookEndpointSchema))
    next_cursor = Cursor(
        datetime,
        UUID,
        data_key="nextCursor",
        allow_none=True,
        metadata={"format": "endpoint-cursor", "description": "Null on the last page."},
    )


def _pool():
    return current_app.extensions["paycron.pool"]


@bp.post("")
@require_key
@bp.arguments(CreateEndpointSchema(), as_kwargs=True)
@bp.response(
    201,
    CreatedWebhookEndpointSchema,
    description=("Registered; the secret is shown this once."),
    headers={
        "Location": {
            "required": True,
            "description": "The created resource.",
            "schema": {"type": "string", "format": "uri-reference"},
        }
    },
)
@bp.doc(responses={201: {"links": links("endpoint_id", "webhooks_delete")}})
@bp.alt_response(
    400,
    **problem(
        "Bad JSON, an invalid url, or one whose host does not resolve to public addresses only."
    ),
)
@bp.alt_response(
    409,
    **problem(
        "The caller already has MAX_WEBHOOK_ENDPOINTS live "
        "endpoints (LIMIT_REACHED); nothing was created."
    ),
)
@bp.alt_response(413, **TOO_LARGE)
@bp.alt_response(415, **NOT_JSON)
def create(url: str):
    """Register a URL the caller's events are POSTed to, signed."""
    config = current_app.extensions["paycron.config"]
    if not config.webhook_allow_private_hosts:
        reason = webhooks.forbidden_destination(url)
        if reason:
            raise ValidationFailed({"url": [f"not a public destination: {reason}"]})
    with _pool().connection() as conn:
        row = webhooks.create_endpoint(
            conn, actor=g.principal.actor, url=url, max_endpoints=config.max_webhook_endpoints
        )
    return row, {"Location": f"{bp.url_prefix}/{row['id']}"}


@bp.get("")
@require_key
@bp.arguments(EndpointListQuerySchema(), location="query", as_kwargs=True)
@bp.response(
    200,
    WebhookEndpointPageSchema,
    description=("A page of endpoints (without secrets); nextCursor is null on the last one."),
)
@bp.alt_response(400, **problem("A bad limit or cursor."))
def index(limit: int, cursor: tuple | None = None):
    """The caller's live webhook endpoints, oldest first (keyset pagination)."""
    with _pool().connection() as conn:
        page, next_key = webhooks.list_endpoints(
            conn, actor=g.principal.actor, limit=limit, after=cursor
        )
    return {"data": page, "next_cursor": next_key}


@bp.delete("/<endpoint_id>")
@require_key
@bp.path(EndpointPath())
@bp.response(204, description="Deleted.")
@bp.alt_response(404, **problem("No such endpoint, or another payer's."))
def delete(endpoint_id: UUID):
    """Stop sending events to an endpoint."""
    with _pool().connection() as conn:
        if not webhooks.delete_endpoint(conn, endpoint_id, actor=g.principal.actor):
            raise NotFound("no such webhook endpoint")
    return current_app.response_class(status=204)
