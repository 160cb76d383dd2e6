"""web.batches.PlainItems, the batch's fast check of the common item, and
web.payments.PlainCreates, the single create's, load exactly what their
schemas load, or leave the body to the schema."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from paycron.config import Config
from web.batches import BatchItemSchema, PlainItems
from web.payments import CreatePaymentSchema, PlainCreates

NOW = datetime(2027, 1, 15, 12, 0, tzinfo=UTC)
CONFIG = Config(max_amount_minor=100_000_000, horizon_days=366)
SCHEMA = BatchItemSchema(CONFIG, lambda: NOW)
PLAIN = PlainItems(SCHEMA)
CREATE_SCHEMA = CreatePaymentSchema(CONFIG, lambda: NOW)
PLAIN_CREATES = PlainCreates(CREATE_SCHEMA)
GOOD = {"idempotencyKey": "k", "payee": "acme", "amount": 1, "dueAt": "2027-01-16T00:00:00Z"}

_offsets = st.sampled_from(
    [UTC, timezone(timedelta(hours=9)), timezone(timedelta(hours=-5, minutes=-30))]
)
_whens = st.builds(
    lambda seconds, tz: (NOW + timedelta(seconds=seconds)).astimezone(tz),
    st.integers(-86_400, 370 * 86_400),
    _offsets,
)
due_ats = st.one_of(
    _whens.map(datetime.isoformat),
    _whens.map(lambda d: d.astimezone(UTC).isoformat().replace("+00:00", "Z")),
    _whens.map(lambda d: d.replace(tzinfo=None).isoformat()),  # naive
    _whens.map(lambda d: d.strftime("%Y-%m-%dT%H:%M%z")),
    st.sampled_from(["", "next tuesday", "2027-02-30T00:00:00Z", "2027-01-16"]),
    st.integers(),
    st.none(),
)
texts = st.one_of(
    st.text(min_size=0, max_size=260),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=260),
    st.sampled_from(["acme", "a\x00b", "k" * 255, "k" * 256, "tab\there", "\ud800"]),
    st.integers(),
    st.none(),
)
amounts = st.one_of(
    st.integers(-5, 100_000_005),
    st.sampled_from([0, 1, 100_000_000, 100_000_001, 25.0, 25.5, "25", True, None]),
)
currencies = st.one_of(st.sampled_from(["USD", "EUR", "JPY", "usd", "XYZ", "", None, 7]))
extras = st.sampled_from([{}, {}, {}, {"payer": "mallory"}, {"paymentMethod": "pm_x"}])


_printable = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=30
)


def mostly(valid, anything):
    """Valid values three times in four, so items often pass all but one check."""
    return st.one_of(valid, valid, valid, anything)


@st.composite
def items(draw) -> dict:
    item = {
        "idempotencyKey": draw(mostly(_printable, texts)),
        "payee": draw(mostly(_printable, texts)),
        "amount": draw(mostly(st.integers(1, 100_000_000), amounts)),
        "dueAt": draw(mostly(_whens.map(datetime.isoformat), due_ats)),
        "currency": draw(mostly(st.sampled_from(["USD", "EUR", None]), currencies)),
        **draw(extras),
    }
    absent = draw(st.sets(st.sampled_from(sorted(item))))
    return {k: v for k, v in item.items() if k not in absent}


def schema_load(item: dict):
    try:
        return SCHEMA.load(item)
    except ValidationError:
        return None


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items())
@example({"idempotencyKey": "k", "payee": "acme", "amount": 1, "dueAt": "2027-01-16T00:00:00Z"})
@example({"idempotencyKey": "k", "payee": "acme", "amount": 1, "dueAt": NOW.isoformat()})
@example(
    {
        "idempotencyKey": "k",
        "payee": "acme",
        "amount": 1,
        "dueAt": (NOW + timedelta(days=366)).isoformat(),
        "currency": None,
    }
)
@example({**GOOD, "amount": 0})
@example({**GOOD, "amount": 100_000_001})
@example({**GOOD, "payee": ""})
@example({**GOOD, "payee": "p" * 201})
@example({**GOOD, "idempotencyKey": "k" * 256})
@example({**GOOD, "idempotencyKey": ""})
def test_the_fast_check_loads_what_the_schema_loads_or_nothing(item):
    fast = PLAIN.load(item)
    if fast is not None:
        assert schema_load(item) == fast
    body = {name: value for name, value in item.items() if name != "idempotencyKey"}
    fast_create = PLAIN_CREATES.load(body)
    if fast_create is not None:
        assert CREATE_SCHEMA.load(body) == fast_create


@pytest.mark.parametrize(
    "item",
    [
        {
            "idempotencyKey": "sub-1",
            "payee": "acme",
            "amount": 990,
            "dueAt": "2027-02-01T00:00:00Z",
        },
        {
            "idempotencyKey": "sub-2",
            "payee": "acme",
            "amount": 1,
            "dueAt": "2027-02-01T09:00:00+09:00",
            "currency": "EUR",
        },
    ],
)
def test_the_common_item_takes_the_fast_path(item):
    assert PLAIN.load(item) is not None and PLAIN.load(item) == SCHEMA.load(item)
    body = {name: value for name, value in item.items() if name != "idempotencyKey"}
    assert PLAIN_CREATES.load(body) is not None
    assert PLAIN_CREATES.load(body) == CREATE_SCHEMA.load(body)


def test_with_stripe_every_item_goes_through_the_schema():
    stripe = Config(gateway="stripe", stripe_api_key="sk_test_x")
    plain = PlainItems(BatchItemSchema(stripe, lambda: NOW))
    item = {"idempotencyKey": "k", "payee": "acme", "amount": 990, "dueAt": "2027-02-01T00:00:00Z"}
    assert plain.load(item) is None
    del item["idempotencyKey"]
    assert PlainCreates(CreatePaymentSchema(stripe, lambda: NOW)).load(item) is None


# -- the answer's payments ---------------------------------------------------------------


def test_the_compiled_dump_is_the_schemas_dump_for_payments_in_every_state(conn):
    from paycron.store.payments import get_payment
    from tests.factories import add_attempt, insert_payment
    from web.batches import BatchCreatedSchema
    from web.schemas import PaymentSchema, compiled_dump

    schema, created = PaymentSchema(), BatchCreatedSchema()
    fast, fast_created = compiled_dump(schema), compiled_dump(created)
    states = [
        {"status": "PENDING"},
        {"status": "PROCESSING", "lease_until": datetime.now(UTC), "attempt": 1},
        {"status": "COMPLETED", "attempt": 1},
        {"status": "FAILED", "failure_reason": "DECLINED", "attempt": 1},
        {"status": "CANCELLED"},
    ]
    for state in states:
        row = insert_payment(conn, payment_method="pm_x", customer="cus_y", **state)
        if state.get("attempt"):
            add_attempt(conn, row, attempt=1, outcome="DECLINED", finished_at=datetime.now(UTC))
        payment = get_payment(conn, row["id"], actor=None)
        assert fast(payment) == schema.dump(payment), state
        result = {"index": 3, "status": 201, "replayed": True, "payment": payment}
        assert fast_created(result) == created.dump(result)


def test_the_compiled_dump_formats_a_repeated_time_as_the_schema_does():
    """The compiled dump answers a time equal to the field's last one without
    formatting it again: equal instants in other offsets, or with another
    tzinfo, still get their own text."""
    from zoneinfo import ZoneInfo

    from web.schemas import PaymentSchema, compiled_dump

    schema = PaymentSchema()
    fast = compiled_dump(schema)
    at = datetime(2027, 1, 15, 12, 0, 0, 120000, tzinfo=UTC)
    times = [
        at,
        at + timedelta(0),  # equal, another object
        at.astimezone(timezone(timedelta(hours=9))),  # the same instant, another offset
        at,
        at.replace(tzinfo=timezone(timedelta(0))),  # UTC by another tzinfo
        at.astimezone(ZoneInfo("America/New_York")),
        at.astimezone(ZoneInfo("America/New_York")),
        at.replace(microsecond=0),
        at,
    ]
    for when in times:
        row = {
            "id": "0190c7b2-3c4d-7e8f-9a0b-1c2d3e4f5a6b",
            "payer": "alice",
            "payee": "acme",
            "amount_minor": 990,
            "currency": "USD",
            "payment_method": None,
            "customer": None,
            "due_at": when,
            "status": "COMPLETED",
            "failure_reason": None,
            "in_doubt": False,
            "run_at": when,
            "refunded_at": None,
            "created_at": when,
            "updated_at": at,
            "attempts": [],
        }
        assert fast(row) == schema.dump(row), when
