"""Reading the Stripe surface back through the official SDK: lists that page
(strongly consistent), a search that lags, charges listed with their status,
and refunds."""

from __future__ import annotations

import time

import pytest
import stripe

from devtools.fake_gateway import GatewayHandle
from tests.fake_gateway.stripeclient import card_error, charge, intent_params, new_key


def test_25_intents_page_newest_first_in_pages_of_ten(
    sdk_client: stripe.StripeClient,
) -> None:
    mine = [charge(sdk_client, customer="cus_pager", payment_id=f"pay-{n}").id for n in range(25)]
    charge(sdk_client, customer="cus_other")

    pages, params = [], {"customer": "cus_pager", "limit": 10}
    while True:
        page = sdk_client.v1.payment_intents.list(params=params)
        assert page.object == "list" and page.url == "/v1/payment_intents"
        pages.append([intent.id for intent in page.data])
        if not page.has_more:
            break
        params = {**params, "starting_after": page.data[-1].id}
    assert [len(page) for page in pages] == [10, 10, 5]
    assert sum(pages, []) == mine[::-1]

    everything = sdk_client.v1.payment_intents.list(params={"customer": "cus_pager"})
    assert len(everything.data) == 10  # Stripe's default limit
    assert [intent.id for intent in everything.auto_paging_iter()] == mine[::-1]

    before = sdk_client.v1.payment_intents.list(
        params={"customer": "cus_pager", "limit": 3, "ending_before": mine[10]}
    )
    assert [intent.id for intent in before.data] == mine[13:10:-1] and before.has_more


def test_created_filters_and_limits(sdk_client: stripe.StripeClient) -> None:
    intent = charge(sdk_client, customer="cus_when")

    def listed(**created):
        params = {"customer": "cus_when", "created": created}
        return [i.id for i in sdk_client.v1.payment_intents.list(params=params).data]

    assert listed(gte=intent.created - 3600) == [intent.id]
    assert listed(gte=intent.created + 1) == []
    assert listed(lt=intent.created) == []
    assert listed(lte=intent.created) == [intent.id]
    for bad in ({"limit": 0}, {"limit": 101}, {"starting_after": "pi_nope"}):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            sdk_client.v1.payment_intents.list(params=bad)
        assert refused.value.http_status == 400


def test_every_charge_is_listed_with_its_status_and_the_intents_metadata(
    sdk_client: stripe.StripeClient,
) -> None:
    start = int(time.time())
    succeeded = charge(sdk_client, payment_id="pay-ok")
    declined = card_error(sdk_client, "pm_card_chargeDeclined", payment_id="pay-no")
    pending = charge(sdk_client, "pm_bank_processing_succeeds", payment_id="pay-bank")

    charges, params = [], {"created": {"gte": start - 1, "lt": int(time.time()) + 2}, "limit": 2}
    page = sdk_client.v1.charges.list(params=params)
    charges += page.data
    while page.has_more:
        page = sdk_client.v1.charges.list(params={**params, "starting_after": page.data[-1].id})
        charges += page.data
    assert [(c.payment_intent, c.status, c.metadata["paycron_payment_id"]) for c in charges] == [
        (pending.id, "pending", "pay-bank"),
        (declined.error.payment_intent.id, "failed", "pay-no"),
        (succeeded.id, "succeeded", "pay-ok"),
    ]
    assert charges[0].id.startswith("py_")  # a bank debit is a payment, not a card charge
    assert sdk_client.v1.charges.list(params={"created": {"lt": start - 1}}).data == []
    by_intent = sdk_client.v1.charges.list(params={"payment_intent": succeeded.id})
    assert [c.id for c in by_intent.data] == [succeeded.latest_charge]


