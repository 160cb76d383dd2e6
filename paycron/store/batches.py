"""Creating many payments at once, each exactly as a single create would.

A batch's items are answered one by one, in request order, with what a
single create of each would answer had they been sent one after another:
a payment created, the replay of an earlier create under the same key and
body (also one earlier in the same batch), a 409 for a key used with
another body, or the item's own refusal. The writes are set-based: the
items that create are COPYed into a staging table, and their keys, their
payments and their created events go in one statement from there
(``create_batch``), so a batch costs a handful of round trips whatever its
size, and they commit together.

Race-safety is the single create's: an insert of a key another transaction
is inserting waits for it, then inserts nothing, and the item becomes a
replay (or a 409) of that create. Batches insert their keys in key order,
so two batches sharing keys never wait for each other in a cycle.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from paycron.domain.ids import new_payment_ids
from paycron.errors import CustomerNotYours, IdempotencyKeyReused, PaycronError
from paycron.sql import q
from paycron.store.customers import FIRST_USE, refusal
from paycron.store.db import Connection
from paycron.store.payments import Created, NewPayment

#: A batch naming customers re-reads their owners and starts over when a
#: concurrent create bound one of them to another payer between the read and
#: its own binding; each start-over means one more customer bound for good,
#: so a few suffice (beyond them: bound every time, unheard of).
CUSTOMER_RACE_RETRIES = 3


@dataclass(frozen=True)
class BatchItem:
    """One item as the API prepared it: its key and the hash of its body
    (both None when it has no usable key), and either the payment it asks
    for (``new``) or the refusal of its body (``refusal``), which still
    answers a replay when the key was used with this very body."""

    key: str | None
    body_hash: bytes | None
    new: NewPayment | None = None
    refusal: PaycronError | None = None


#: What each item gets: the payment (created or replayed), or an error.
Outcome = Created | PaycronError


@dataclass(eq=False)
class _Used:
    """A key's create as this batch knows it: its body hash and payment."""

    body_hash: bytes | None
    payment_id: uuid.UUID
    due_at: datetime
    payment: dict | None = None
    created_here: bool = False


def days_without_partition(conn: Connection, days: Iterable[date]) -> set[date]:
    """Which of these days have no partition of ``payments`` (yet): a payment
    due then cannot be stored, and is refused as beyond the horizon."""
    wanted = sorted(set(days))
    if not wanted:
        return set()
    have = {row["day"] for row in conn.execute(q("payment_partition_days"), {"days": wanted})}
    return set(wanted) - have


def create_batch(
    conn: Connection,
    *,
    actor: str,
    items: Sequence[BatchItem],
    processor: str,
    smear_seconds: float = 0.0,
    binding: str = FIRST_USE,
) -> list[Outcome]:
    """Create the items' payments; one outcome per item, in order.

    Each item's customer must be bound to ``actor``, as for a single create
    (:func:`paycron.store.payments.create_payment`, ``binding`` likewise).

    An item whose key appeared earlier in the batch is answered as a create
    sent after that one: a replay of it with the same body, else a 409.
    """
    for _ in range(CUSTOMER_RACE_RETRIES):
        prepared = _Prepared(conn, actor, items, processor, binding)
        try:
            created = prepared.write(smear_seconds)
        except _StartOver:
            continue
        return _answer(conn, actor, prepared, created)
    raise RuntimeError("customers kept being bound to other payers during the batch")


