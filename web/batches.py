"""``POST /v1/scheduled-payments/batch``: many creates in one request.

Each item is a single create (``web.payments``) with its Idempotency-Key in
the body: validated by the same schema, keyed in the same (actor, key)
namespace, hashed the same way (the item without its key), and answered in
its own result — created, replayed, or refused (400 or 409) without
stopping the others. The batch's payments are written set-based
(``paycron.store.batches``). What is wrong with the request as a whole
(not JSON, not an object, no items, too many, too large, the actor's rate
limit) refuses it whole, before anything is written. See ``docs/batch.md``.
"""

from __future__ import annotations

import re

import orjson
from flask import Response, current_app, g, request
from marshmallow import ValidationError, fields, post_load, utils, validate

from paycron.config import Config
from paycron.errors import PaycronError, PaymentMethodNotCustomers, ValidationFailed
from paycron.store import batches, customers
from paycron.store.batches import BatchItem
from paycron.store.db import bounded_write
from paycron.store.payments import Created, NewPayment, request_hash
from web.api import Blueprint, document_schema, json_body
from web.auth import charge, require_key
from web.bodies import json_object, load
from web.payments import CreatePaymentSchema, PlainCreates
from web.problems import NOT_JSON, Problem, ProblemSchema, error_body, problem
from web.schemas import PaymentSchema, ResponseSchema, Strict, compiled_dump
from web.turns import in_turns

bp = Blueprint(
    "batches",
    __name__,
    url_prefix="/v1/scheduled-payments",
    description="Batch create: many scheduled payments in one request.",
)

#: Component names in the document (the item and envelope describe the app's own limits).
BATCH_ITEM = "BatchItem"
BATCH_REQUEST = "BatchRequest"
KEY = "idempotencyKey"
#: Where an item that is not a JSON object gets its message.
NOT_AN_OBJECT = {"_schema": ["an item must be a JSON object"]}


class BatchItemSchema(CreatePaymentSchema):
    """An item: a create's body plus its Idempotency-Key. Loaded into
    ``(key, NewPayment)``; every other field is the single create's own."""

    idempotency_key = fields.String(
        data_key=KEY,
        required=True,
        load_only=True,
        validate=[
            validate.Length(min=1, max=255, error=f"{KEY} must be 1-255 characters"),
            validate.Regexp(r"^[\x20-\x7e]*$", error=f"{KEY} must be printable ASCII characters"),
        ],
        error_messages={"required": f"{KEY} is required", "null": f"{KEY} is required"},
        metadata={
            "description": (
                "This item's Idempotency-Key, 1-255 printable ASCII characters, in the "
                "namespace of the single create's header: the same key and body again "
                "replay the original payment; another body is this item's 409."
            )
        },
    )

    @post_load
    def _new_payment(self, data: dict, **kwargs):
        return data["idempotency_key"], super()._new_payment(data, **kwargs)


class PlainItems:
    """The common item, checked as :class:`web.payments.PlainCreates` checks
    a create's body, its key included: it answers exactly what
    :class:`BatchItemSchema` would load, or None, and the schema then
    decides: a batch of 1,000 items costs the schema about 100 ms of CPU,
    this a few ms (tests/web/test_batch_items.py)."""

    FIELDS = PlainCreates.FIELDS | {KEY}

    def __init__(self, schema: BatchItemSchema):
        self.bodies = PlainCreates(schema)

    def load(self, item: dict) -> tuple[str, NewPayment] | None:
        if not self.bodies.enabled or not item.keys() <= self.FIELDS:
            return None
        key = item.get(KEY)
        if not (type(key) is str and 1 <= len(key) <= 255 and _PRINTABLE.match(key)):
            return None
        new = self.bodies.new_payment(item)
        return None if new is None else (key, new)


_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")


