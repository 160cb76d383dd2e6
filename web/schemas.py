"""Request and response schemas (marshmallow). Validation messages are
per field; the create schema's time rules need the config and the clock,
which the view passes to the constructor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates

from paycron.config import Config
from paycron.enums import Status
from paycron.money import ISO_4217, is_minor_units


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

    payee = fields.String(required=True, validate=validate.Length(min=1, max=200))
    amount = MinorUnits(
        required=True, error_messages={"invalid": "amount must be an integer number of minor units"}
    )
    due_at = fields.AwareDateTime(data_key="dueAt", required=True, format="iso")
    currency = fields.String(load_default=None)

    def __init__(self, config: Config, now: datetime, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.now = now

    @validates("amount")
    def _amount_range(self, value: int, data_key: str) -> None:
        if value <= 0:
            raise ValidationError("amount must be greater than 0")
        if value > self.config.max_amount_minor:
            raise ValidationError(f"amount must be at most {self.config.max_amount_minor}")

    @validates("due_at")
    def _due_window(self, value: datetime, data_key: str) -> None:
        if value <= self.now:
            raise ValidationError("dueAt must be in the future")
        if value > self.now + timedelta(days=self.config.horizon_days):
            raise ValidationError(f"dueAt must be within {self.config.horizon_days} days")

    @validates("currency")
    def _currency(self, value: str | None, data_key: str) -> None:
        if value is not None and value not in ISO_4217:
            raise ValidationError("currency must be an ISO 4217 code, e.g. USD")


class AttemptSchema(Schema):
    attempt = fields.Integer()
    started_at = fields.AwareDateTime(data_key="startedAt")
    finished_at = fields.AwareDateTime(data_key="finishedAt", allow_none=True)
    outcome = fields.String()
    error_code = fields.String(data_key="errorCode", allow_none=True)
    gateway_ref = fields.String(data_key="gatewayRef", allow_none=True)


class PaymentSchema(Schema):
    id = fields.UUID()
    payer = fields.String()
    payee = fields.String()
    amount = fields.Integer(attribute="amount_minor")
    currency = fields.String()
    due_at = fields.AwareDateTime(data_key="dueAt")
    status = fields.String()
    failure_reason = fields.String(data_key="failureReason", allow_none=True)
    in_doubt = fields.Boolean(data_key="inDoubt")
    next_attempt_at = fields.Method("_next_attempt_at", data_key="nextAttemptAt", allow_none=True)
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
    cursor = fields.String(load_default=None)


class ProblemSchema(Schema):
    """RFC 9457 problem details with a stable machine ``code``."""

    type = fields.String()
    title = fields.String()
    status = fields.Integer()
    code = fields.String()
    detail = fields.String()
    errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))


def now_utc() -> datetime:
    return datetime.now(UTC)