class _Prepared:
    """The items' customers checked, and the creating item of each key chosen."""

    def __init__(
        self,
        conn: Connection,
        actor: str,
        items: Sequence[BatchItem],
        processor: str,
        binding: str,
    ):
        self.conn, self.actor, self.processor = conn, actor, processor
        named = {item.new.customer for item in items if item.new and item.new.customer is not None}
        owners = _owners(conn, processor, named) if named else {}
        #: Items refused because their customer is not (and cannot become) the actor's.
        self.not_yours: dict[int, CustomerNotYours] = {}
        for index, item in enumerate(items):
            if item.new and item.new.customer is not None:
                refused = refusal(owners.get(item.new.customer), actor, binding)
                if refused is not None:
                    self.not_yours[index] = refused
        # The first acceptable item of each key creates (if the key is unused):
        # the refusals before it create nothing, the items after it replay it.
        self.creators: dict[str, int] = {}
        for index, item in enumerate(items):
            if item.key is not None and item.new is not None and index not in self.not_yours:
                self.creators.setdefault(item.key, index)
        self.items = items
        self.unbound = sorted(
            {
                customer
                for i in self.creators.values()
                if (customer := _customer(items[i])) is not None and customer not in owners
            }
        )

    def write(self, smear_seconds: float) -> dict[str, dict]:
        """Insert the creating items; the payments created, by key. Raises
        :class:`_StartOver` (nothing written) when a customer to bind was
        bound to another payer meanwhile."""
        order = sorted(self.creators.items())
        rows: list[tuple[str, NewPayment, bytes]] = []
        for key, index in order:
            item = self.items[index]
            # a creating item is a valid one: it has its payment and its body's hash
            assert item.new is not None and item.body_hash is not None
            rows.append((key, item.new, item.body_hash))
        if not rows:
            return {}
        with self.conn.transaction():
            bound = self._bind() if self.unbound else []
            keys = _stage(self.conn, rows, smear_seconds)
            created = self.conn.execute(
                q("create_batch"),
                {"actor": self.actor, "processor": self.processor, "bound": bound},
                binary=True,  # uuids and times decoded from binary: a third cheaper
            )
            return {keys[row["id"]]: row for row in created.fetchall()}

    def _bind(self) -> list[str]:
        """Bind the unbound customers to the actor; those this bound. Raises
        :class:`_StartOver` when one was bound to another payer meanwhile
        (the caller's transaction then rolls the bindings back)."""
        bound = {
            row["customer"]
            for row in self.conn.execute(
                q("bind_customers"),
                {"processor": self.processor, "actor": self.actor, "customers": self.unbound},
            )
        }
        raced = set(self.unbound) - bound
        if raced and any(
            owner != self.actor for owner in _owners(self.conn, self.processor, raced).values()
        ):
            raise _StartOver
        return sorted(bound)


def _customer(item: BatchItem) -> str | None:
    return item.new.customer if item.new is not None else None


class _StartOver(Exception):
    """A customer the batch meant to bind is another payer's now: read again."""


def _owners(conn: Connection, processor: str, customers: Iterable[str]) -> dict[str, str]:
    rows = conn.execute(
        q("customer_owners"), {"processor": processor, "customers": sorted(customers)}
    )
    return {row["customer"]: row["actor"] for row in rows}


#: The types of copy_batch_items's columns, in its order (binary COPY needs them).
_STAGED_TYPES = [
    "int4", "text", "bytea", "uuid", "timestamptz", "text", "int8", "text", "timestamptz",
    "text", "text",
]  # fmt: skip


def _stage(
    conn: Connection, rows: list[tuple[str, NewPayment, bytes]], smear_seconds: float
) -> dict[uuid.UUID, str]:
    """The rows into the session's staging table (``batch_items``), in their
    order, each with a new payment id; the key of each payment id."""
    conn.execute(q("stage_batch_items"))
    ids = new_payment_ids([new.due_at for _, new, _ in rows])
    keys: dict[uuid.UUID, str] = {}
    with conn.cursor().copy(q("copy_batch_items")) as copy:
        copy.set_types(_STAGED_TYPES)
        for place, ((key, new, body_hash), payment_id) in enumerate(zip(rows, ids, strict=True)):
            run_at = new.due_at
            if smear_seconds > 0:
                # Humans schedule for round times; smearing spreads a midnight spike.
                run_at += timedelta(seconds=random.uniform(0, smear_seconds))
            copy.write_row(
                (place, key, body_hash, payment_id, new.due_at, new.payee, new.amount_minor,
                 new.currency, run_at, new.payment_method, new.customer)
            )  # fmt: skip
            keys[payment_id] = key
    return keys


