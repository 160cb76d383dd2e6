"""Which actor each processor customer belongs to (docs/customers.md).

A binding is made by an admin's registration (:func:`register`, from the CLI
or the admin API) or, with ``CUSTOMER_BINDING=first_use``, by the first
create naming the customer (:mod:`paycron.store.payments`). A create may
name only a customer bound to its actor; :func:`may_name` is that rule,
read before anything is asked of the processor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from paycron.errors import CustomerBound, CustomerNotYours
from paycron.sql import q
from paycron.store.db import Connection

#: The settings' names for the two ways (paycron.config.CUSTOMER_BINDINGS).
FIRST_USE, REGISTERED = "first_use", "registered"


@dataclass(frozen=True)
class Registered:
    binding: dict
    #: False when the customer was bound to this actor already.
    created: bool


def owners(conn: Connection, processor: str, customers: Iterable[str]) -> dict[str, str]:
    """The actor of each of these customers that is bound."""
    rows = conn.execute(
        q("customer_owners"), {"processor": processor, "customers": sorted(set(customers))}
    )
    return {row["customer"]: row["actor"] for row in rows}


def refusal(owner: str | None, actor: str, binding: str) -> CustomerNotYours | None:
    """Why ``actor`` may not name a customer bound to ``owner`` (None: unbound),
    or None when it may. With ``registered`` the answer is the same for
    another's customer and nobody's, so it tells nothing about others."""
    if owner == actor:
        return None
    if binding == REGISTERED:
        return CustomerNotYours(CustomerNotYours.NOT_REGISTERED)
    if owner is None:
        return None  # first use: the create binds it
    return CustomerNotYours()


def register(conn: Connection, *, processor: str, customer: str, actor: str, by: str) -> Registered:
    """Bind ``customer`` to ``actor`` for good (idempotent for the same actor).
    Raises :class:`CustomerBound` when another actor holds it: an admin
    removes that binding first, on purpose."""
    row = conn.execute(
        q("register_customer"),
        {"processor": processor, "customer": customer, "actor": actor, "by": by},
    ).fetchone()
    if row is None:
        raise CustomerBound("this customer is bound to another actor; remove that binding first")
    created = row.pop("inserted")
    return Registered(binding=row, created=created)


def remove(conn: Connection, *, processor: str, customer: str) -> dict | None:
    """End the customer's binding (whoever holds it); the binding, or None.
    Payments already scheduled naming it are not touched."""
    return conn.execute(
        q("remove_customer"), {"processor": processor, "customer": customer}
    ).fetchone()


def list_bindings(
    conn: Connection, *, processor: str, actor: str | None, limit: int, after: int = 0
) -> tuple[list[dict], int | None]:
    """A page of bindings in id order, and the position of the next page (None: last)."""
    rows = conn.execute(
        q("list_customers"),
        {"processor": processor, "actor": actor, "after": after, "limit": limit + 1},
    ).fetchall()
    more, rows = len(rows) > limit, rows[:limit]
    return rows, (rows[-1]["id"] if more else None)
