"""The event types are the webhook contract: one enum, mirrored by the
schema's CHECK and listed in docs/api.md."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from paycron.domain.enums import EventType
from tests.factories import insert_event

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _check_values(conn) -> set[str]:
    (definition,) = (
        conn.execute(
            "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint"
            " WHERE conname = 'payment_events_type_check'"
        )
        .fetchone()
        .values()
    )
    return set(re.findall(r"'([^']+)'", definition))


def test_the_check_constraint_mirrors_the_enum(conn):
    assert _check_values(conn) == {t.value for t in EventType}


def test_a_type_outside_the_enum_is_refused_by_the_schema(conn):
    with pytest.raises(psycopg.errors.CheckViolation):
        insert_event(conn, type="payment.exploded")


def test_the_api_reference_documents_every_type():
    documented = set(
        re.findall(r"^\| `((?:payment|attempt)\.[a-z_]+)` \|", API_DOC.read_text(), re.MULTILINE)
    )
    assert documented == {t.value for t in EventType}
