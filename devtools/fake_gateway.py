"""A handle on a running fake gateway (``gateway.fake``): its test
controls over HTTP, for the tests, the benchmarks and the demo.

The fake serves two surfaces: the card API at its root, and a Stripe-shaped
one under ``/stripe`` (``stripe_url``: the official SDK's ``api`` base
address), whose own controls are ``/_stripe…`` and whose objects are in
``/_ledger``'s ``stripe`` section.
"""

from __future__ import annotations

from typing import Any

import httpx

from gateway.fake.stripe_settings import DEFAULT_API_KEY, DEFAULT_WEBHOOK_SECRET

STRIPE_PREFIX = "/stripe"
#: The key and signing secret the fake starts with unless told otherwise.
STRIPE_API_KEY = DEFAULT_API_KEY
STRIPE_WEBHOOK_SECRET = DEFAULT_WEBHOOK_SECRET


def charges_per_key(ledger: list[dict]) -> dict[str, int]:
    """How many charges the gateway holds for each idempotency key."""
    counts: dict[str, int] = {}
    for charge in ledger:
        counts[charge["idempotency_key"]] = counts.get(charge["idempotency_key"], 0) + 1
    return counts


def succeeded_per_payment_id(stripe_ledger: dict[str, list[dict]]) -> dict[str, int]:
    """How many succeeded Stripe payment intents each `paycron_payment_id` has
    (the invariant: never more than one)."""
    counts: dict[str, int] = {}
    for intent in stripe_ledger["payment_intents"]:
        payment_id = intent["paycron_payment_id"]
        if intent["status"] == "succeeded" and payment_id is not None:
            counts[payment_id] = counts.get(payment_id, 0) + 1
    return counts


def stripe_args(
    *,
    api_key: str | None = None,
    webhook_urls: tuple[str, ...] = (),
    webhook_secrets: tuple[str, ...] = (),
    settle_seconds: float | None = None,
    search_lag_seconds: float | None = None,
) -> list[str]:
    """Command-line options of `python -m gateway.fake` for the Stripe surface
    (append them to `devtools.procs.gateway_args(port)`)."""
    args: list[str] = []
    if api_key is not None:
        args += ["--stripe-api-key", api_key]
    for url in webhook_urls:
        args += ["--stripe-webhook-url", url]
    for secret in webhook_secrets:
        args += ["--stripe-webhook-secret", secret]
    if settle_seconds is not None:
        args += ["--stripe-settle-seconds", str(settle_seconds)]
    if search_lag_seconds is not None:
        args += ["--stripe-search-lag-seconds", str(search_lag_seconds)]
    return args


def stripe_test_method(n: int) -> str:
    """The soak's mix of Stripe's test payment methods: mostly cards that
    succeed, bank debits that settle later (1 in 10 succeeds, 1 in 50 fails),
    declines, a decline Stripe advises retrying, one needing its customer."""
    if n % 40 == 3:
        return "pm_card_chargeDeclined"
    if n % 50 == 2:
        return "pm_bank_processing_fails"
    if n % 10 == 1:
        return "pm_bank_processing_succeeds"
    if n % 31 == 7:
        return "pm_card_chargeDeclinedProcessingError"
    if n % 97 == 5:
        return "pm_card_authenticationRequired"
    return "pm_card_visa"


class GatewayHandle:
    """The fake gateway's controls: faults, counters, the ledger, reset; and
    the Stripe surface's settings, settlements, events and ledger."""

    def __init__(self, url: str, *, timeout: float = 10):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=timeout)

    def reset(self) -> None:
        self.http.post("/_reset").raise_for_status()

    def faults(self, **settings) -> dict:
        response = self.http.post("/_faults", json=settings)
        response.raise_for_status()
        return response.json()

    def ledger(self) -> list[dict]:
        return self.http.get("/_ledger").json()["charges"]

    def stats(self) -> dict:
        return self.http.get("/_stats").json()

    def charges_per_key(self) -> dict[str, int]:
        return charges_per_key(self.ledger())

    def charge(
        self, row: dict, *, amount: int | None = None, currency: str = "USD", key: str | None = None
    ) -> dict:
        """Charge for payment ``row`` as a caller other than our worker would
        (a zombie, a lost answer): keyed by its id unless ``key`` is given."""
        response = self.http.post(
            "/v1/charges",
            headers={"Idempotency-Key": key or str(row["id"])},
            json={
                "amount": amount or row["amount_minor"],
                "currency": currency,
                "reference": str(row["id"]),
            },
        )
        if response.status_code != 201:  # a replay (200) or a refusal: no new charge
            raise RuntimeError(f"no charge made: {response.status_code} {response.text}")
        return response.json()

    # ---- the Stripe surface

    @property
    def stripe_url(self) -> str:
        """The Stripe SDK's ``api`` base address for this fake."""
        return self.url + STRIPE_PREFIX

    def stripe_client(self, api_key: str = STRIPE_API_KEY, **options: Any):
        """An official-SDK client on this fake (no retries of its own)."""
        import stripe

        options.setdefault("max_network_retries", 0)
        return stripe.StripeClient(api_key, base_addresses={"api": self.stripe_url}, **options)

    def stripe(self, **settings) -> dict:
        """Change the Stripe surface's settings (``POST /_stripe``): ``api_key``,
        ``search_lag_ms``, ``settle_delay_ms``, ``webhook_urls``, ``webhook_secrets``,
        ``enabled_events``, ``webhook_max_attempts``, ``webhook_retry_ms``,
        ``webhook_duplicate_rate``, ``webhook_loss_rate``, ``webhook_reorder_ms``,
        ``decline_advice_code``, ``reset``."""
        response = self.http.post("/_stripe", json=settings)
        response.raise_for_status()
        return response.json()

    def stripe_state(self) -> dict:
        """Settings, the last Stripe-Version seen (and counts), intents still processing."""
        return self.http.get("/_stripe").json()

    def stripe_settle(self, payment_intent: str | None = None) -> list[str]:
        """Settle processing bank debits now (one, or all); the ids settled."""
        body = {} if payment_intent is None else {"payment_intent": payment_intent}
        response = self.http.post("/_stripe/settle", json=body)
        response.raise_for_status()
        return response.json()["settled"]

    def stripe_events(self) -> list[dict]:
        """Every event made, oldest first, each with its webhook deliveries."""
        return self.http.get("/_stripe/events").json()["events"]

    def stripe_ledger(self) -> dict[str, list[dict]]:
        """Every Stripe intent, charge and refund (`payment_intents`, `charges`, `refunds`)."""
        return self.http.get("/_ledger").json()["stripe"]

    def succeeded_per_payment_id(self) -> dict[str, int]:
        return succeeded_per_payment_id(self.stripe_ledger())

    def close(self) -> None:
        self.http.close()
