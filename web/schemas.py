"""Request and response schemas (marshmallow). Validation messages are
per field; the create schema's time rules need the config and the clock,
which the app passes to the constructor.

``web/openapi.py`` generates the OpenAPI document from these schemas: a
field's ``metadata`` says what its validators cannot (a description, an
enum, a pattern), and the response-only schemas below exist to describe
bodies that views build by hand."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates

from paycron.config import Config
from paycron.enums import FailureReason, Outcome, Status
from paycron.money import ISO_4217, is_minor_units

#: dueAt as the API parses it: RFC 3339 with an explicit offset, upper-case
#: ``T``/``Z`` and no leap second (``datetime.fromisoformat`` takes neither).
DUE_AT_PATTERN = (r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-5][0-9](\.[0-9]+)?"
                  r"(Z|[+-][0-9]{2}:[0-9]{2})$")
#: Postgres text cannot hold U+0000: a payee containing it is refused here,
#: not by the database (which would be a 500).
NO_NUL = r"^[^\u0000]*$"


def unicode_text(value: str) -> None:
    """A validator for every string the API takes: JSON may escape a lone
    surrogate ("\\ud800"), which is no character and which neither UTF-8 nor
    Postgres text can hold (a 500 if it got that far)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            "must be valid Unicode text: no unpaired surrogate (U+D800 to U+DFFF)") from None


class MinorUnits(fields.Integer):
    """Money: a JSON integer only. marshmallow's Integer without ``strict``
    truncates 25.5 to 25, and marshmallow 3 accepts ``true`` (bool is an int)."""

    def __init__(self, **kwargs):
        super().__init__(strict=True, **kwargs)

    def _validated(self, value):
        if not is_minor_units(value):
            raise self.make_error("invalid")
        return super()._validated(value)


class CreatePaymentSchema(Schema):
    class Meta:
        unknown = RAISE  # mass assignment: payer, status, ... are not the client's

    payee = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=200), unicode_text,
                  validate.Regexp(NO_NUL, error="payee must not contain U+0000")],
        metadata={"description": "Who is paid."})
    amount = MinorUnits(
        required=True,
        error_messages={"invalid": "amount must be an integer number of minor units"},
        metadata={"minimum": 1, "description": (
            "Integer minor units of the currency (cents for USD): a JSON integer, "
            "not 25.0, not \"25\". At most MAX_AMOUNT_MINOR.")})
    due_at = fields.AwareDateTime(
        data_key="dueAt", required=True, format="iso",
        metadata={"pattern": DUE_AT_PATTERN, "description": (
            "When to charge: an RFC 3339 date-time with an explicit offset "
            "(Z or ±hh:mm), in the future and within HORIZON_DAYS.")})
    currency = fields.String(
        load_default=None, validate=validate.OneOf(
            sorted(ISO_4217), error="currency must be an ISO 4217 code, e.g. USD"),
        metadata={"description": "ISO 4217 code; DEFAULT_CURRENCY when absent or null."})

    def __init__(self, config: Config, clock: Callable[[], datetime], **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.clock = clock

    @validates("amount")
    def _amount_range(self, value: int, data_key: str) -> None:
        if value <= 0:
            raise ValidationError("amount must be greater than 0")
        if value > self.config.max_amount_minor:
            raise ValidationError(f"amount must be at most {self.config.max_amount_minor}")

    @validates("due_at")
    def _due_window(self, value: datetime, data_key: str) -> None:
        now = self.clock()
        if value <= now:
            raise ValidationError("dueAt must be in the future")
        if value > now + timedelta(days=self.config.horizon_days):
            raise ValidationError(f"dueAt must be within {self.config.horizon_days} days")


class AttemptSchema(Schema):
    attempt = fields.Integer()
    started_at = fields.AwareDateTime(data_key="startedAt")
    finished_at = fields.AwareDateTime(data_key="finishedAt", allow_none=True)
    outcome = fields.String(metadata={"enum": [o.value for o in Outcome]})
    error_code = fields.String(data_key="errorCode", allow_none=True)
    gateway_ref = fields.String(data_key="gatewayRef", allow_none=True)


class PaymentSchema(Schema):
    id = fields.UUID()
    payer = fields.String()
    payee = fields.String()
    amount = fields.Integer(attribute="amount_minor",
                            metadata={"description": "Integer minor units of the currency."})
    currency = fields.String()
    due_at = fields.AwareDateTime(data_key="dueAt")
    status = fields.String(metadata={"enum": [s.value for s in Status]})
    failure_reason = fields.String(data_key="failureReason", allow_none=True,
                                   metadata={"enum": [r.value for r in FailureReason] + [None]})
    in_doubt = fields.Boolean(data_key="inDoubt")
    next_attempt_at = fields.Method(
        "_next_attempt_at", data_key="nextAttemptAt", allow_none=True,
        metadata={"type": "string", "format": "date-time",
                  "description": "When the next attempt is due; null unless PENDING."})
    refunded_at = fields.AwareDateTime(data_key="refundedAt", allow_none=True)
    created_at = fields.AwareDateTime(data_key="createdAt")
    updated_at = fields.AwareDateTime(data_key="updatedAt")
    attempts = fields.List(fields.Nested(AttemptSchema), dump_default=list)

    def _next_attempt_at(self, row: dict) -> str | None:
        if row["status"] != Status.PENDING:
            return None
        return row["run_at"].astimezone(UTC).isoformat()


class PaymentPageSchema(Schema):
    data = fields.List(fields.Nested(PaymentSchema(exclude=("attempts",))))
    next_cursor = fields.String(data_key="nextCursor", allow_none=True)


class ListQuerySchema(Schema):
    class Meta:
        unknown = RAISE

    status = fields.String(
        load_default=None, validate=validate.OneOf([s.value for s in Status])
    )
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))
    cursor = fields.String(load_default=None, metadata={
        "format": "payment-cursor",
        "description": "Opaque: the nextCursor of the previous page."})


