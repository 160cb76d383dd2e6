"""``GET /openapi.json``: the OpenAPI 3.1 document of the HTTP API (SPEC §4).

Generated, not written: apispec's MarshmallowPlugin turns the marshmallow
schemas the views load and dump into the document's schemas and parameters.
Written here is only what no schema says: which route answers what
(``operations``, keyed by Flask endpoint), headers, security, and the limits
that are settings (amount ceiling, horizon, body size). Paths come from the
app's ``url_map``, so an operation is documented under the path it really
has; a route missing from ``operations`` is missing from the document, which
``tests/test_openapi.py`` catches.
"""

from __future__ import annotations

import re
from collections import defaultdict

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.common import resolve_schema_cls
from flask import Blueprint, Flask, current_app, jsonify
from marshmallow import RAISE, Schema, fields, validate

from paycron.config import Config
from web.admin import DeadLetterSchema, DismissSchema
from web.events import FeedQuerySchema
from web.payments import _MAX_KEY_LENGTH
from web.problems import PROBLEM_JSON
from web.schemas import (
    CancelledSchema,
    CreatedWebhookEndpointSchema,
    CreatePaymentSchema,
    DeadLetterActionSchema,
    EventPageSchema,
    HealthSchema,
    ListQuerySchema,
    PaymentPageSchema,
    PaymentSchema,
    ProblemSchema,
    ReadinessSchema,
    WebhookEndpointPageSchema,
    now_utc,
)
from web.webhooks import CreateEndpointSchema

bp = Blueprint("openapi", __name__)

JSON = "application/json"
BEARER = "bearerAuth"


# -- What only the document needs: parameters the views read by hand. -------

class PaymentIdPath(Schema):
    payment_id = fields.UUID(required=True, metadata={
        "description": "A payment id (UUIDv7). Another payer's payment is 404, never 403."})


class EndpointIdPath(Schema):
    endpoint_id = fields.UUID(required=True)


class IdempotencyHeader(Schema):
    idempotency_key = fields.String(
        data_key="Idempotency-Key", required=True,
        validate=[validate.Length(min=1, max=_MAX_KEY_LENGTH),
                  validate.Regexp(r"^[\x20-\x7e]+$")],
        metadata={"description": (
            "1-255 printable ASCII characters. The same key and body again answers "
            "the original payment (Idempotent-Replayed: true); another body, 409.")})


class DeadLetterQuery(Schema):
    class Meta:
        unknown = RAISE

    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))


class DeadLetterPageSchema(Schema):
    data = fields.List(fields.Nested(DeadLetterSchema))


class DeadLetterDetailSchema(Schema):
    payment = fields.Nested(PaymentSchema)
    dead_letters = fields.List(fields.Nested(DeadLetterSchema), data_key="deadLetters")


#: Response bodies, and the properties they may leave out; every other one is
#: always present (null where empty). The plugin marks a property required
#: only when its field is ``required``, which on a dump-only schema would
#: mean nothing to marshmallow.
_RESPONSE_OPTIONAL: dict[str, frozenset[str]] = {
    name: frozenset() for name in (
        "Payment", "PaymentSummary", "Attempt", "PaymentPage", "Cancelled", "Event",
        "EventPage", "WebhookEndpoint", "CreatedWebhookEndpoint", "WebhookEndpointPage",
        "DeadLetterPage", "DeadLetterDetail", "DeadLetterAction", "Health", "Readiness")
} | {
    "Problem": frozenset({"errors"}),  # only VALIDATION_FAILED has per-field messages
    # The open list leaves out what an open letter cannot have yet.
    "DeadLetter": frozenset({"resolution", "resolvedBy", "resolvedAt", "note"}),
}


# -- Responses. ---------------------------------------------------------------

