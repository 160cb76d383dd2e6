"""``/v1/scheduled-payments``: create, read, list, cancel.

The API never enqueues work: it writes rows, and the database is the schedule.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID

import orjson
import psycopg
from flask import Response, current_app, g, request
from marshmallow import (
    Schema,
    ValidationError,
    fields,
    missing,
    post_load,
    validate,
    validates,
    validates_schema,
)

from paycron.config import Config
from paycron.domain.enums import CancelOutcome, Status
from paycron.domain.ids import parse_payment_id
from paycron.domain.money import ISO_4217
from paycron.errors import (
    CancelRefused,
    NotFound,
    PaycronError,
    PaymentMethodNotCustomers,
    ProcessorUnavailable,
    ValidationFailed,
)
from paycron.processors.factory import amount_rules
from paycron.store import customers, payments, transitions
from paycron.store.db import bounded_write
from paycron.store.payments import NewPayment
from web.api import Blueprint, document_schema, json_body, links
from web.auth import require_key
from web.bodies import headers, json_object, load
from web.problems import (
    IDEMPOTENCY_KEY_INVALID,
    IDEMPOTENCY_KEY_MISSING,
    NOT_JSON,
    TOO_LARGE,
    problem,
)
from web.schemas import (
    NO_NUL,
    Cursor,
    MinorUnits,
    PathId,
    PaymentSchema,
    PaymentSummarySchema,
    ResponseSchema,
    Strict,
    compiled_dump,
    unicode_text,
)

log = logging.getLogger("paycron.web")

bp = Blueprint(
    "payments",
    __name__,
    url_prefix="/v1/scheduled-payments",
    description="Scheduled payments: create, read, list, cancel.",
)

#: dueAt as the API parses it: RFC 3339 with an explicit offset, upper-case
#: ``T``/``Z`` and no leap second (``datetime.fromisoformat`` takes neither).
DUE_AT_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-5][0-9](\.[0-9]+)?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})$"
)
#: The create body's name in the document, which describes the app's own instance.
CREATE_PAYMENT = "CreatePayment"


#: How the document states the Stripe rules beside the amount's limit.
STRIPE_AMOUNT_RULES = (
    " With this processor (Stripe), also at least Stripe's minimum charge in the currency "
    "(e.g. 50 in USD or EUR, 30 in GBP, 50 in JPY); whole units in zero-decimal currencies "
    "(JPY, KRW, ...: 500 is 500 JPY), a multiple of 100 in ISK and UGX, and ending in 0 in "
    "the three-decimal BHD, JOD, KWD, OMR and TND."
)


#: How the document states which customers a payer may name (docs/customers.md).
CUSTOMER_BINDING_TEXT = {
    "first_use": (
        "Only a customer bound to this payer: one an admin registered to it, or one no "
        "payer had named before (the first payer to name an unregistered customer gets it); "
        "any other is refused (CUSTOMER_NOT_YOURS)."
    ),
    "registered": (
        "Only a customer an admin registered to this payer; any other is refused "
        "(CUSTOMER_NOT_YOURS)."
    ),
}
#: ...and that the processor is asked whose the payment method is.
METHOD_CHECK_TEXT = (
    "Where the processor can tell (Stripe), it must be a method of the customer named (or "
    "attached to none): else 400 PAYMENT_METHOD_NOT_CUSTOMERS. "
)


class ProcessorToken(fields.String):
    """A processor's opaque token (Stripe ``pm_…``, ``cus_…``): 1-255
    printable ASCII characters, like an Idempotency-Key. Optional (null when
    absent) unless the app's processor needs it: :meth:`require`."""

    #: Stated in the document; checked by :func:`_printable_token`.
    PATTERN = r"^[\x20-\x7e]+$"

    def __init__(self, name: str, **kwargs):
        super().__init__(
            data_key=name,
            load_default=None,
            allow_none=True,
            validate=[
                validate.Length(min=1, max=255, error=f"{name} must be 1-255 characters"),
                _printable_token(name),
            ],
            error_messages={
                "required": f"{name} is required with this processor",
                "null": f"{name} is required with this processor",
            },
            **kwargs,
        )
        self.metadata = {**self.metadata, "pattern": self.PATTERN}

    def require(self) -> None:
        """Required and not null (the processor charges a customer's payment method)."""
        self.required, self.allow_none, self.load_default = True, False, missing


