"""Creating and reading payments (the write path's only non-transition).

Status changes live in :mod:`paycron.store.transitions`; this module creates a
payment (idempotently) and reads payments for their payer.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from paycron.domain.ids import due_range, new_payment_id
from paycron.errors import CustomerNotYours, IdempotencyKeyReused, PaycronError
from paycron.sql import q
from paycron.store.customers import FIRST_USE, REGISTERED, refusal
from paycron.store.db import Connection

#: Sorts after every real (created_at, id): the keyset start of page one.
_FIRST_PAGE = ("infinity", uuid.UUID(int=(1 << 128) - 1))
#: A filtered list scans at most this many keys per item asked for (``limit``),
#: so a request reads a bounded number of rows however rare the status is in
#: the payer's history: 4 x 100 = 400 keys at the largest limit, a few ms.
#: The page may then be short, even empty, with a cursor to go on from.
FILTERED_SCAN_FACTOR = 4


def _archived() -> IdempotencyKeyReused:
    """A used key whose payment is gone: its partition was detached."""
    return IdempotencyKeyReused("this Idempotency-Key belongs to an archived payment")


@dataclass(frozen=True)
class NewPayment:
    """A validated create request (money in minor units, due time aware UTC)."""

    payee: str
    amount_minor: int
    currency: str
    due_at: datetime
    #: The processor's opaque tokens (Stripe ``pm_…``, ``cus_…``), when given.
    payment_method: str | None = None
    customer: str | None = None


@dataclass(frozen=True)
class Created:
    payment: dict
    replayed: bool


#: The canonical JSON of a body, made once (``json.dumps`` with options makes
#: an encoder per call: a quarter of a hash's cost, 1,000 of them per batch).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_hash(body: object) -> bytes:
    """sha256 of the body's canonical JSON: key order and spacing do not matter.

    Any JSON text hashes, even a lone surrogate (JSON may escape "\\ud800"):
    the body is hashed before it is validated. ``surrogatepass`` leaves the
    bytes of valid text as they were, so stored hashes still match."""
    canonical = _CANONICAL.encode(body)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()


def find_replay(conn: Connection, actor: str, key: str, body_hash: bytes) -> dict | None:
    """The payment an earlier create under (actor, key) made, if there was one.

    Raises :class:`IdempotencyKeyReused` when that create had another body.
    The API asks when an insert conflicts, and when a body fails validation:
    replaying a create after its due time has passed still returns the
    original payment.
    """
    row = conn.execute(q("find_idempotency_key"), {"actor": actor, "key": key}).fetchone()
    if row is None:
        return None
    if bytes(row["request_hash"]) != body_hash:
        raise IdempotencyKeyReused("this Idempotency-Key was used with a different request body")
    return get_payment(conn, row["payment_id"], actor=actor)


def notify_due(conn: Connection) -> None:
    """Announce a payment falling due within the sweep interval: sweepers
    waiting on the channel wake and claim it (scheduler/wake.py)."""
    conn.execute(q("notify_due"))


def creation(
    *,
    actor: str,
    key: str,
    body_hash: bytes,
    new: NewPayment,
    processor: str,
    smear_seconds: float = 0.0,
) -> dict:
    """The parameters of the create statement for ``new``: a new payment id,
    its run time smeared by up to ``smear_seconds``."""
    run_at = new.due_at
    if smear_seconds > 0:
        # Humans schedule for round times; smearing spreads a midnight spike.
        run_at += timedelta(seconds=random.uniform(0, smear_seconds))
    return {
        "actor": actor,
        "key": key,
        "request_hash": body_hash,
        "id": new_payment_id(new.due_at),
        "due_at": new.due_at,
        "payee": new.payee,
        "amount_minor": new.amount_minor,
        "currency": new.currency,
        "run_at": run_at,
        "payment_method": new.payment_method,
        "customer": new.customer,
        "processor": processor,
    }


def insert_payment(conn: Connection, params: dict) -> Created | None:
    """The create's one statement (parameters from :func:`creation`): the
    payment created, or None when it wrote nothing because the key was used
    or the customer is not bound to the actor (yet); :func:`create_payment`
    then says which. It reads no partitioned table, so a session that plans
    it once (the web's create pool) runs it safely."""
    row = conn.execute(q("create_payment"), params).fetchone()
    if row is None:
        return None
    return Created(payment={**row, "attempts": []}, replayed=False)


def create_payment(
    conn: Connection,
    *,
    actor: str,
    key: str,
    body_hash: bytes,
    new: NewPayment,
    processor: str,
    smear_seconds: float = 0.0,
    binding: str = FIRST_USE,
) -> Created:
    """Insert the payment, its idempotency row and its event in one transaction.

    Concurrent creates with one key: the first insert wins, the others wait
    for it and then answer as replays of it (or 409 if their body differs).

    A payment naming a customer needs the customer bound to ``actor`` at
    ``processor`` (docs/customers.md). With ``binding`` ``first_use`` the first
    create naming an unbound customer binds it, in the same transaction as
    the payment; with ``registered`` only an admin binds one. A customer
    not bound to ``actor`` is :class:`CustomerNotYours`, and nothing is
    created. A create naming a customer already bound to it costs no more
    than one without.
    """
    params = creation(
        actor=actor,
        key=key,
        body_hash=body_hash,
        new=new,
        processor=processor,
        smear_seconds=smear_seconds,
    )
    created = insert_payment(conn, params)
    if created is not None:
        return created
    if new.customer is not None:
        owner = _customer_owner(conn, processor, new.customer)
        if owner is None and binding != REGISTERED:
            return _create_binding(conn, params, body_hash)
        refused = refusal(owner, actor, binding)
        if refused is not None:
            return _replay_or(conn, actor, key, body_hash, refused)
        replay = find_replay(conn, actor, key, body_hash)
        if replay is not None:
            return Created(payment=replay, replayed=True)
        # Bound to this actor by a concurrent create that committed after the
        # insert began: visible to a new statement.
        created = insert_payment(conn, params)
        if created is not None:
            return created
    return _replay_or(conn, actor, key, body_hash, _archived())


def _customer_owner(conn: Connection, processor: str, customer: str) -> str | None:
    row = conn.execute(
        q("customer_owner"), {"processor": processor, "customer": customer}
    ).fetchone()
    return None if row is None else row["actor"]


def _create_binding(conn: Connection, params: dict, body_hash: bytes) -> Created:
    """The create of a payment naming a customer no one has named yet: bind
    it and create, in one transaction. Of concurrent first creates naming
    one customer, one binds it; the others wait for that one's commit (the
    customer's primary key) and then read its owner, as a later create would."""
    actor, key = params["actor"], params["key"]
    try:
        with conn.transaction():
            bound = conn.execute(q("bind_customer"), params).fetchone()
            if (
                bound is None
                and _customer_owner(conn, params["processor"], params["customer"]) != actor
            ):
                raise CustomerNotYours()
            row = conn.execute(q("create_payment"), params).fetchone()
            if row is not None:
                return Created(payment={**row, "attempts": []}, replayed=False)
            # The key was used: a replay (its body named this customer, so the
            # binding was there already), or a 409 that undoes the binding.
            return _replay_or(conn, actor, key, body_hash, _archived())
    except CustomerNotYours as refused:
        return _replay_or(conn, actor, key, body_hash, refused)


def _replay_or(
    conn: Connection, actor: str, key: str, body_hash: bytes, refusal: PaycronError
) -> Created:
    """The replay of an earlier create under (actor, key), else ``refusal``
    raised. A replay returns the original payment whatever changed since."""
    replay = find_replay(conn, actor, key, body_hash)
    if replay is None:
        raise refusal
    return Created(payment=replay, replayed=True)


def get_payment(
    conn: Connection, payment_id: uuid.UUID, *, actor: str | None, with_attempts: bool = True
) -> dict | None:
    """One payment with its attempts, or None (also when it is another payer's)."""
    due_from, due_to = due_range(payment_id)
    row = conn.execute(
        q("get_payment"),
        {
            "id": payment_id,
            "due_from": due_from,
            "due_to": due_to,
            "actor": actor,
        },
    ).fetchone()
    if row is None:
        return None
    if with_attempts:
        row["attempts"] = conn.execute(q("get_attempts"), {"id": payment_id}).fetchall()
    return row


def list_payments(
    conn: Connection,
    *,
    actor: str,
    status: str | None,
    limit: int,
    after: tuple[datetime, uuid.UUID] | None,
) -> tuple[list[dict], tuple | None]:
    """A page of the payer's payments, newest first, and the keyset of the next page.

    The order comes from the unpartitioned idempotency table; the rows from
    ``payments`` by (id, due_at), so only the page's day partitions are
    touched. One round trip of each, bounded: a status filter scans at most
    ``FILTERED_SCAN_FACTOR * limit`` keys and answers the matches among them.
    When the history goes on past what was scanned, the next keyset is the
    last key scanned (or the last item, when more matched than fit), so a
    page may hold fewer than ``limit`` items, even none, before the end.
    ``None`` only when the payer's history is exhausted.
    """
    before = after or _FIRST_PAGE
    scan = limit if status is None else FILTERED_SCAN_FACTOR * limit
    keys = conn.execute(
        q("list_page_keys"),
        {
            "actor": actor,
            "limit": scan + 1,  # one more: is there anything after?
            "before_created_at": before[0],
            "before_id": before[1],
        },
    ).fetchall()
    more, keys = len(keys) > scan, keys[:scan]
    rows = (
        {
            r["id"]: r
            for r in conn.execute(
                q("payments_by_keys"),
                {
                    "ids": [k["payment_id"] for k in keys],
                    "due_ats": [k["due_at"] for k in keys],
                    "actor": actor,
                    "status": status,
                },
            )
        }
        if keys
        else {}
    )
    # A key whose row is gone (its partition detached) or filtered out is skipped.
    matched = [(key, rows[key["payment_id"]]) for key in keys if key["payment_id"] in rows]
    last: dict | None
    if len(matched) > limit:
        matched, more = matched[:limit], True
        last = matched[-1][0]
    else:
        last = keys[-1] if keys else None
    next_key = None
    if more:
        assert last is not None  # more keys than were scanned: some were
        next_key = (last["created_at"], last["payment_id"])
    return [row for _, row in matched], next_key


def confirm_replicated(conn: Connection, *, actor: str, key: str) -> None:
    """Make sure the payment a replay returns is on the synchronous standby.

    A first create whose wait for the standby was cut committed on the
    primary alone, and its row is visible there; its retry finds it. This
    rewrites the key's row, so the retry's own commit waits for the standby
    (which then holds everything the primary committed before it): under
    :func:`paycron.store.db.bounded_write`, a retry answers the payment only once
    it would survive a failover, else OUTCOME_UNKNOWN again."""
    conn.execute(q("touch_idempotency_key"), {"actor": actor, "key": key})