class ProblemSchema(Schema):
    """RFC 9457 problem details with a stable machine ``code``."""

    type = fields.String()
    title = fields.String()
    status = fields.Integer()
    code = fields.String()
    detail = fields.String()
    errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))


class CancelledSchema(Schema):
    """DELETE /v1/scheduled-payments/{id}."""

    id = fields.UUID()
    status = fields.String(metadata={"enum": [Status.CANCELLED.value]})


class EventSchema(Schema):
    """One entry of /v1/events (``paycron.events.to_wire``); webhooks POST the same."""

    id = fields.Integer()
    type = fields.String(metadata={"description": "payment.created, payment.completed, ..."})
    payment_id = fields.UUID(data_key="paymentId")
    status = fields.String(metadata={"enum": [s.value for s in Status]})
    attempt = fields.Integer()
    data = fields.Dict(keys=fields.String())
    created_at = fields.AwareDateTime(data_key="createdAt")


class EventPageSchema(Schema):
    data = fields.List(fields.Nested(EventSchema))
    next_cursor = fields.String(data_key="nextCursor", metadata={
        "format": "event-cursor",
        "description": "Always present: pass it as after to poll for newer events."})


class WebhookEndpointSchema(Schema):
    id = fields.UUID()
    url = fields.Url()
    created_at = fields.AwareDateTime(data_key="createdAt")


class CreatedWebhookEndpointSchema(WebhookEndpointSchema):
    secret = fields.String(metadata={
        "description": "The HMAC-SHA256 signing key. Shown in this answer only."})


class WebhookEndpointPageSchema(Schema):
    data = fields.List(fields.Nested(WebhookEndpointSchema))


class DeadLetterActionSchema(Schema):
    """The answer of redrive, refund and dismiss."""

    payment_id = fields.UUID(data_key="paymentId")
    action = fields.String(metadata={"enum": ["completed", "redriven", "refunded", "dismissed"]})
    detail = fields.String()


class HealthSchema(Schema):
    status = fields.String(metadata={"enum": ["ok"]})


class ReadinessSchema(Schema):
    status = fields.String(metadata={"enum": ["ready", "unavailable"]})
    checks = fields.Dict(keys=fields.String(metadata={"enum": ["postgres", "redis"]}),
                         values=fields.String(metadata={"enum": ["ok", "down"]}))


def now_utc() -> datetime:
    return datetime.now(UTC)
