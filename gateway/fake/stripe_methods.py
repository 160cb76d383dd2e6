"""What the Stripe surface knows of payments: Stripe's test payment methods,
what confirming an intent with each one does, and the amount limits.

A test payment method decides what the card network (or the bank) says once
a charge reaches it; the fault settings decide whether it reaches it at all
(latency, timeouts, 5xx, dropped answers), as at the card surface.
"""

from __future__ import annotations

import dataclasses
import enum

#: Stripe's ceiling for one charge, in minor units (99,999,999: $999,999.99).
MAX_AMOUNT = 99_999_999
#: Stripe's minimum charge per currency, in minor units (its published table);
#: a currency not listed here needs at least one minor unit.
MINIMUM_AMOUNTS = {
    "usd": 50,
    "aed": 200,
    "aud": 50,
    "bgn": 100,
    "brl": 50,
    "cad": 50,
    "chf": 50,
    "czk": 1500,
    "dkk": 250,
    "eur": 50,
    "gbp": 30,
    "hkd": 400,
    "huf": 17500,
    "inr": 50,
    "jpy": 50,
    "mxn": 1000,
    "myr": 200,
    "nok": 300,
    "nzd": 50,
    "pln": 200,
    "ron": 200,
    "sek": 300,
    "sgd": 50,
    "thb": 1000,
}


def minimum_amount(currency: str) -> int:
    """The smallest charge Stripe accepts in `currency` (lower case)."""
    return MINIMUM_AMOUNTS.get(currency, 1)


class Effect(enum.Enum):
    """What confirming an intent with a payment method does, once the charge reaches it."""

    SUCCEED = "succeed"  # the charge succeeds: intent succeeded
    DECLINE = "decline"  # 402, a failed charge, intent back to requires_payment_method
    AUTHENTICATE = "authenticate"  # 3-D Secure: 402 off session, requires_action on session
    PROCESS = "process"  # a bank debit: intent processing, charge pending, settled later


@dataclasses.dataclass(frozen=True, slots=True)
class Decline:
    """A decline as Stripe reports it: `error.code`, `error.decline_code`, `error.message`."""

    code: str
    decline_code: str | None
    message: str
    #: Whether an `advice_code` setting may ride on it (issuer declines; not 3-D Secure).
    advisable: bool = True


GENERIC_DECLINE = Decline("card_declined", "generic_decline", "Your card was declined.")
INSUFFICIENT_FUNDS = Decline(
    "card_declined", "insufficient_funds", "Your card has insufficient funds."
)
PROCESSING_ERROR = Decline(
    "processing_error",
    None,
    "An error occurred while processing your card. Try again in a little bit.",
)
AUTHENTICATION_REQUIRED = Decline(
    "authentication_required",
    "authentication_required",
    "Your card was declined. This transaction requires authentication.",
    advisable=False,
)
BANK_DEBIT_FAILED = Decline(
    "payment_method_provider_decline",
    "insufficient_funds",
    "The customer's bank account has insufficient funds.",
    advisable=False,
)


@dataclasses.dataclass(frozen=True, slots=True)
class MethodSpec:
    """One test payment method: its type, its effect, and how it fails."""

    type: str
    effect: Effect
    decline: Decline | None = None
    #: A decline that happens on the first confirmation of each intent only,
    #: so confirming the same intent again succeeds.
    once: bool = False
    #: For `PROCESS`: whether the debit settles to success or to failure.
    settles: bool = True

    @property
    def charge_prefix(self) -> str:
        """Card payments make `ch_` charges; other methods `py_` payments, as at Stripe."""
        return "ch_" if self.type == "card" else "py_"


#: Every payment method id the surface knows; any other `pm_…` does not exist.
PAYMENT_METHODS: dict[str, MethodSpec] = {
    "pm_card_visa": MethodSpec("card", Effect.SUCCEED),
    "pm_card_mastercard": MethodSpec("card", Effect.SUCCEED),
    "pm_card_chargeDeclined": MethodSpec("card", Effect.DECLINE, GENERIC_DECLINE),
    "pm_card_chargeDeclinedInsufficientFunds": MethodSpec(
        "card", Effect.DECLINE, INSUFFICIENT_FUNDS
    ),
    "pm_card_chargeDeclinedProcessingError": MethodSpec(
        "card", Effect.DECLINE, PROCESSING_ERROR, once=True
    ),
    "pm_card_authenticationRequired": MethodSpec(
        "card", Effect.AUTHENTICATE, AUTHENTICATION_REQUIRED
    ),
    "pm_bank_processing_succeeds": MethodSpec("us_bank_account", Effect.PROCESS),
    "pm_bank_processing_fails": MethodSpec(
        "us_bank_account", Effect.PROCESS, BANK_DEBIT_FAILED, settles=False
    ),
}
