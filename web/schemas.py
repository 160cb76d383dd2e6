"""The schemas and fields several routes share (marshmallow).

Each route's own schemas live beside it; every one is used for real — to
load what comes in or to dump what goes out — and the OpenAPI document is
generated from those same objects (``web/api.py``). A field's ``metadata``
says what its validators cannot (a description, an enum, a format).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields
from marshmallow.utils import missing as missing_

from paycron.domain.enums import FailureReason, Outcome, Status
from paycron.domain.money import is_minor_units
from paycron.errors import NotFound

#: Postgres text cannot hold U+0000: a string containing it is refused here,
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
            "must be valid Unicode text: no unpaired surrogate (U+D800 to U+DFFF)"
        ) from None


class Strict(Schema):
    """A request's body, query or headers: a field the schema does not name
    is refused, never ignored (mass assignment: payer, status, ... are not
    the client's to set)."""

    class Meta:
        unknown = RAISE


class ResponseSchema(Schema):
    """A response body. Every property is always there (null where empty), so
    the document lists every one as required, except those ``Meta.optional``
    names: ``required`` is what apispec reads, and dumping ignores it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        optional = getattr(self.Meta, "optional", ())
        for name, field in self.fields.items():
            field.required = name not in optional


class MinorUnits(fields.Integer):
    """Money: a JSON integer only. marshmallow's Integer without ``strict``
    truncates 25.5 to 25, and marshmallow accepts ``true`` (bool is an int)."""

    def __init__(self, **kwargs):
        super().__init__(strict=True, **kwargs)

    def _validated(self, value):
        if not is_minor_units(value):
            raise self.make_error("invalid")
        return super()._validated(value)


class PathId(fields.UUID):
    """A resource id in the URL. A malformed one is a 404 like an unknown one
    (``NotFound``, not a validation error): to a client both are "no such
    thing", and the route answers after authentication either way."""

    def __init__(self, parse: Callable[[str], uuid.UUID | None], not_found: str, **kwargs):
        super().__init__(required=True, **kwargs)
        self.parse, self.not_found = parse, not_found

    def _deserialize(self, value, attr, data, **kwargs) -> uuid.UUID:
        parsed = self.parse(value) if isinstance(value, str) else None
        if parsed is None:
            raise NotFound(self.not_found)
        return parsed


def parse_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
#: How a cursor writes each kind of part as an unsigned integer, reads it
#: back, and the bound it stays below (bigint ids, UUIDs, timestamps in µs).
_PARTS: dict[type, tuple[Callable[[Any], int], Callable[[int], Any], int]] = {
    int: (int, int, 2**63),
    uuid.UUID: (lambda value: value.int, lambda n: uuid.UUID(int=n), 2**128),
    datetime: (
        lambda value: (value - _EPOCH) // _MICROSECOND,
        lambda n: _EPOCH + n * _MICROSECOND,
        2**63,
    ),
}


class Cursor(fields.String):
    """An opaque position in a listing, as the API hands it out and takes it back.

    On the wire, base64url (unpadded) of the position's ``parts`` as unsigned
    decimal integers joined by ``.`` (the events feed's ``txid.id`` since its
    first version). Loads to ``into(*parts)`` (a tuple by default); an empty
    string is no position, which a listing takes as its start. Anything this
    API could not have written is refused with one message.
    """

    default_error_messages = {"invalid": "not a cursor this API returned"}

    def __init__(self, *parts: type, into: Callable[..., Any] = lambda *values: values, **kwargs):
        super().__init__(**kwargs)
        self.parts, self.into = [_PARTS[part] for part in parts], into

    def encode(self, position) -> str:
        text = ".".join(
            str(write(value)) for (write, _, _), value in zip(self.parts, position, strict=True)
        )
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    def decode(self, cursor: str):
        try:
            text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
            numbers = text.split(".")
            if len(numbers) != len(self.parts) or not all(n.isdigit() for n in numbers):
                raise ValueError("not unsigned integers")
            values = []
            for (_, read, bound), number in zip(self.parts, map(int, numbers), strict=True):
                if number >= bound:
                    raise ValueError("out of range")
                values.append(read(number))
            return self.into(*values)
        except (ValueError, binascii.Error, UnicodeDecodeError, OverflowError):
            raise self.make_error("invalid") from None

    def _serialize(self, value, attr, obj, **kwargs) -> str | None:
        return None if value is None else self.encode(value)

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        return self.decode(text) if text else None


def _text(value):
    return None if value is None else str(value)


def _integer(value):
    return None if value is None else int(value)


def _boolean(value):
    return None if value is None else bool(value)


class _Iso:
    """``value.isoformat()`` for one field of a compiled dump, answering a
    repeat of the last value without formatting it again: the payments of
    a batch share their creation times and mostly their due times, and
    formatting them was a third of a payment's dump. Only a fixed offset's
    (``datetime.timezone``) is kept: equal values with one such tzinfo are
    the same text."""

    __slots__ = ("last",)

    def __init__(self):
        self.last: tuple[datetime | None, str | None] = (None, None)

    def __call__(self, value) -> str | None:
        if value is None:
            return None
        last, text = self.last
        if value == last and value.tzinfo is last.tzinfo:  # type: ignore[union-attr]
            return text
        text = value.isoformat()
        if type(value) is datetime and type(value.tzinfo) is timezone:
            self.last = (value, text)
        return text


#: What each plain field's own ``serialize`` makes of a value, for
#: :func:`compiled_dump`: the exact classes only (a subclass may differ).
_PLAIN_SERIALIZERS: dict[type, Callable[[Any], Any]] = {
    fields.String: _text,
    fields.UUID: _text,
    fields.Integer: _integer,
    fields.Boolean: _boolean,
}


def compiled_dump(schema: Schema) -> Callable[[Any], dict]:
    """``schema.dump(obj)`` for one object, its fields taken from the schema
    (names, data keys, attributes, defaults) but each serialized directly:
    a plain field by its converter, a ``Method`` field by the schema's
    method, a nested schema (alone or in a ``List``) compiled too. A dict
    holding every attribute is dumped in one comprehension: a thousand
    payments in a batch's answer cost a few ms instead of ~100. Anything
    else (an attribute missing, so a default applies; not a dict) goes
    field by field. For schemas without dump hooks (checked), held equal to
    ``dump`` by tests/web/test_batch_items.py."""
    if any(schema._hooks[hook] for hook in ("pre_dump", "post_dump")):
        raise ValueError(f"{type(schema).__name__} has dump hooks: use dump")
    #: (data key, attribute or None for a field of the whole object, converter)
    plan: list[tuple[str, str | None, Callable[[Any], Any] | None]] = []
    #: (data key, attribute, field) for the field-by-field way
    slow: list[tuple[str, str, fields.Field]] = []
    for name, field in schema.dump_fields.items():
        key, attribute = field.data_key or name, field.attribute or name
        slow.append((key, attribute, field))
        plan.append((key, None if type(field) is fields.Method else attribute, _converter(field)))
    compiled = all(convert is not None for _, _, convert in plan)

    def field_by_field(obj) -> dict:
        out = {}
        for key, attribute, field in slow:
            value = field.serialize(attribute, obj, accessor=schema.get_attribute)
            if value is not missing_:
                out[key] = value
        return out

    def dump(obj) -> dict:
        if compiled and type(obj) is dict:
            try:
                return {
                    key: convert(obj[attribute]) if attribute is not None else convert(obj)  # type: ignore[misc]
                    for key, attribute, convert in plan
                }
            except KeyError:
                pass  # an attribute is missing: its field's default applies
        return field_by_field(obj)

    return dump


def _converter(field: fields.Field) -> Callable[[Any], Any] | None:
    """What ``field.serialize`` makes of a present value (of the object, for
    a ``Method`` field), or None when only the field itself can say."""
    kind = type(field)
    if kind in _PLAIN_SERIALIZERS:
        return _PLAIN_SERIALIZERS[kind]
    if kind in (fields.DateTime, fields.AwareDateTime) and field.format in (None, "iso"):
        return _Iso()
    if kind is fields.Method and field._serialize_method is not None:
        return field._serialize_method
    if kind is fields.Nested and not field.many:
        inner = compiled_dump(field.schema)
        return lambda value: None if value is None else inner(value)
    if kind is fields.List and type(field.inner) is fields.Nested and not field.inner.many:
        each = compiled_dump(field.inner.schema)
        return lambda value: None if value is None else list(map(each, value))
    return None


class AttemptSchema(ResponseSchema):
    attempt = fields.Integer()
    started_at = fields.AwareDateTime(data_key="startedAt")
    finished_at = fields.AwareDateTime(data_key="finishedAt", allow_none=True)
    outcome = fields.String(metadata={"enum": [o.value for o in Outcome]})
    error_code = fields.String(data_key="errorCode", allow_none=True)
    gateway_ref = fields.String(data_key="gatewayRef", allow_none=True)


class PaymentSchema(ResponseSchema):
    id = fields.UUID()
    payer = fields.String()
    payee = fields.String()
    amount = fields.Integer(
        attribute="amount_minor", metadata={"description": "Integer minor units of the currency."}
    )
    currency = fields.String()
    payment_method = fields.String(
        data_key="paymentMethod",
        allow_none=True,
        metadata={
            "description": "The processor's payment method charged; null when none was given."
        },
    )
    customer = fields.String(
        allow_none=True,
        metadata={"description": "The processor's customer charged; null when none was given."},
    )
    due_at = fields.AwareDateTime(data_key="dueAt")
    status = fields.String(metadata={"enum": [s.value for s in Status]})
    failure_reason = fields.String(
        data_key="failureReason",
        allow_none=True,
        metadata={"enum": [r.value for r in FailureReason] + [None]},
    )
    in_doubt = fields.Boolean(data_key="inDoubt")
    next_attempt_at = fields.Method(
        "_next_attempt_at",
        data_key="nextAttemptAt",
        allow_none=True,
        metadata={
            "type": "string",
            "format": "date-time",
            "description": "When the next attempt is due; null unless PENDING.",
        },
    )
    refunded_at = fields.AwareDateTime(data_key="refundedAt", allow_none=True)
    created_at = fields.AwareDateTime(data_key="createdAt")
    updated_at = fields.AwareDateTime(data_key="updatedAt")
    attempts = fields.List(fields.Nested(AttemptSchema), dump_default=list)

    def _next_attempt_at(self, row: dict) -> str | None:
        if row["status"] != Status.PENDING:
            return None
        return _run_at_text(row["run_at"].astimezone(UTC))


#: A batch's payments mostly share their run_at (the due time, unsmeared).
_run_at_text = _Iso()


class PaymentSummarySchema(PaymentSchema):
    """A payment in a listing: without its attempts."""

    class Meta:
        exclude = ("attempts",)


def now_utc() -> datetime:
    return datetime.now(UTC)