def _printable_token(name: str) -> Callable[[str], None]:
    def validate_token(value: str) -> None:
        unicode_text(value)  # a lone surrogate: its own message, as in every text field
        if not _PRINTABLE_TOKEN.match(value):
            raise ValidationError(f"{name} must be printable ASCII characters")

    return validate_token


_PRINTABLE_TOKEN = re.compile(ProcessorToken.PATTERN)


class CreatePaymentSchema(Strict):
    """The create body, loaded into a :class:`NewPayment`. The limits that are
    settings come from the config it is built with, so an app's schema both
    checks them and states them in its document."""

    payee = fields.String(
        required=True,
        validate=[
            validate.Length(min=1, max=200),
            unicode_text,
            validate.Regexp(NO_NUL, error="payee must not contain U+0000"),
        ],
        metadata={"description": "Who is paid."},
    )
    amount = MinorUnits(
        required=True,
        validate=validate.Range(min=1, error="amount must be greater than 0"),
        error_messages={"invalid": "amount must be an integer number of minor units"},
        metadata={
            "description": (
                "Integer minor units of the currency (cents for USD): a JSON integer, "
                'not 25.0, not "25". At most {max_amount_minor}.'
            )
        },
    )
    due_at = fields.AwareDateTime(
        data_key="dueAt",
        required=True,
        format="iso",
        metadata={
            "pattern": DUE_AT_PATTERN,
            "description": (
                "When to charge: an RFC 3339 date-time with an explicit offset "
                "(Z or ±hh:mm), in the future and within {horizon_days} days."
            ),
        },
    )
    currency = fields.String(
        load_default=None,
        validate=validate.OneOf(
            sorted(ISO_4217), error="currency must be an ISO 4217 code, e.g. USD"
        ),
        metadata={"description": "ISO 4217 code; {default_currency} when absent or null."},
    )
    payment_method = ProcessorToken(
        "paymentMethod",
        metadata={
            "description": (
                "The processor's payment method to charge (Stripe: pm_...), an opaque token. "
                "{method_check}{processor_fields}"
            )
        },
    )
    customer = ProcessorToken(
        "customer",
        metadata={
            "description": (
                "The processor's customer the payment method belongs to (Stripe: cus_...), an "
                "opaque token. {customer_binding} {processor_fields}"
            )
        },
    )

    def __init__(self, config: Config, clock: Callable[[], datetime], **kwargs):
        super().__init__(**kwargs)
        self.config, self.clock = config, clock
        amount = self.fields["amount"]
        amount.validators = [
            *amount.validators,
            validate.Range(max=config.max_amount_minor, error="amount must be at most {max}"),
        ]
        # The processor's own amount and currency rules, where it has some.
        self.processor_rules = rules = amount_rules(config)
        if config.needs_customer:
            for name in ("payment_method", "customer"):
                self.fields[name].require()
        texts = {
            **vars(config),
            "customer_binding": CUSTOMER_BINDING_TEXT[config.customer_binding],
            "method_check": METHOD_CHECK_TEXT if config.payment_method_check else "",
            "processor_fields": (
                "Required with this processor."
                if config.needs_customer
                else "Optional with this processor; null when absent."
            ),
        }
        if rules is not None:
            currency = self.fields["currency"]
            currency.validators = [
                *currency.validators,
                validate.OneOf(
                    sorted(rules.CURRENCIES & ISO_4217), error=rules.UNSUPPORTED_CURRENCY
                ),
            ]
            amount.validators.append(
                validate.Range(
                    max=rules.MAX_AMOUNT, error=(rules.amount_problem(rules.MAX_AMOUNT + 1, "USD"))
                )
            )
            texts["max_amount_minor"] = min(config.max_amount_minor, rules.MAX_AMOUNT)
            amount.metadata = {
                **amount.metadata,
                "description": amount.metadata["description"] + STRIPE_AMOUNT_RULES,
            }
        for field in self.fields.values():
            field.metadata = {
                **field.metadata,
                "description": field.metadata["description"].format(**texts),
            }

    @validates("due_at")
    def _due_window(self, value: datetime, data_key: str) -> None:
        now = self.clock()
        if value <= now:
            raise ValidationError("dueAt must be in the future")
        if value > now + timedelta(days=self.config.horizon_days):
            raise ValidationError(f"dueAt must be within {self.config.horizon_days} days")

    @validates_schema(skip_on_field_errors=False)
    def _processor_accepts(self, data: dict, **kwargs) -> None:
        """The processor's own rules for the amount in its currency (Stripe:
        :mod:`paycron.processors.stripe.amounts`), once both loaded. A currency given is
        checked by the field (so the document lists the processor's); the
        default, here."""
        if self.processor_rules is None or "currency" not in data:
            return
        currency = data["currency"] or self.config.default_currency
        problem = self.processor_rules.currency_problem(currency)
        if problem is not None:
            raise ValidationError({"currency": [problem]})
        if "amount" in data:
            problem = self.processor_rules.amount_problem(data["amount"], currency)
            if problem is not None:
                raise ValidationError({"amount": [problem]})

    @post_load
    def _new_payment(self, data: dict, **kwargs) -> NewPayment:
        return NewPayment(
            payee=data["payee"],
            amount_minor=data["amount"],
            currency=data["currency"] or self.config.default_currency,
            due_at=data["due_at"].astimezone(UTC),
            payment_method=data["payment_method"],
            customer=data["customer"],
        )


