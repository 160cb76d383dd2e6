"""The idempotency key of a key generation is written once in SQL
(``paycron_idempotency_key``) and once in Python (``gateway_key``): the two
agree, and no statement builds a key by hand."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paycron.store
from paycron.domain.keys import gateway_key

SQL_DIR = Path(paycron.store.__file__).resolve().parent / "sql"

#: Generations from the first to far beyond any a payment reaches, and the
#: ones the schema's CHECK refuses (the two formulas agree there too).
GENERATIONS = st.integers(min_value=-3, max_value=2**31 - 1)


def sql_keys(conn, pairs: list[tuple[uuid.UUID, int]]) -> list[str]:
    rows = conn.execute(
        "SELECT paycron_idempotency_key(id, g) AS key "
        "FROM unnest(%s::uuid[], %s::integer[]) WITH ORDINALITY AS t(id, g, n) ORDER BY n",
        ([p for p, _ in pairs], [g for _, g in pairs]),
    ).fetchall()
    return [r["key"] for r in rows]


def test_the_sql_and_python_keys_agree_on_every_early_generation(conn):
    pairs = [(uuid.uuid4(), g) for g in range(-1, 200) for _ in range(5)]
    assert sql_keys(conn, pairs) == [gateway_key(p, g) for p, g in pairs]


# The connection only reads: sharing it between examples is safe.
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.uuids(), GENERATIONS), min_size=1, max_size=50))
def test_the_sql_and_python_keys_agree_on_any_payment_and_generation(conn, pairs):
    assert sql_keys(conn, pairs) == [gateway_key(p, g) for p, g in pairs]


def test_the_first_generation_is_the_bare_id_and_later_ones_are_numbered(conn):
    payment_id = uuid.UUID("0b8e4f4a-6b8e-7000-8000-000000000001")
    assert sql_keys(conn, [(payment_id, 1), (payment_id, 2), (payment_id, 10)]) == [
        str(payment_id),
        f"{payment_id}:2",
        f"{payment_id}:10",
    ]


def test_no_statement_builds_a_key_itself():
    """Every statement that writes ``attempts.gateway_key`` from a generation
    calls the function; none concatenates the id and the generation."""
    text = "\n".join(p.read_text() for p in sorted(SQL_DIR.glob("*.sql")))
    assert not re.search(r"\|\|\s*':'\s*\|\|", text)
    assert len(re.findall(r"paycron_idempotency_key\(id, key_generation\)", text)) >= 4