def _answer(
    conn: Connection, actor: str, prepared: _Prepared, created: dict[str, dict]
) -> list[Outcome]:
    """Each item's outcome, going through the items in order as single
    creates sent one after another would: a key's state is what existed
    before the batch (looked up) or what an earlier item made of it."""
    items = prepared.items
    used: dict[str, _Used] = {}
    for key, row in created.items():
        row["attempts"] = []  # a payment just created has none
        used[key] = _Used(
            items[prepared.creators[key]].body_hash, row["id"], row["due_at"], row, True
        )
    earlier = sorted({item.key for item in items if item.key is not None} - created.keys())
    if earlier:
        for row in conn.execute(q("find_idempotency_keys"), {"actor": actor, "keys": earlier}):
            used[row["key"]] = _Used(bytes(row["request_hash"]), row["payment_id"], row["due_at"])
    answers: list[Outcome | _Used] = []
    for index, item in enumerate(items):
        state = used.get(item.key) if item.key is not None else None
        if state is not None and state.created_here and item.key is not None:
            creator = prepared.creators[item.key]
            if index == creator and state.payment is not None:
                answers.append(Created(payment=state.payment, replayed=False))
                continue
            if index < creator:
                state = None  # created by a later item: nothing under the key yet
        if state is None:
            answers.append(_first_use(item, index, prepared))
        elif state.body_hash != item.body_hash:
            answers.append(_reused())
        else:
            answers.append(state)
    replayed = {
        item.key: answer
        for item, answer in zip(items, answers, strict=True)
        if isinstance(answer, _Used) and not answer.created_here and item.key is not None
    }
    if replayed:
        _load_payments(conn, actor, list(replayed.values()))
        keys = sorted(replayed)
        # Like a single create's replay, the commit waits for the standby.
        conn.execute(q("touch_idempotency_keys"), {"actor": actor, "keys": keys})
    return [_resolved(answer) for answer in answers]


def _first_use(item: BatchItem, index: int, prepared: _Prepared) -> Outcome:
    """The outcome of an item whose key nothing used before it."""
    if index in prepared.not_yours:
        return prepared.not_yours[index]
    if item.refusal is not None:
        return item.refusal
    # Its key was used when the insert ran and was gone when looked up:
    # the partition of its payment was detached meanwhile.
    return _archived()


def _resolved(answer: Outcome | _Used) -> Outcome:
    if not isinstance(answer, _Used):
        return answer
    if answer.payment is None:
        return _archived()  # the key's payment is gone: its partition was detached
    return Created(payment=answer.payment, replayed=True)


def _load_payments(conn: Connection, actor: str, states: list[_Used]) -> None:
    """Fill in the payments (with their attempts) that these keys created."""
    wanted = {s.payment_id: s for s in states}
    due_ats = sorted({s.due_at for s in states})
    rows = conn.execute(
        q("payments_by_keys"),
        {"ids": list(wanted), "due_ats": due_ats, "actor": actor, "status": None},
    ).fetchall()
    attempts: dict[uuid.UUID, list[dict]] = {row["id"]: [] for row in rows}
    for attempt in conn.execute(q("attempts_of_payments"), {"ids": list(attempts)}):
        attempts[attempt.pop("payment_id")].append(attempt)
    for row in rows:
        wanted[row["id"]].payment = {**row, "attempts": attempts[row["id"]]}


def _reused() -> IdempotencyKeyReused:
    return IdempotencyKeyReused("this Idempotency-Key was used with a different request body")


def _archived() -> IdempotencyKeyReused:
    """A used key whose payment is gone: its partition was detached."""
    return IdempotencyKeyReused("this Idempotency-Key belongs to an archived payment")