#: What an Idempotency-Key may hold (with 1-255 characters of it).
_PRINTABLE_KEY = re.compile(r"^[\x20-\x7e]*$")


class IdempotencyKeyHeader(Schema):
    # Its messages are the ones web.problems answers with codes of their own.
    idempotency_key = fields.String(
        data_key="Idempotency-Key",
        required=True,
        error_messages={"required": IDEMPOTENCY_KEY_MISSING},
        validate=[
            validate.Length(min=1, error=IDEMPOTENCY_KEY_MISSING),
            validate.Length(max=255, error=IDEMPOTENCY_KEY_INVALID),
            validate.Regexp(_PRINTABLE_KEY, error=IDEMPOTENCY_KEY_INVALID),
        ],
        metadata={
            "description": (
                "1-255 printable ASCII characters. The same key and body again answers "
                "the original payment (Idempotent-Replayed: true); another body, 409."
            )
        },
    )


_KEY_HEADER = IdempotencyKeyHeader()


def request_idempotency_key() -> str:
    """The request's Idempotency-Key: a usable one is taken here, with the
    schema's own rules (a few µs where loading the schema took about 25);
    anything else is loaded by the schema, which answers the refusal."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and 0 < len(key) <= 255 and _PRINTABLE_KEY.match(key):
        return key
    return load(_KEY_HEADER, headers(_KEY_HEADER))["idempotency_key"]


class PaymentPath(Schema):
    payment_id = PathId(
        parse_payment_id,
        "no such payment",
        metadata={
            "description": "A payment id (UUIDv7). Another payer's payment is 404, never 403."
        },
    )


class ListQuerySchema(Strict):
    status = fields.String(validate=validate.OneOf([s.value for s in Status]))
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))
    cursor = Cursor(
        datetime,
        UUID,
        metadata={
            "format": "payment-cursor",
            "description": "Opaque: the nextCursor of the previous page.",
        },
    )


class PaymentPageSchema(ResponseSchema):
    data = fields.List(fields.Nested(PaymentSummarySchema))
    next_cursor = Cursor(
        datetime,
        UUID,
        data_key="nextCursor",
        allow_none=True,
        metadata={"format": "payment-cursor"},
    )


class CancelledSchema(ResponseSchema):
    id = fields.UUID()
    status = fields.String(metadata={"enum": [Status.CANCELLED.value]})


class PlainCreates:
    """The common create body, checked without marshmallow's machinery: an
    ASCII payee, an amount, a dueAt and perhaps a currency, with no
    processor fields and no processor rules. It answers exactly what
    :class:`CreatePaymentSchema` would load, or None, and the schema then
    decides (every refusal, every other shape): the schema costs a create
    about 0.1 ms of CPU, this a few µs. A property test holds the two to the
    same answers (tests/web/test_batch_items.py)."""

    FIELDS = frozenset({"payee", "amount", "dueAt", "currency"})

    def __init__(self, schema: CreatePaymentSchema):
        config = schema.config
        self.enabled = schema.processor_rules is None and not config.needs_customer
        self.clock, self.horizon = schema.clock, timedelta(days=config.horizon_days)
        self.max_amount, self.default_currency = config.max_amount_minor, config.default_currency
        self.currencies = frozenset(ISO_4217)

    def load(self, body: dict) -> NewPayment | None:
        if not self.enabled or not body.keys() <= self.FIELDS:
            return None
        return self.new_payment(body)

    def new_payment(self, body: dict) -> NewPayment | None:
        """The payment of a body's fields, or None; other fields are the
        caller's to have refused."""
        payee, amount, due = body.get("payee"), body.get("amount"), body.get("dueAt")
        currency = body.get("currency")
        if not (
            type(payee) is str
            and 1 <= len(payee) <= 200
            and payee.isascii()
            and "\x00" not in payee
            and type(amount) is int
            and 1 <= amount <= self.max_amount
            and type(due) is str
            and (currency is None or (type(currency) is str and currency in self.currencies))
        ):
            return None
        try:
            due_at = datetime.fromisoformat(due)
        except ValueError:
            return None
        if due_at.tzinfo is None:
            return None
        now = self.clock()
        if not now < due_at <= now + self.horizon:
            return None
        return NewPayment(
            payee=payee,
            amount_minor=amount,
            currency=currency or self.default_currency,
            due_at=due_at.astimezone(UTC),
        )


