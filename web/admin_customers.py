"""``/v1/admin/customers``: which processor customers each actor may charge
(docs/customers.md), for admin keys: register, list, remove.

A non-admin key gets 404 here, as on every admin route. Every call is
audited (``customer.register``, ``customer.remove``, ``admin.read``) with
the admin's actor and the payer concerned, never the customer itself.
"""

from __future__ import annotations

from flask import current_app, g
from marshmallow import fields, validate

from paycron.errors import CustomerBound, NotFound
from paycron.store import customers
from web.api import Blueprint
from web.audit import audit
from web.auth import require_admin
from web.payments import ProcessorToken
from web.problems import NOT_JSON, TOO_LARGE, problem
from web.schemas import NO_NUL, Cursor, ResponseSchema, Strict, unicode_text

bp = Blueprint(
    "admin_customers",
    __name__,
    url_prefix="/v1/admin/customers",
    description="Customer bindings: which processor customers each payer may charge (admin).",
)


def _actor_field(**kwargs) -> fields.String:
    return fields.String(
        validate=[
            validate.Length(min=1, max=200),
            unicode_text,
            validate.Regexp(NO_NUL, error="actor must not contain U+0000"),
        ],
        metadata={"description": "The payer (an API key's actor)."},
        **kwargs,
    )


def _customer_field() -> ProcessorToken:
    token = ProcessorToken(
        "customer", metadata={"description": "The processor's customer (Stripe: cus_...)."}
    )
    token.require()
    token.error_messages.update(required="customer is required", null="customer is required")
    return token


class RegisterSchema(Strict):
    customer = _customer_field()
    actor = _actor_field(required=True)


class RemoveSchema(Strict):
    customer = _customer_field()


class ListQuery(Strict):
    actor = _actor_field()
    limit = fields.Integer(
        load_default=100,
        validate=validate.Range(min=1, max=1000, error="an integer from 1 to 1000"),
        error_messages={"invalid": "an integer from 1 to 1000"},
    )
    cursor = Cursor(
        int,
        metadata={
            "format": "binding-cursor",
            "description": "Opaque: the nextCursor of the previous page.",
        },
    )


class BindingSchema(ResponseSchema):
    customer = fields.String()
    actor = fields.String()
    registered_by = fields.String(
        data_key="registeredBy",
        allow_none=True,
        metadata={"description": "Who registered it; null when a payer's first create bound it."},
    )
    created_at = fields.AwareDateTime(data_key="createdAt")


class BindingPageSchema(ResponseSchema):
    data = fields.List(fields.Nested(BindingSchema))
    next_cursor = Cursor(
        int,
        data_key="nextCursor",
        allow_none=True,
        metadata={"format": "binding-cursor", "description": "Null on the last page."},
    )


def _pool():
    return current_app.extensions["paycron.pool"]


def _processor() -> str:
    return current_app.extensions["paycron.config"].gateway


@bp.post("")
@require_admin
@bp.arguments(RegisterSchema(), as_kwargs=True)
@bp.response(200, BindingSchema, description="Registered (also when it was already).")
@bp.alt_response(400, **problem("An invalid body (VALIDATION_FAILED, messages per field)."))
@bp.alt_response(
    409, **problem("Another payer holds this customer: remove that binding first (CUSTOMER_BOUND).")
)
@bp.alt_response(413, **TOO_LARGE)
@bp.alt_response(415, **NOT_JSON)
def register(customer: str, actor: str):
    """Let a payer charge a processor customer (admin).

    Registering the customer to the payer that holds it already answers the
    binding again."""
    target = f"customer of {actor}"
    try:
        with _pool().connection() as conn:
            done = customers.register(
                conn, processor=_processor(), customer=customer, actor=actor, by=g.principal.actor
            )
    except CustomerBound as refused:
        audit("customer.register", "refused", target=target, reason=str(refused), channel="api")
        raise
    except Exception as failed:
        audit("customer.register", "failure", target=target, reason=type(failed).__name__)
        raise
    reason = "registered" if done.created else "already bound to this payer"
    audit("customer.register", "success", target=target, reason=reason, channel="api")
    return done.binding


@bp.post("/remove")
@require_admin
@bp.arguments(RemoveSchema(), as_kwargs=True)
@bp.response(200, BindingSchema, description="The binding removed.")
@bp.alt_response(400, **problem("An invalid body (VALIDATION_FAILED, messages per field)."))
@bp.alt_response(404, **problem("The customer is bound to no payer (NOT_FOUND)."))
@bp.alt_response(413, **TOO_LARGE)
@bp.alt_response(415, **NOT_JSON)
def remove(customer: str):
    """End a customer's binding (admin): no payer may name it until it is
    registered again (or, with CUSTOMER_BINDING=first_use, named first).
    Payments already scheduled naming it are not touched."""
    with _pool().connection() as conn:
        removed = customers.remove(conn, processor=_processor(), customer=customer)
    if removed is None:
        audit("customer.remove", "refused", target="customer", reason="not bound", channel="api")
        raise NotFound("this customer is bound to no payer")
    target = f"customer of {removed['actor']}"
    audit("customer.remove", "success", target=target, channel="api")
    return removed


@bp.get("")
@require_admin
@bp.arguments(ListQuery(), location="query", as_kwargs=True)
@bp.response(200, BindingPageSchema, description="A page; nextCursor is null on the last one.")
@bp.alt_response(400, **problem("A bad actor, limit or cursor."))
def index(limit: int, actor: str | None = None, cursor: tuple | None = None):
    """The customer bindings, all payers' or one's, oldest first (admin)."""
    after = cursor[0] if cursor else 0
    with _pool().connection() as conn:
        rows, next_id = customers.list_bindings(
            conn, processor=_processor(), actor=actor, limit=limit, after=after
        )
    target = f"customer bindings of {actor}" if actor else "customer bindings"
    audit("admin.read", "success", target=target, channel="api")
    return {"data": rows, "next_cursor": (next_id,) if next_id is not None else None}
