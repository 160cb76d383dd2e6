"""Stripe's search query language, the part payment intents need.

A query is clauses joined by ``AND`` or by ``OR`` (not both, as at Stripe);
a clause is ``field:'value'`` (``metadata['key']:'value'`` for metadata),
``-`` before it negates, and ``amount``/``created`` also take ``>``, ``>=``,
``<``, ``<=`` with a number. Fields: amount, created, currency, customer,
status, metadata.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable
from typing import Any

from gateway.fake.stripe_wire import invalid

STRING_FIELDS = frozenset({"currency", "customer", "status"})
NUMBER_FIELDS = frozenset({"amount", "created"})
_CLAUSE = re.compile(
    r"""(?P<negate>-)?
        (?:metadata\[(?P<quote>['"])(?P<key>[^'"]+)(?P=quote)\]|(?P<field>[a-z_]+))
        (?P<op>:|>=|<=|>|<)
        (?:(?P<vquote>['"])(?P<text>[^'"]*)(?P=vquote)|(?P<number>-?\d+))""",
    re.VERBOSE,
)
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    ":": operator.eq,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Clause:
    field: str  # "metadata.<key>" for metadata
    op: str
    value: str | int
    negate: bool

    def matches(self, intent: dict[str, Any]) -> bool:
        if self.field.startswith("metadata."):
            actual: Any = intent["metadata"].get(self.field.removeprefix("metadata."))
        else:
            actual = intent.get(self.field)
        result = actual is not None and COMPARISONS[self.op](actual, self.value)
        return result != self.negate


@dataclasses.dataclass(frozen=True, slots=True)
class Query:
    clauses: tuple[Clause, ...]
    any_of: bool  # OR rather than AND

    def matches(self, intent: dict[str, Any]) -> bool:
        results = (clause.matches(intent) for clause in self.clauses)
        return any(results) if self.any_of else all(results)


def parse_query(text: str) -> Query:
    """A search query, or a 400 naming what is wrong with it."""
    text = text.strip()
    if not text:
        raise invalid("Missing required param: query.", code="parameter_missing", param="query")
    has_and, has_or = " AND " in text, " OR " in text
    if has_and and has_or:
        raise invalid("A query cannot mix AND and OR.", param="query")
    parts = text.split(" OR " if has_or else " AND ")
    return Query(tuple(_clause(part.strip()) for part in parts), any_of=has_or)


def _clause(text: str) -> Clause:
    match = _CLAUSE.fullmatch(text)
    if match is None:
        raise invalid(f"Invalid search query clause: {text}", param="query")
    key, field, op = match["key"], match["field"], match["op"]
    name = f"metadata.{key}" if key is not None else field
    if key is None and field not in STRING_FIELDS | NUMBER_FIELDS:
        raise invalid(
            f"Field '{field}' is not supported for payment intents search.", param="query"
        )
    if field in NUMBER_FIELDS:
        if match["number"] is None:
            raise invalid(f"Field '{field}' takes a number.", param="query")
        return Clause(name, op, int(match["number"]), bool(match["negate"]))
    if op != ":" or match["text"] is None:
        raise invalid(f"Field '{name}' takes a quoted string and ':'.", param="query")
    return Clause(name, op, match["text"], bool(match["negate"]))