@bp.record_once
def _build_create_schema(state) -> None:
    # One schema per app, from its config and clock: building one per request
    # costs as much as loading, and schemas keep no per-load state, so the
    # gthread workers share it. The app's document describes this instance.
    extensions = state.app.extensions
    schema = CreatePaymentSchema(extensions["paycron.config"], extensions["paycron.clock"])
    extensions["paycron.create_schema"] = document_schema(state.app, CREATE_PAYMENT, schema)
    extensions["paycron.plain_creates"] = PlainCreates(schema)


def _pool():
    return current_app.extensions["paycron.pool"]


def _create_pool():
    return current_app.extensions["paycron.create_pool"]


_CREATED_HEADERS = {
    "Location": {
        "required": True,
        "description": "The created resource.",
        "schema": {"type": "string", "format": "uri-reference"},
    },
    "Idempotent-Replayed": {
        "description": "Present (true) when this answers a replay.",
        "schema": {"type": "string", "enum": ["true"]},
    },
}


@bp.post("")
@require_key
@bp.doc(
    parameters=[{"in": "header", "schema": _KEY_HEADER}],
    requestBody=json_body(CREATE_PAYMENT),
    responses={201: {"links": links("payment_id", "payments_show", "payments_cancel")}},
)
@bp.response(
    201,
    PaymentSchema,
    headers=_CREATED_HEADERS,
    description=("Created, or the replay of an earlier create with this key and body."),
)
@bp.alt_response(
    400,
    **problem(
        "No or a bad Idempotency-Key, bad JSON, an invalid body "
        "(VALIDATION_FAILED, messages per field in errors), or a "
        "customer not bound to this payer (CUSTOMER_NOT_YOURS, "
        "the message in errors.customer), or a payment method the processor holds for "
        "another customer or not at all (PAYMENT_METHOD_NOT_CUSTOMERS, the message in "
        "errors.paymentMethod). Nothing is created."
    ),
)
@bp.alt_response(
    409, **problem("This Idempotency-Key was used with another body (IDEMPOTENCY_KEY_REUSED).")
)
@bp.alt_response(413, **TOO_LARGE)
@bp.alt_response(415, **NOT_JSON)
@bp.alt_response(
    503,
    **problem(
        "The database could not confirm the create: OUTCOME_UNKNOWN (it may or may not exist; "
        "retry with the same Idempotency-Key, which returns it or creates it once), "
        "UNAVAILABLE (nothing was created), or PROCESSOR_UNAVAILABLE (the processor did not "
        "say in time whose the payment method is; nothing was created: retry)."
    ),
)
def create():
    """Schedule a payment.

    The same Idempotency-Key and body again answer the original payment, also
    once its dueAt has passed.
    ---
    The create loads its inputs itself, in the order its rules need, with the
    schemas ``@bp.doc`` documents (not ``@bp.arguments``): the body as JSON
    (415/413/400), the key (400), then the body's schema. When that refuses,
    the key is looked up first, so a replay is answered even when its body no
    longer validates (its dueAt has passed since the first create). Valid
    creates skip that round trip: the insert itself detects a used key (ON
    CONFLICT). Loading the key here also costs a third of what webargs does
    on this hot path.

    Every write here is bounded by ``WEB_STATEMENT_TIMEOUT``, its wait for
    the synchronous standby included (:func:`paycron.store.db.bounded_write`): a
    create whose wait was cut, or whose connection was lost, answers 503
    OUTCOME_UNKNOWN, and a replay answers only a payment the standby holds.
    """
    actor = g.principal.actor
    body = json_object()
    idempotency_key = request_idempotency_key()
    body_hash = payments.request_hash(body)
    new = current_app.extensions["paycron.plain_creates"].load(body)
    if new is None:
        try:
            new = load(current_app.extensions["paycron.create_schema"], body)
        except ValidationFailed as refused:
            return _replay_or_raise(actor, idempotency_key, body_hash, refused)
    config = current_app.extensions["paycron.config"]
    refused_method = _payment_method_refusal(actor, new, config)
    if refused_method is not None:
        return _replay_or_raise(actor, idempotency_key, body_hash, refused_method)
    params = payments.creation(
        actor=actor,
        key=idempotency_key,
        body_hash=body_hash,
        new=new,
        processor=config.gateway,
        smear_seconds=config.smear_seconds,
    )
    # First on a session that plans the create once (the create pool, see
    # web.create_app), where only the create and its NOTIFY run: a create
    # that writes nothing there (its key was used, or its customer is not
    # this payer's yet) is done again as a whole on the usual pool, which
    # answers the replay or the refusal. Both within one WEB_STATEMENT_TIMEOUT.
    bound = _write_bound()
    deadline = time.monotonic() + bound
    with _create_pool().connection() as conn, bounded_write(conn, bound):
        created = payments.insert_payment(conn, params)
        if created is not None:
            _announce_if_due_soon(conn, created, config)
    if created is None:
        left = max(0.001, deadline - time.monotonic()) if bound else bound
        with _pool().connection() as conn, bounded_write(conn, left):
            created = payments.create_payment(
                conn,
                actor=actor,
                key=idempotency_key,
                body_hash=body_hash,
                new=new,
                processor=config.gateway,
                smear_seconds=config.smear_seconds,
                binding=config.customer_binding,
            )
            if created.replayed:
                payments.confirm_replicated(conn, actor=actor, key=idempotency_key)
            else:
                _announce_if_due_soon(conn, created, config)
    return _created(created.payment, created.replayed)


