from datetime import UTC, datetime, timedelta

import pytest

from paycron.domain.ids import due_range, new_payment_id, new_payment_ids, parse_payment_id


@pytest.mark.parametrize(
    "due_at",
    [
        datetime(2026, 12, 1, 0, 0, 0, tzinfo=UTC),
        datetime(2026, 12, 1, 0, 0, 0, 1000, tzinfo=UTC),  # exactly on a millisecond edge
        datetime(2026, 12, 1, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2027, 6, 30, 12, 0, 0, 123456, tzinfo=UTC),
    ],
)
def test_the_id_carries_its_due_range(due_at):
    payment_id = new_payment_id(due_at)
    start, end = due_range(payment_id)
    assert start <= due_at < end
    assert end - start == timedelta(milliseconds=1)
    assert payment_id.version == 7


def test_ids_are_random_beyond_the_due_time():
    due_at = datetime(2026, 12, 1, tzinfo=UTC)
    ids = {new_payment_id(due_at) for _ in range(1000)}
    assert len(ids) == 1000


def test_ids_made_together_are_ids_made_one_by_one():
    """new_payment_ids reads the random bits of them all at once: each id
    still carries its own due range, and every random bit varies."""
    due_ats = [datetime(2026, 12, 1, tzinfo=UTC) + timedelta(milliseconds=n) for n in range(2000)]
    ids = new_payment_ids(due_ats)
    assert len(set(ids)) == len(due_ats)
    for payment_id, due_at in zip(ids, due_ats, strict=True):
        start, _ = due_range(payment_id)
        assert start == due_at and parse_payment_id(str(payment_id)) == payment_id
    random_bits = ((1 << 80) - 1) & ~(0xF << 76) & ~(0b11 << 62)
    varied = 0
    for payment_id in ids:
        varied |= (payment_id.int ^ ids[0].int) & random_bits
    assert varied == random_bits
    assert new_payment_ids([]) == []


@pytest.mark.parametrize(
    "text",
    [
        "not-a-uuid",
        "",
        "123",
        "00000000-0000-0000-0000-000000000000",
        "6ba7b810-9dad-11d1-80b4-00c04fd430c8",  # a v1 uuid
        "{0192f5a1-0000-7000-8000-000000000000}",  # braces are not our form
    ],
)
def test_malformed_ids_are_rejected(text):
    assert parse_payment_id(text) is None


def test_parse_round_trips():
    payment_id = new_payment_id(datetime.now(UTC))
    assert parse_payment_id(str(payment_id)) == payment_id
