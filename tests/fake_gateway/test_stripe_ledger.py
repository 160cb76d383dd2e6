"""The Stripe ledger in-process: cursor paging over a collection (filters, an
index, dropped objects), the bounded event log, the search history it prunes,
and the search query language."""

from __future__ import annotations

import time

import pytest

from gateway.fake import stripe_ledger
from gateway.fake.stripe_ledger import Collection, Origin, StripeLedger
from gateway.fake.stripe_methods import PAYMENT_METHODS
from gateway.fake.stripe_search import parse_query
from gateway.fake.stripe_wire import StripeError, parse_form


def filled(count: int) -> Collection:
    collection = Collection("customer")
    for n in range(count):
        collection.add(
            {
                "id": f"obj_{n}",
                "created": 100 + n // 3,
                "customer": "cus_even" if n % 2 == 0 else "cus_odd",
            }
        )
    return collection


def ids(objects: list[dict]) -> list[str]:
    return [obj["id"] for obj in objects]


def test_pages_run_newest_first_with_cursors_filters_and_ranges() -> None:
    collection = filled(12)
    page, more = collection.page(limit=5)
    assert ids(page) == [f"obj_{n}" for n in (11, 10, 9, 8, 7)] and more
    page, more = collection.page(limit=5, starting_after="obj_2")
    assert ids(page) == ["obj_1", "obj_0"] and not more
    page, more = collection.page(limit=2, ending_before="obj_5")
    assert ids(page) == ["obj_7", "obj_6"] and more
    page, _ = collection.page(limit=10, where={"customer": "cus_odd"}, starting_after="obj_7")
    assert ids(page) == ["obj_5", "obj_3", "obj_1"]
    page, _ = collection.page(limit=10, created={"gte": 102, "lt": 103})
    assert ids(page) == ["obj_8", "obj_7", "obj_6"]
    page, _ = collection.page(limit=10, where={"customer": "cus_nobody"})
    assert page == []


def test_dropped_objects_are_gone_from_pages_and_lookups() -> None:
    collection = filled(6)
    collection.drop_oldest(keep=4)
    assert len(collection) == 4 and collection.get("obj_1") is None
    assert ids(collection.page(limit=10)[0]) == ["obj_5", "obj_4", "obj_3", "obj_2"]
    assert ids(collection.page(limit=10, where={"customer": "cus_even"})[0]) == ["obj_4", "obj_2"]
    assert ids(collection.page(limit=10, ending_before="obj_3")[0]) == ["obj_5", "obj_4"]
    assert ids(list(collection)) == ["obj_2", "obj_3", "obj_4", "obj_5"]


def make_intent(ledger: StripeLedger, payment_id: str = "pay-1") -> dict:
    return ledger.create_intent(
        Origin(),
        amount=1000,
        currency="usd",
        customer="cus_1",
        payment_method="pm_card_visa",
        metadata={"paycron_payment_id": payment_id},
        description=None,
        method_type="card",
    )


def test_the_event_log_keeps_the_newest_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stripe_ledger, "EVENTS_KEPT", 5)
    ledger = StripeLedger()
    for n in range(4):  # 3 events each: created, charge.succeeded, succeeded
        intent = make_intent(ledger, f"pay-{n}")
        ledger.confirm(
            intent, "pm_card_visa", PAYMENT_METHODS["pm_card_visa"], Origin(), off_session=True
        )
    assert len(ledger.events) == 5
    assert len(ledger.drain_events()) == 12  # every one was still delivered
    assert ledger.stats["events"] == 12


def test_a_search_sees_the_intent_as_it_was_and_keeps_copies_only_while_visible() -> None:
    ledger = StripeLedger()
    ledger.search_lag_seconds = 0.2
    intent = make_intent(ledger)
    assert list(ledger.searchable()) == []
    time.sleep(0.25)
    ledger.cancel(intent, None, Origin())
    [seen] = ledger.searchable()
    assert seen["status"] == "requires_confirmation" and intent["status"] == "canceled"
    time.sleep(0.25)
    assert [i["status"] for i in ledger.searchable()] == ["canceled"]

    def statuses() -> list[str | None]:
        return [
            None if copy is None else copy["status"] for _, copy in ledger._history[intent["id"]]
        ]

    ledger.cancel(intent, "abandoned", Origin())  # the first version is hidden now
    assert statuses() == ["canceled", None]
    time.sleep(0.25)
    make_intent(ledger, "pay-2")  # any later change forgets what no search can see
    assert statuses() == [None]


def test_search_queries_parse_and_match() -> None:
    intent = {
        "amount": 1500,
        "created": 10,
        "currency": "usd",
        "customer": "cus_1",
        "status": "succeeded",
        "metadata": {"paycron_payment_id": "p-1"},
    }
    matching = [
        "metadata['paycron_payment_id']:'p-1'",
        'metadata["paycron_payment_id"]:"p-1"',
        "amount>=1500 AND currency:'usd'",
        "-status:'canceled'",
        "customer:'cus_2' OR amount<1600",
    ]
    for query in matching:
        assert parse_query(query).matches(intent), query
    for query in ("status:'canceled'", "metadata['other']:'p-1'", "created>10"):
        assert not parse_query(query).matches(intent), query
    for bad in ("", "amount:'x'", "status>'a'", "nope:'x'", "a:'1' AND b:'2' OR c:'3'"):
        with pytest.raises(StripeError):
            parse_query(bad)


def test_forms_nest_as_the_sdk_encodes_them() -> None:
    assert parse_form(
        "amount=10&metadata[a]=1&metadata[b]=&expand[0]=x&expand[1]=y"
        "&created[gte]=5&tags[]=p&tags[]=q"
    ) == {
        "amount": "10",
        "metadata": {"a": "1", "b": ""},
        "expand": ["x", "y"],
        "created": {"gte": "5"},
        "tags": ["p", "q"],
    }
