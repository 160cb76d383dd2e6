"""The Stripe surface's own settings (`POST /_stripe`): its secret key, the search
lag, bank debits' settlement delay, webhook endpoints and how deliveries go
wrong, and the advice a decline carries.

Like `faults`, a change is validated whole before anything is applied, and
``reset: true`` starts from the process's initial settings (its command line).
Durations are whole milliseconds, rates probabilities in [0, 1].
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.fake.errors import InvalidFaults

DEFAULT_API_KEY = "sk_test_paycron"
DEFAULT_WEBHOOK_SECRET = "whsec_paycron"
#: Stripe's search "generally" catches up within a minute.
DEFAULT_SEARCH_LAG_MS = 60_000
#: A real bank debit takes days; the stub settles after seconds (and on `/_stripe/settle`).
DEFAULT_SETTLE_DELAY_MS = 5_000
#: Stripe retries a failed delivery for days; the stub a few times, doubling the wait.
DEFAULT_WEBHOOK_MAX_ATTEMPTS = 5
DEFAULT_WEBHOOK_RETRY_MS = 1_000
ADVICE_CODES = ("try_again_later", "do_not_try_again", "confirm_card_data")


@dataclasses.dataclass(frozen=True, slots=True)
class StripeSettings:
    """The settings; the defaults deliver no events (no endpoint) and add no advice."""

    api_key: str = DEFAULT_API_KEY
    search_lag_ms: int = DEFAULT_SEARCH_LAG_MS
    settle_delay_ms: int = DEFAULT_SETTLE_DELAY_MS
    webhook_urls: tuple[str, ...] = ()
    #: Every event is signed with each (a `v1=` per secret, as while Stripe rolls one).
    webhook_secrets: tuple[str, ...] = (DEFAULT_WEBHOOK_SECRET,)
    #: Event types sent to the endpoints ("*": all), like an endpoint's `enabled_events`.
    enabled_events: tuple[str, ...] = ("*",)
    webhook_max_attempts: int = DEFAULT_WEBHOOK_MAX_ATTEMPTS
    webhook_retry_ms: int = DEFAULT_WEBHOOK_RETRY_MS
    webhook_duplicate_rate: float = 0.0
    webhook_loss_rate: float = 0.0
    #: Each delivery waits a uniform extra [0, this] first, so events arrive shuffled.
    webhook_reorder_ms: int = 0
    #: The `advice_code` every issuer decline carries (null: none).
    decline_advice_code: str | None = None

    def wants(self, event_type: str) -> bool:
        return "*" in self.enabled_events or event_type in self.enabled_events


FIELDS = frozenset(field.name for field in dataclasses.fields(StripeSettings))
MILLISECOND_FIELDS = ("search_lag_ms", "settle_delay_ms", "webhook_retry_ms", "webhook_reorder_ms")
RATE_FIELDS = ("webhook_duplicate_rate", "webhook_loss_rate")
LIST_FIELDS = ("webhook_urls", "webhook_secrets", "enabled_events")


def updated_settings(
    current: StripeSettings, initial: StripeSettings, payload: dict[str, Any]
) -> StripeSettings:
    """The settings after a `POST /_stripe` body, or `InvalidFaults` and no change."""
    unknown = set(payload) - FIELDS - {"reset"}
    if unknown:
        raise InvalidFaults(f"unknown Stripe settings: {', '.join(sorted(unknown))}")
    reset = payload.get("reset", False)
    if not isinstance(reset, bool):
        raise InvalidFaults("reset must be a boolean")
    changes: dict[str, Any] = {}
    if "api_key" in payload:
        key = payload["api_key"]
        if not isinstance(key, str) or not key.startswith(("sk_test_", "sk_live_")):
            raise InvalidFaults("api_key must be a secret key (sk_test_… or sk_live_…)")
        changes["api_key"] = key
    for name in MILLISECOND_FIELDS:
        if name in payload:
            value = payload[name]
            if type(value) is not int or value < 0:
                raise InvalidFaults(f"{name} must be a non-negative integer")
            changes[name] = value
    for name in RATE_FIELDS:
        if name in payload:
            value = payload[name]
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 1
            ):
                raise InvalidFaults(f"{name} must be a probability between 0 and 1")
            changes[name] = float(value)
    for name in LIST_FIELDS:
        if name in payload:
            value = payload[name]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise InvalidFaults(f"{name} must be a list of non-empty strings")
            changes[name] = tuple(value)
    if "webhook_max_attempts" in payload:
        value = payload["webhook_max_attempts"]
        if type(value) is not int or value < 1:
            raise InvalidFaults("webhook_max_attempts must be a positive integer")
        changes["webhook_max_attempts"] = value
    if "decline_advice_code" in payload:
        value = payload["decline_advice_code"]
        if value is not None and value not in ADVICE_CODES:
            raise InvalidFaults(
                f"decline_advice_code must be null or one of: {', '.join(ADVICE_CODES)}"
            )
        changes["decline_advice_code"] = value
    settings = dataclasses.replace(initial if reset else current, **changes)
    if not settings.webhook_secrets:
        raise InvalidFaults("webhook_secrets needs at least one secret")
    if any(not url.startswith(("http://", "https://")) for url in settings.webhook_urls):
        raise InvalidFaults("webhook_urls must be http(s) URLs")
    return settings


def as_json(settings: StripeSettings) -> dict[str, Any]:
    """The settings as `GET /_stripe` shows them (lists, not tuples)."""
    return {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in dataclasses.asdict(settings).items()
    }