class _Items(fields.List):
    """The envelope's ``items``: a list, taken as it is (each item is loaded
    on its own afterwards). ``List`` would pass each through its ``Raw``
    field, which accepts anything: ~3 ms per 1,000 items for nothing."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not utils.is_collection(value):
            raise self.make_error("invalid")
        return list(value)


class BatchRequestSchema(Strict):
    """The envelope. Its ``items`` are loaded one by one (BatchItemSchema),
    so a bad item is refused on its own; the document says an item may be
    anything, each being answered in its result."""

    items = _Items(
        fields.Raw(
            allow_none=True,
            metadata={
                "description": "A BatchItem. Anything else is refused in its own result.",
                "anyOf": [{"$ref": f"#/components/schemas/{BATCH_ITEM}"}, {}],
            },
        ),
        required=True,
        validate=validate.Length(min=1, error="items must hold at least one item"),
        error_messages={"required": "items is required", "null": "items is required"},
    )

    def __init__(self, config: Config, **kwargs):
        super().__init__(**kwargs)
        items = self.fields["items"]
        items.metadata = {
            **items.metadata,
            "maxItems": config.batch_max_items,
            "description": (
                f"1 to {config.batch_max_items} (BATCH_MAX_ITEMS) items, each answered "
                "in its own result, in this order."
            ),
        }


class BatchCreatedSchema(ResponseSchema):
    index = fields.Integer(metadata={"description": "The item's position in items, from 0."})
    status = fields.Integer(metadata={"enum": [201]})
    replayed = fields.Boolean(
        metadata={"description": "True when this answers an earlier create with this key."}
    )
    payment = fields.Nested(PaymentSchema)


class BatchRefusedSchema(ResponseSchema):
    index = fields.Integer(metadata={"description": "The item's position in items, from 0."})
    status = fields.Integer(metadata={"enum": [400, 409]})
    error = fields.Nested(ProblemSchema)


class BatchResult(fields.Field):
    """One item's result: a :class:`BatchCreatedSchema` or a
    :class:`BatchRefusedSchema`, as the item went."""

    _created, _refused = staticmethod(compiled_dump(BatchCreatedSchema())), BatchRefusedSchema()

    def __init__(self, **kwargs):
        super().__init__(
            metadata={
                "oneOf": [
                    {"$ref": "#/components/schemas/BatchCreated"},
                    {"$ref": "#/components/schemas/BatchRefused"},
                ]
            },
            **kwargs,
        )

    def _serialize(self, value, attr, obj, **kwargs):
        if "payment" in value:
            return self._created(value)
        return self._refused.dump(value)


class BatchResultsSchema(ResponseSchema):
    results = fields.List(
        BatchResult(), metadata={"description": "One result per item, in the items' order."}
    )


_RESULTS = BatchResultsSchema()


@bp.record_once
def _build_schemas(state) -> None:
    # One of each per app, from its config and clock, as the single create's.
    app = state.app
    config, clock = app.extensions["paycron.config"], app.extensions["paycron.clock"]
    item_schema = document_schema(app, BATCH_ITEM, BatchItemSchema(config, clock))
    app.extensions["paycron.batch_item_schema"] = item_schema
    app.extensions["paycron.batch_plain_items"] = PlainItems(item_schema)
    app.extensions["paycron.batch_request_schema"] = document_schema(
        app, BATCH_REQUEST, BatchRequestSchema(config)
    )
    api = app.extensions["flask-smorest"]["apis"][""]["ext_obj"]
    api.spec.components.schema("BatchCreated", schema=BatchCreatedSchema)
    api.spec.components.schema("BatchRefused", schema=BatchRefusedSchema)


@bp.post("/batch")
@require_key(charged=False)
@bp.doc(requestBody=json_body(BATCH_REQUEST))
@bp.response(
    200,
    BatchResultsSchema,
    description=(
        "The batch was processed: one result per item, in order, each the item's 201 "
        "(created, or replayed: the payment a single create would answer) or its "
        "refusal (400 VALIDATION_FAILED, CUSTOMER_NOT_YOURS or PAYMENT_METHOD_NOT_CUSTOMERS "
        "with messages per field; 409 IDEMPOTENCY_KEY_REUSED)."
    ),
)
@bp.alt_response(
    400,
    **problem(
        "Nothing was written: bad JSON, a body that is not an object, or items missing, "
        "empty or not a list (VALIDATION_FAILED, messages in errors.items)."
    ),
)
@bp.alt_response(
    413,
    **problem(
        "Nothing was written: more than BATCH_MAX_ITEMS items (TOO_MANY_ITEMS, the "
        "limit in detail), or a body over MAX_BATCH_BODY_BYTES (BODY_TOO_LARGE)."
    ),
)
@bp.alt_response(415, **NOT_JSON)
@bp.alt_response(
    503,
    **problem(
        "The database could not confirm the batch: OUTCOME_UNKNOWN (some or all of it "
        "may exist; send the same batch again: every item replays or is created once), "
        "UNAVAILABLE (nothing was created), or PROCESSOR_UNAVAILABLE (the processor did "
        "not say in time whose the items' payment methods are; nothing was created, the "
        "answers it gave are kept: send the same batch again)."
    ),
)
def create_batch():
    """Schedule many payments: one request, one result per item.

    Each item carries its own idempotencyKey and is answered exactly as a
    single create with that Idempotency-Key header and body would be. The
    actor's rate limit is charged one request per item, before anything is
    written (429 for the whole batch). Retrying a whole batch is safe: its
    items replay.
    """
    config: Config = current_app.extensions["paycron.config"]
    actor = g.principal.actor
    request.max_content_length = config.max_batch_body_bytes
    body = json_object()
    items = body.get("items")
    too_many = isinstance(items, list) and len(items) > config.batch_max_items
    try:
        load(current_app.extensions["paycron.batch_request_schema"], body)
    except ValidationFailed:
        if not too_many:
            charge(actor)  # a refused request costs one, like any other
            raise
    if too_many:
        charge(actor)
        raise Problem(
            413,
            "TOO_MANY_ITEMS",
            f"a batch holds at most {config.batch_max_items} items (BATCH_MAX_ITEMS); "
            f"this one has {len(items)}",
        )
    charge(actor, len(items))
    plain = current_app.extensions["paycron.batch_plain_items"]
    prepared = in_turns(items, lambda part: [_prepare(item, plain) for item in part])
    prepared = _refuse_foreign_methods(prepared, actor, config)
    with current_app.extensions["paycron.pool"].connection() as conn:
        with bounded_write(conn, config.web_statement_timeout):
            prepared = _refuse_unpartitioned(conn, prepared, config)
            outcomes = batches.create_batch(
                conn,
                actor=actor,
                items=prepared,
                processor=config.gateway,
                smear_seconds=config.smear_seconds,
                binding=config.customer_binding,
            )
    results = in_turns(_results(outcomes), lambda part: _RESULTS.dump({"results": part})["results"])
    return Response(orjson.dumps({"results": results}, option=_JSON), mimetype="application/json")


#: The answer's JSON by orjson, in a tenth of the json module's time (which
#: was a tenth of a batch's CPU): jsonify's JSON (keys sorted, non-string
#: keys as strings), its non-ASCII text as UTF-8 rather than escaped.
_JSON = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE


def _prepare(item: object, plain: PlainItems) -> BatchItem:
    """An item checked by its schema: the payment it asks for, or its refusal
    (with its key and body hash when the key itself is usable, so a replay
    is still answered whatever else is wrong, as a single create's is)."""
    if not isinstance(item, dict):
        return BatchItem(None, None, refusal=ValidationFailed(NOT_AN_OBJECT))
    body = dict(item)
    body.pop(KEY, None)
    body_hash = request_hash(body)
    loaded = plain.load(item)
    if loaded is not None:
        return BatchItem(loaded[0], body_hash, new=loaded[1])
    try:
        key, new = current_app.extensions["paycron.batch_item_schema"].load(item)
    except ValidationError as exc:
        refusal = ValidationFailed(exc.messages)
        if KEY in exc.messages:
            return BatchItem(None, None, refusal=refusal)
        return BatchItem(item[KEY], body_hash, refusal=refusal)
    return BatchItem(key, body_hash, new=new)


def _refuse_foreign_methods(items: list[BatchItem], actor: str, config: Config) -> list[BatchItem]:
    """Items whose payment method the processor holds for another customer
    (or not at all) are refused as a single create's would be
    (``web.payments._payment_method_refusal``): each distinct (customer,
    method) pair is asked once, and only for customers the payer may name.
    The processor not answering in time refuses the whole batch (503
    PROCESSOR_UNAVAILABLE), before anything is written."""
    check = current_app.extensions["paycron.payment_method_check"]
    named = [
        item.new
        for item in items
        if item.new is not None
        and item.new.customer is not None
        and item.new.payment_method is not None
    ]
    if check is None or not named:
        return items
    with current_app.extensions["paycron.pool"].connection() as conn:
        owners = customers.owners(conn, config.gateway, {new.customer for new in named})
    pairs = {
        (new.customer, new.payment_method)
        for new in named
        if customers.refusal(owners.get(new.customer), actor, config.customer_binding) is None
    }
    refused = check.refused(pairs) if pairs else set()
    if not refused:
        return items
    return [
        BatchItem(item.key, item.body_hash, refusal=PaymentMethodNotCustomers())
        if item.new is not None and (item.new.customer, item.new.payment_method) in refused
        else item
        for item in items
    ]


def _refuse_unpartitioned(conn, items: list[BatchItem], config: Config) -> list[BatchItem]:
    """Items due on a day with no partition (the partition keeper is behind)
    are refused as a dueAt beyond the horizon is: they cannot be stored."""
    missing = batches.days_without_partition(
        conn, (item.new.due_at.date() for item in items if item.new is not None)
    )
    if not missing:
        return items
    beyond = {"dueAt": [f"dueAt must be within {config.horizon_days} days"]}
    return [
        BatchItem(item.key, item.body_hash, refusal=ValidationFailed(beyond))
        if item.new is not None and item.new.due_at.date() in missing
        else item
        for item in items
    ]


def _results(outcomes: list[Created | PaycronError]) -> list[dict]:
    results = []
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, Created):
            results.append(
                {
                    "index": index,
                    "status": 201,
                    "replayed": outcome.replayed,
                    "payment": outcome.payment,
                }
            )
        else:
            error = error_body(outcome)
            results.append({"index": index, "status": error["status"], "error": error})
    return results