def _json(description: str, schema, headers: dict | None = None) -> dict:
    response = {"description": description, "content": {JSON: {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def _problem(description: str) -> dict:
    return {"description": description, "content": {PROBLEM_JSON: {"schema": "Problem"}}}


_UNAUTHENTICATED = {
    "description": "No bearer key, or an unknown or revoked one (UNAUTHENTICATED).",
    "headers": {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
    "content": {PROBLEM_JSON: {"schema": "Problem"}},
}
_NOT_ADMIN = "A non-admin key sees 404 here, as if the endpoint did not exist."
_GATEWAY_UNAVAILABLE = _problem("The gateway could not be asked (GATEWAY_UNAVAILABLE).")
_LOCATION = {"required": True, "schema": {"type": "string", "format": "uri-reference"},
             "description": "The created resource."}


def _operation(summary: str, responses: dict, **extra) -> dict:
    return {"summary": summary, "responses": responses, **extra}


def _body(schema, *, required: bool = True) -> dict:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def operations(config: Config) -> dict[str, dict]:
    """Flask endpoint -> the operation it serves. ``build_document`` adds the
    path parameters, and security and 401 to every /v1 operation."""
    # The create schema's time rules need a clock; its fields do not.
    create_payment = CreatePaymentSchema(config, now_utc)
    too_large = _problem(f"The body is larger than {config.max_body_bytes} bytes.")
    return {
        "health.healthz": _operation("Liveness: the process is up.", {
            "200": _json("Up.", HealthSchema)}),
        "health.readyz": _operation("Readiness: Postgres and Redis are reachable.", {
            "200": _json("Ready.", ReadinessSchema),
            "503": _json("A dependency is down; checks says which.", ReadinessSchema)}),
        "payments.create": _operation(
            "Schedule a payment.", {
                "201": _json("Created, or the replay of an earlier create with this key and body.",
                             PaymentSchema, headers={
                                 "Location": _LOCATION,
                                 "Idempotent-Replayed": {
                                     "schema": {"type": "string", "enum": ["true"]},
                                     "description": "Present (true) when this answers a replay."}}),
                "400": _problem("No or a bad Idempotency-Key, bad JSON, or an invalid body "
                                "(VALIDATION_FAILED, messages per field in errors)."),
                "409": _problem("This Idempotency-Key was used with another body "
                                "(IDEMPOTENCY_KEY_REUSED)."),
                "413": too_large,
                "415": _problem("The body is not application/json."),
            },
            parameters=[{"in": "header", "schema": IdempotencyHeader}],
            requestBody=_body(create_payment)),
        "payments.index": _operation(
            "The caller's payments, newest first (keyset pagination).", {
                "200": _json("A page; nextCursor is null on the last one.", PaymentPageSchema),
                "400": _problem("A bad status, limit or cursor."),
            },
            parameters=[{"in": "query", "schema": ListQuerySchema}]),
        "payments.show": _operation(
            "One payment with its attempts, oldest first.", {
                "200": _json("The payment.", PaymentSchema),
                "404": _problem("No such payment, or another payer's."),
            }),
        "payments.cancel": _operation(
            "Cancel a payment; cancelling a cancelled one is 200 again.", {
                "200": _json("Cancelled. The payment stays readable.", CancelledSchema),
                "404": _problem("No such payment, or another payer's."),
                "409": _problem("Too late: ALREADY_PROCESSING, ALREADY_COMPLETED, ALREADY_FAILED, "
                                "or OUTCOME_IN_DOUBT."),
            }),
        "events.feed": _operation(
            "The caller's payment events, oldest first, resumable.", {
                "200": _json("Events after the cursor.", EventPageSchema),
                "400": _problem("A bad after or limit."),
            },
            parameters=[{"in": "query", "schema": FeedQuerySchema}]),
        "webhooks.create": _operation(
            "Register a URL the caller's events are POSTed to, signed.", {
                "201": _json("Registered; the secret is shown this once.",
                             CreatedWebhookEndpointSchema, headers={"Location": _LOCATION}),
                "400": _problem("Bad JSON, an invalid url, or one whose host does not "
                                "resolve to public addresses only."),
                "413": too_large,
                "415": _problem("The body is not application/json."),
            },
            requestBody=_body(CreateEndpointSchema)),
        "webhooks.index": _operation("The caller's webhook endpoints.", {
            "200": _json("Every endpoint (without secrets).", WebhookEndpointPageSchema)}),
        "webhooks.delete": _operation("Stop sending events to an endpoint.", {
            "204": {"description": "Deleted."},
            "404": _problem("No such endpoint, or another payer's."),
        }),
        "admin.index": _operation(
            "Open dead letters (admin).", {
                "200": _json("Open dead letters.", DeadLetterPageSchema),
                "400": _problem("A bad limit."),
                "404": _problem(_NOT_ADMIN),
            },
            parameters=[{"in": "query", "schema": DeadLetterQuery}]),
        "admin.show": _operation("A parked payment and its dead letters (admin).", {
            "200": _json("The payment and every dead letter it had.", DeadLetterDetailSchema),
            "404": _problem("No dead letter for this payment. " + _NOT_ADMIN),
        }),
        "admin.redrive": _operation(
            "Re-drive: complete it if the gateway holds the charge, else back to PENDING "
            "with a fresh budget (admin).", {
                "200": _json("What was done.", DeadLetterActionSchema),
                "404": _problem("No dead letter for this payment. " + _NOT_ADMIN),
                "409": _problem("Resolved already, or not re-drivable "
                                "(DEAD_LETTER_ACTION_REFUSED)."),
                "502": _GATEWAY_UNAVAILABLE,
            }),
        "admin.refund": _operation(
            "Refund the charge the gateway holds and close the dead letter (admin).", {
                "200": _json("What was done.", DeadLetterActionSchema),
                "404": _problem("No dead letter for this payment. " + _NOT_ADMIN),
                "409": _problem("Resolved already, or the gateway holds no charge "
                                "(DEAD_LETTER_ACTION_REFUSED)."),
                "502": _GATEWAY_UNAVAILABLE,
            }),
        "admin.dismiss": _operation(
            "Close the dead letter without action, with an optional note (admin).", {
                "200": _json("What was done.", DeadLetterActionSchema),
                "400": _problem("An invalid body."),
                "404": _problem("No dead letter for this payment. " + _NOT_ADMIN),
                "409": _problem("Resolved already (DEAD_LETTER_ACTION_REFUSED)."),
                "413": too_large,
            },
            requestBody=_body(DismissSchema, required=False)),
    }

#: Path converter name -> the schema of its path parameter.
_PATH_PARAMETERS = {"payment_id": PaymentIdPath, "endpoint_id": EndpointIdPath}

#: Operations that create a resource, and where its id goes next (OpenAPI
#: links, which also let a stateful client chain create -> read -> cancel).
_LINKS = {
    "payments.create": ("201", "payment_id", ("payments.show", "payments.cancel")),
    "webhooks.create": ("201", "endpoint_id", ("webhooks.delete",)),
}

_CONVERTER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def openapi_path(rule: str) -> str:
    """``/v1/x/<payment_id>`` -> ``/v1/x/{payment_id}``."""
    return _CONVERTER.sub(r"{\1}", rule)


def operation_id(endpoint: str) -> str:
    return endpoint.replace(".", "_")


def _schema_name(schema) -> str:
    """Component names: the class name without ``Schema``; the list item
    (``exclude=("attempts",)``) gets its own name instead of ``Payment1``."""
    name = resolve_schema_cls(schema).__name__.removesuffix("Schema")
    if isinstance(schema, Schema) and schema.exclude:
        return f"{name}Summary"
    return name


def build_document(app: Flask) -> dict:
    """The document for this app: its routes and its configuration."""
    config: Config = app.extensions["paycron.config"]
    spec = APISpec(
        title="paycron", version="1", openapi_version="3.1.0",
        plugins=[MarshmallowPlugin(schema_name_resolver=_schema_name)],
        info={"description": (
            "Scheduled payments. Money is integer minor units; times are RFC 3339 "
            "with an offset. Every error is application/problem+json (RFC 9457) "
            "with a stable machine code.")},
    )
    spec.components.security_scheme(BEARER, {
        "type": "http", "scheme": "bearer",
        "description": "An API key from `paycron api-key create`; its actor is the payer."})
    spec.components.schema("Problem", schema=ProblemSchema)

    documented = operations(config)
    by_path: dict[str, dict[str, dict]] = defaultdict(dict)
    for rule in app.url_map.iter_rules():
        operation = documented.get(rule.endpoint)
        if operation is None:
            continue
        (method,) = rule.methods - {"HEAD", "OPTIONS"}
        path = openapi_path(rule.rule)
        operation = {**operation, "operationId": operation_id(rule.endpoint),
                     "responses": dict(operation["responses"])}
        if path.startswith("/v1/"):
            operation["security"] = [{BEARER: []}]
            operation["responses"]["401"] = _UNAUTHENTICATED
            operation["tags"] = [path.split("/")[2]]
        else:
            operation["security"] = []
            operation["tags"] = ["health"]
        if rule.endpoint in _LINKS:
            status, argument, targets = _LINKS[rule.endpoint]
            operation["responses"][status] = {**operation["responses"][status], "links": {
                operation_id(target): {"operationId": operation_id(target),
                                       "parameters": {argument: "$response.body#/id"}}
                for target in targets}}
        operation["parameters"] = [
            *({"in": "path", "schema": _PATH_PARAMETERS[name]} for name in sorted(rule.arguments)),
            *operation.get("parameters", ())]
        by_path[path][method.lower()] = operation

    for path in sorted(by_path):
        spec.path(path=path, operations=by_path[path])

    document = spec.to_dict()
    _apply_config(document, config)
    schemas = document["components"]["schemas"]
    for name, optional in _RESPONSE_OPTIONAL.items():
        if name in schemas:
            schemas[name]["required"] = [p for p in schemas[name]["properties"]
                                         if p not in optional]
    for path in document["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", ()):
                _absent_not_null(parameter["schema"])
    return document


def _absent_not_null(schema: dict) -> None:
    """A parameter is left out, never null: ``load_default=None`` makes the
    plugin say ``null`` is a value, which in a query string it cannot be."""
    if isinstance(schema.get("type"), list):
        types = [t for t in schema["type"] if t != "null"]
        schema["type"] = types[0] if len(types) == 1 else types
    if "enum" in schema:
        schema["enum"] = [v for v in schema["enum"] if v is not None]
    if "default" in schema and schema["default"] is None:
        del schema["default"]


def _apply_config(document: dict, config: Config) -> None:
    """What the create schema checks against settings, not with validators:
    the amount ceiling, and the setting names in its descriptions."""
    schemas = document["components"]["schemas"]
    amount = schemas["CreatePayment"]["properties"]["amount"]
    amount["maximum"] = config.max_amount_minor
    amount["description"] = amount["description"].replace(
        "MAX_AMOUNT_MINOR", str(config.max_amount_minor))
    due_at = schemas["CreatePayment"]["properties"]["dueAt"]
    due_at["description"] = due_at["description"].replace(
        "HORIZON_DAYS", f"{config.horizon_days} days")
    currency = schemas["CreatePayment"]["properties"]["currency"]
    currency["description"] = currency["description"].replace(
        "DEFAULT_CURRENCY", config.default_currency)


@bp.get("/openapi.json")
def document():
    """Built on first request and kept: routes and config do not change."""
    cached = current_app.extensions.get("paycron.openapi")
    if cached is None:
        cached = current_app.extensions["paycron.openapi"] = build_document(current_app)
    return jsonify(cached)