def _announce_if_due_soon(conn, created: payments.Created, config: Config) -> None:
    """A payment created due within the sweep interval wakes a sweeper now
    (its row committed: the sweeper's claim sees it). The payment is
    committed already, so a NOTIFY that fails (cancelled at the write's
    bound, a connection lost) does not fail the create: answering 503 would
    tell the client nothing was created, and a retry under a new key would
    schedule it twice. The next sweep claims it instead."""
    if config.prompt_start and created.payment["run_at"] <= datetime.now(UTC) + timedelta(
        seconds=config.sweep_interval_seconds
    ):
        try:
            payments.notify_due(conn)
        except psycopg.Error as exc:
            log.warning(
                "a payment due soon was created but not announced (%s): the next sweep claims it",
                type(exc).__name__,
            )


def _replay_or_raise(actor: str, key: str, body_hash: bytes, refused: PaycronError):
    """The replay of an earlier create with this key and body, else ``refused``
    raised: a replay is answered whatever refuses the body now."""
    with _pool().connection() as conn, bounded_write(conn, _write_bound()):
        replay = payments.find_replay(conn, actor, key, body_hash)
        if replay is not None:
            payments.confirm_replicated(conn, actor=actor, key=key)
    if replay is None:
        raise refused
    return _created(replay, replayed=True)