def test_search_lags_behind_while_lists_are_strongly_consistent(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    gateway_handle.stripe(search_lag_ms=600)
    query = {"query": "metadata['paycron_payment_id']:'pay-lag'"}
    intent = sdk_client.v1.payment_intents.create(
        params=intent_params(payment_id="pay-lag", confirm=False)
    )

    assert sdk_client.v1.payment_intents.search(params=query).data == []
    listed = sdk_client.v1.payment_intents.list(params={"customer": "cus_test"})
    assert [i.id for i in listed.data] == [intent.id]

    time.sleep(0.65)
    found = sdk_client.v1.payment_intents.search(params=query)
    assert found.object == "search_result" and [i.id for i in found.data] == [intent.id]

    # A change lags too: the index still shows the intent as it was.
    sdk_client.v1.payment_intents.cancel(intent.id)
    assert sdk_client.v1.payment_intents.search(params=query).data[0].status == (
        "requires_confirmation"
    )
    time.sleep(0.65)
    assert sdk_client.v1.payment_intents.search(params=query).data[0].status == "canceled"


def test_search_queries_combine_clauses_and_page(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    gateway_handle.stripe(search_lag_ms=0)
    for n in range(3):
        charge(sdk_client, payment_id="pay-many", amount=1000 + n)
    charge(sdk_client, payment_id="pay-many", customer="cus_else")
    search = sdk_client.v1.payment_intents.search
    both = "metadata['paycron_payment_id']:'pay-many' AND customer:'cus_test'"
    first = search(params={"query": both, "limit": 2})
    assert len(first.data) == 2 and first.has_more
    rest = search(params={"query": both, "limit": 2, "page": first.next_page})
    assert len(rest.data) == 1 and not rest.has_more and rest.next_page is None
    assert len(search(params={"query": "amount>1000 AND status:'succeeded'"}).data) == 2
    assert len(search(params={"query": "customer:'cus_else' OR amount:1000"}).data) == 2
    for bad in ("nonsense", "color:'red'", "amount:1 AND x:'y' OR z:'w'"):
        with pytest.raises(stripe.InvalidRequestError):
            search(params={"query": bad})


def test_a_refund_marks_the_charge_refunded_once(
    sdk_client: stripe.StripeClient,
    gateway_handle: GatewayHandle,
) -> None:
    intent = charge(sdk_client, amount=2500, payment_id="pay-refund")
    key = f"refund:{intent.id}"
    refund = sdk_client.v1.refunds.create(
        params={"payment_intent": intent.id}, options={"idempotency_key": key}
    )
    assert refund.id.startswith("re_") and refund.object == "refund"
    assert (
        refund.status,
        refund.amount,
        refund.currency,
        refund.charge,
        refund.payment_intent,
    ) == ("succeeded", 2500, "usd", intent.latest_charge, intent.id)
    refunded = sdk_client.v1.charges.retrieve(intent.latest_charge)
    assert (refunded.refunded, refunded.amount_refunded, refunded.status) == (
        True,
        2500,
        "succeeded",
    )

    again = sdk_client.v1.refunds.create(
        params={"payment_intent": intent.id}, options={"idempotency_key": key}
    )
    assert again.id == refund.id  # replayed
    with pytest.raises(stripe.InvalidRequestError) as twice:
        sdk_client.v1.refunds.create(
            params={"payment_intent": intent.id}, options={"idempotency_key": new_key()}
        )
    assert twice.value.code == "charge_already_refunded"
    assert [r["id"] for r in gateway_handle.stripe_ledger()["refunds"]] == [refund.id]
    listed = sdk_client.v1.refunds.list(params={"payment_intent": intent.id})
    assert [r.id for r in listed.data] == [refund.id]


def test_a_partial_refund_then_the_rest(sdk_client: stripe.StripeClient) -> None:
    intent = charge(sdk_client, amount=1000)
    sdk_client.v1.refunds.create(params={"payment_intent": intent.id, "amount": 300})
    partly = sdk_client.v1.charges.retrieve(intent.latest_charge)
    assert (partly.refunded, partly.amount_refunded) == (False, 300)
    with pytest.raises(stripe.InvalidRequestError) as too_much:
        sdk_client.v1.refunds.create(params={"payment_intent": intent.id, "amount": 701})
    assert too_much.value.code == "amount_too_large"
    assert sdk_client.v1.refunds.create(params={"payment_intent": intent.id}).amount == 700
    assert sdk_client.v1.charges.retrieve(intent.latest_charge).refunded


def test_only_a_succeeded_payment_can_be_refunded(sdk_client: stripe.StripeClient) -> None:
    declined = card_error(sdk_client, "pm_card_chargeDeclined").error.payment_intent
    processing = charge(sdk_client, "pm_bank_processing_succeeds")
    for intent_id in (declined.id, processing.id):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            sdk_client.v1.refunds.create(params={"payment_intent": intent_id})
        assert refused.value.code == "charge_not_refundable"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        sdk_client.v1.refunds.create(params={"payment_intent": "pi_nope"})
    assert missing.value.code == "resource_missing"
