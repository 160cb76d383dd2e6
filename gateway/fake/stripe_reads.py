"""The Stripe surface's reads: retrieving, listing and searching, and `expand`.

Lists are newest first, strongly consistent, paged by ``limit`` (default
10, at most 100) and the ``starting_after``/``ending_before`` cursors, with
``created`` ranges and each list's equality filters. The search sees
intents as they were ``search_lag_ms`` ago (Stripe's index lags: never a
read-after-write) and pages by an opaque ``page`` token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.fake.jsonapi import json_response
from gateway.fake.stripe_idempotency import Call
from gateway.fake.stripe_ledger import Collection, StripeLedger
from gateway.fake.stripe_objects import StripeObject
from gateway.fake.stripe_search import parse_query
from gateway.fake.stripe_wire import (
    Params,
    check_known,
    created_range,
    expansions,
    invalid,
    limit,
    list_object,
    missing,
    parse_form,
    search_result,
    string,
)

PAGING = frozenset({"limit", "starting_after", "ending_before", "expand"})
#: What each object type can expand, and from which of the ledger's collections.
EXPANDABLE = {
    "payment_intent": {"latest_charge": "charges"},
    "charge": {"payment_intent": "intents"},
    "refund": {"charge": "charges", "payment_intent": "intents"},
}


class StripeReads:
    """The GET handlers, over the current ledger (`ledger()`: a new one after a reset)."""

    def __init__(self, ledger: Callable[[], StripeLedger]) -> None:
        self.ledger = ledger

    async def get_intent(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/payment_intents/{id}`."""
        params = query_params(request)
        check_known(params, frozenset({"expand", "client_secret"}))
        intent = find_intent(self.ledger(), request.match_info["id"])
        return self._one(intent, params)

    async def list_intents(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/payment_intents?customer=&created[gte]=&limit=&starting_after=`."""
        return self._list(
            request, self.ledger().intents, "/v1/payment_intents", "payment_intent", ("customer",)
        )

    async def search_intents(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/payment_intents/search?query=&limit=&page=`."""
        params = query_params(request)
        check_known(params, frozenset({"query", "limit", "page", "expand"}))
        query = parse_query(string(params, "query", required=True) or "")
        size, page = limit(params), string(params, "page")
        paths = [path.removeprefix("data.") for path in expansions(params)]
        total = "total_count" in paths
        paths = [path for path in paths if path != "total_count"]
        found = [intent for intent in self.ledger().searchable() if query.matches(intent)]
        start = 0
        if page is not None:
            ids = [intent["id"] for intent in found]
            cursor = page.removeprefix("page_")
            if cursor not in ids:
                raise invalid(f"Invalid page: {page}", param="page")
            start = ids.index(cursor) + 1
        data = found[start : start + size]
        has_more = start + size < len(found)
        next_page = f"page_{data[-1]['id']}" if has_more else None
        result = search_result(
            "/v1/payment_intents/search",
            self._expand_all(data, paths, "payment_intent"),
            has_more,
            next_page,
        )
        if total:
            result["total_count"] = len(found)
        return json_response(200, result)

    async def list_charges(self, request: web.Request, call: Call) -> web.StreamResponse:
        """`GET /v1/charges?created[gte]=&created[lt]=&…`: every charge, with its status."""
        return self._list(
            request, self.ledger().charges, "/v1/charges", "charge", ("customer", "payment_intent")
        )

    async def get_charge(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._get(request, self.ledger().charges, "charge")

    async def list_refunds(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._list(
            request, self.ledger().refunds, "/v1/refunds", "refund", ("charge", "payment_intent")
        )

    async def get_refund(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._get(request, self.ledger().refunds, "refund")

    async def list_events(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._list(request, self.ledger().events, "/v1/events", "event", ("type",))

    async def get_event(self, request: web.Request, call: Call) -> web.StreamResponse:
        return self._get(request, self.ledger().events, "event")

    # ---- the shapes every read shares

    def _get(self, request: web.Request, collection: Collection, kind: str) -> web.StreamResponse:
        params = query_params(request)
        check_known(params, frozenset({"expand"}))
        obj = collection.get(request.match_info["id"])
        if obj is None:
            raise missing(kind, request.match_info["id"], "id")
        return self._one(obj, params)

    def _one(self, obj: StripeObject, params: Params) -> web.StreamResponse:
        return json_response(
            200, expand(self.ledger(), obj, check_expansions(params, obj["object"]))
        )

    def _list(
        self,
        request: web.Request,
        collection: Collection,
        url: str,
        kind: str,
        filters: tuple[str, ...],
    ) -> web.StreamResponse:
        """A list endpoint: newest first, `created` ranges, equality `filters`, cursors."""
        params = query_params(request)
        check_known(params, PAGING | {"created", *filters})
        where = {name: value for name in filters if (value := string(params, name)) is not None}
        cursors = {}
        for name in ("starting_after", "ending_before"):
            cursor = string(params, name)
            if cursor is not None and collection.get(cursor) is None:
                raise missing(kind, cursor, name, 400)
            cursors[name] = cursor
        data, has_more = collection.page(
            limit=limit(params), where=where, created=created_range(params), **cursors
        )
        paths = expansions(params)
        nested = [path.removeprefix("data.") for path in paths if path.startswith("data.")]
        if len(nested) != len(paths):
            raise invalid("Only data.* can be expanded on a list.", param="expand")
        return json_response(200, list_object(url, self._expand_all(data, nested, kind), has_more))

    def _expand_all(
        self, data: list[StripeObject], paths: list[str], kind: str
    ) -> list[StripeObject]:
        for path in paths:
            if path not in EXPANDABLE.get(kind, {}):
                raise invalid(f"This property cannot be expanded (data.{path}).", param="expand")
        return [expand(self.ledger(), obj, paths) for obj in data]


def check_expansions(params: Params, kind: str) -> list[str]:
    """The `expand[]` paths of a request about a `kind` object, each one it can expand."""
    paths = expansions(params)
    for path in paths:
        if path not in EXPANDABLE.get(kind, {}):
            raise invalid(f"This property cannot be expanded ({path}).", param="expand")
    return paths


def expand(ledger: StripeLedger, obj: StripeObject, paths: list[str]) -> StripeObject:
    """`obj` with the ids at `paths` replaced by their objects (a copy, if any)."""
    if not paths:
        return obj
    expanded = dict(obj)  # only top-level ids are replaced
    for path in paths:
        collection: Any = getattr(ledger, EXPANDABLE[obj["object"]][path])
        if expanded.get(path) is not None:
            expanded[path] = collection.get(expanded[path])
    return expanded


def find_intent(
    ledger: StripeLedger, intent_id: str, *, param: str = "intent", status: int = 404
) -> StripeObject:
    intent = ledger.intents.get(intent_id)
    if intent is None:
        raise missing("payment_intent", intent_id, param, status)
    return intent


def query_params(request: web.Request) -> Params:
    return parse_form(request.query_string)