def _payment_method_refusal(actor: str, new: NewPayment, config: Config) -> PaycronError | None:
    """Why the processor's word refuses this create's payment method, if it
    does (docs/customers.md): PaymentMethodNotCustomers, or
    ProcessorUnavailable when it did not answer in time. Asked only when the
    customer is one the payer may name, so no payer learns anything about
    another's customers' methods; before anything is written."""
    check = current_app.extensions["paycron.payment_method_check"]
    if check is None or new.customer is None or new.payment_method is None:
        return None
    with _pool().connection() as conn:
        owner = customers.owners(conn, config.gateway, [new.customer]).get(new.customer)
    if customers.refusal(owner, actor, config.customer_binding) is not None:
        return None  # the create itself refuses the customer
    try:
        if check.refused([(new.customer, new.payment_method)]):
            return PaymentMethodNotCustomers()
    except ProcessorUnavailable as unavailable:
        return unavailable
    return None


def _write_bound() -> float:
    return current_app.extensions["paycron.config"].web_statement_timeout


def _created(payment: dict, replayed: bool):
    """The 201 as the route documents it (PaymentSchema), dumped by
    :func:`web.schemas.compiled_dump` rather than by the schema and encoded
    by orjson (the response made in 7 µs where jsonify's took 18): a
    response object passes through flask-smorest as it is."""
    headers = {"Location": f"{bp.url_prefix}/{payment['id']}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(
        orjson.dumps(_dump_payment(payment), option=orjson.OPT_APPEND_NEWLINE),
        status=201,
        headers=headers,
        mimetype="application/json",
    )


_dump_payment = compiled_dump(PaymentSchema())


@bp.get("/<id:payment_id>")
@require_key
@bp.path(PaymentPath())
@bp.response(200, PaymentSchema, description="The payment.")
@bp.alt_response(404, **problem("No such payment, or another payer's."))
def show(payment_id: UUID):
    """One payment with its attempts, oldest first."""
    with _pool().connection() as conn:
        row = payments.get_payment(conn, payment_id, actor=g.principal.actor)
    if row is None:
        raise NotFound("no such payment")
    return row


@bp.delete("/<id:payment_id>")
@require_key
@bp.path(PaymentPath())
@bp.response(200, CancelledSchema, description="Cancelled. The payment stays readable.")
@bp.alt_response(404, **problem("No such payment, or another payer's."))
@bp.alt_response(
    409,
    **problem(
        "Too late: ALREADY_PROCESSING, ALREADY_COMPLETED, ALREADY_FAILED, or OUTCOME_IN_DOUBT."
    ),
)
def cancel(payment_id: UUID):
    """Cancel a payment; cancelling a cancelled one is 200 again."""
    with _pool().connection() as conn:
        outcome = transitions.cancel(conn, payment_id, actor=g.principal.actor)
    if outcome is CancelOutcome.NOT_FOUND:
        raise NotFound("no such payment")
    if outcome is not CancelOutcome.CANCELLED:
        raise CancelRefused(outcome)
    return {"id": payment_id, "status": Status.CANCELLED.value}


@bp.get("")
@require_key
@bp.arguments(ListQuerySchema(), location="query", as_kwargs=True)
@bp.response(
    200,
    PaymentPageSchema,
    description=(
        "A page; nextCursor is null on the last one. A page may hold fewer than "
        "limit items, even none, while nextCursor is not null: follow the cursor "
        "until it is null."
    ),
)
@bp.alt_response(400, **problem("A bad status, limit or cursor."))
def index(limit: int, status: str | None = None, cursor: tuple | None = None):
    """The caller's payments, newest first (keyset pagination).

    Each request reads a bounded stretch of the caller's history: with a
    status filter, at most 4 x limit payments are looked at, and the page
    holds the matches among them. So a page may hold fewer than limit items,
    even none, while nextCursor is not null: clients follow the cursor until
    it is null. No payment is skipped or repeated across pages.
    """
    with _pool().connection() as conn:
        page, next_key = payments.list_payments(
            conn, actor=g.principal.actor, status=status, limit=limit, after=cursor
        )
    return {"data": page, "next_cursor": next_key}
