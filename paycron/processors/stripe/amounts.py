"""Stripe's rules for an amount in a currency, checked when a payment is
created (docs/api.md, Stripe's amount rules): a 400 now rather than a charge
Stripe refuses at the due date, months later.

From Stripe's "Supported currencies" page (https://docs.stripe.com/currencies):

- *Presentment currencies*: the currencies a charge can be made in (card
  payments; lower case on the wire).
- *Minor units*: every amount is an integer in the currency's smallest unit
  (1000 = 10.00 USD). For the *zero-decimal* currencies the amount is a count
  of whole units, not multiplied by 100 (500 = 500 JPY).
- *Special cases*: ISK and UGX are charged in whole units but written with
  two decimals for backwards compatibility, so the amount is a multiple of
  100 (500 = 5 ISK). HUF and TWD are zero-decimal for payouts only: a charge
  may have two decimals.
- *Three-decimal currencies* (BHD, JOD, KWD, OMR, TND): the API takes three
  decimals, but the last digit must be 0 for Stripe's partners (5.124 KWD is
  refused; 5120 or 5130 is charged).
- *Minimum and maximum charge amounts*
  (https://docs.stripe.com/currencies#minimum-and-maximum-charge-amounts): an
  amount has at most eight digits (99,999,999 minor units: 999,999.99 USD),
  and at least the table's minimum for its currency (0.50 USD, 0.30 GBP,
  50 JPY, ...). Stripe applies the minimum of the account's *settlement*
  currency after conversion; the table is checked for the charge's own
  currency, which is exact when the two are the same and the best a create
  can do without exchange rates. A currency without a row has no minimum
  here beyond the API's own (> 0).

The engine's ``amount`` is already in Stripe's minor units (docs/api.md: integer
minor units), so nothing is converted: these rules only refuse.
"""

from __future__ import annotations

#: Stripe's largest amount: eight digits of minor units.
MAX_AMOUNT = 99_999_999

#: Stripe's presentment currencies, as on its currencies page. Stripe still
#: names São Tomé's dobra by its pre-2018 code STD, which ISO 4217 retired
#: (the API takes only current ISO codes, so STN is refused as unsupported).
#: The three-decimal currencies are supported by the Payment Intents API.
CURRENCIES = frozenset(
    """
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL
BSD BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CVE CZK DJF DKK DOP DZD EGP ETB EUR
FJD FKP GBP GEL GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR ISK JMD JOD JPY
KES KGS KHR KMF KRW KWD KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP
MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG
QAR RON RSD RUB RWF SAR SBD SCR SEK SGD SHP SLE SOS SRD SZL THB TJS TND TOP TRY
TTD TWD TZS UAH UGX USD UYU UZS VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW
""".split()
)

#: Amounts in whole units (500 = 500 JPY).
ZERO_DECIMAL = frozenset("BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF VND VUV XAF XOF XPF".split())
#: Whole units written with two decimals: the amount is a multiple of 100.
WHOLE_UNITS_IN_HUNDREDTHS = frozenset({"ISK", "UGX"})
#: Three decimals, the last of which must be 0.
THREE_DECIMAL = frozenset({"BHD", "JOD", "KWD", "OMR", "TND"})

#: Stripe's minimum charge per currency, in its minor units.
MINIMUM_CHARGE = {
    "USD": 50,
    "AED": 200,
    "AUD": 50,
    "BGN": 100,
    "BRL": 50,
    "CAD": 50,
    "CHF": 50,
    "CZK": 1500,
    "DKK": 250,
    "EUR": 50,
    "GBP": 30,
    "HKD": 400,
    "HUF": 17500,
    "INR": 50,
    "JPY": 50,
    "MXN": 1000,
    "MYR": 200,
    "NOK": 300,
    "NZD": 50,
    "PLN": 200,
    "RON": 200,
    "SEK": 300,
    "SGD": 50,
    "THB": 1000,
}


def decimals(currency: str) -> int:
    """Digits after the decimal point in an amount of ``currency`` as Stripe writes it."""
    if currency in ZERO_DECIMAL:
        return 0
    return 3 if currency in THREE_DECIMAL else 2


def in_units(amount: int, currency: str) -> str:
    """``amount`` minor units as a person reads them: ``0.50 USD``, ``50 JPY``."""
    places = decimals(currency)
    if places == 0:
        return f"{amount} {currency}"
    whole, fraction = divmod(amount, 10**places)
    return f"{whole}.{fraction:0{places}d} {currency}"


#: The refusal of a currency outside :data:`CURRENCIES`.
UNSUPPORTED_CURRENCY = "currency must be one the processor (Stripe) charges in"


def currency_problem(currency: str) -> str | None:
    """Why Stripe cannot charge in ``currency`` (an ISO 4217 code), or None."""
    return None if currency in CURRENCIES else UNSUPPORTED_CURRENCY


def amount_problem(amount: int, currency: str) -> str | None:
    """Why Stripe would refuse to charge ``amount`` minor units of a currency
    it supports, or None. Each message is stable (clients may match it)."""
    if amount > MAX_AMOUNT:
        return f"amount must be at most {MAX_AMOUNT} minor units with the processor (Stripe)"
    minimum = MINIMUM_CHARGE.get(currency)
    if minimum is not None and amount < minimum:
        return (
            f"amount must be at least {minimum} in {currency} "
            f"({in_units(minimum, currency)}, the processor's minimum charge)"
        )
    if currency in THREE_DECIMAL and amount % 10:
        return (
            f"amount in {currency} must end in 0: the processor (Stripe) charges "
            "three-decimal currencies in steps of 10 minor units"
        )
    if currency in WHOLE_UNITS_IN_HUNDREDTHS and amount % 100:
        return (
            f"amount in {currency} must be a multiple of 100: the processor (Stripe) "
            "charges whole units, written with two decimals"
        )
    return None
