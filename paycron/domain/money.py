"""Money rules: integer minor units, ISO 4217 currencies.

Amounts are Python ``int`` / SQL ``bigint`` / JSON integers end to end; no
float or Decimal is ever on the path.
"""

from __future__ import annotations

# Active ISO 4217 alphabetic codes (fund and precious-metal codes excluded:
# nobody schedules a card payment in XAU).
ISO_4217 = frozenset(
    """
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL
BSD BTN BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP
ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR
IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL
LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR
NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD
SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX
USD UYU UZS VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG
""".split()
)


def is_minor_units(value: object) -> bool:
    """A JSON integer: not a bool (a Python int subclass), not 25.0, not "25"."""
    return type(value) is int


#: ISO 4217 minor-unit exponents other than 2: how many digits of an amount
#: in minor units are after the decimal point (JPY 500 is ¥500; BHD 5120 is
#: 5.120 BHD). Every other code in :data:`ISO_4217` has 2.
EXPONENTS = {
    **dict.fromkeys("BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX VND VUV XAF XOF XPF".split(), 0),
    **dict.fromkeys("BHD IQD JOD KWD LYD OMR TND".split(), 3),
}


def exponent(currency: str) -> int:
    """The number of decimals of ``currency``'s major unit (ISO 4217; 2 if unlisted)."""
    return EXPONENTS.get(currency.upper(), 2)


def major_units(amount_minor: int, currency: str) -> str:
    """``amount_minor`` as people read it, without the code: ``50003`` USD is
    ``500.03``, ``500`` JPY is ``500``, ``5120`` BHD is ``5.120``; thousands
    are grouped with commas. Exact: integer arithmetic only."""
    digits = exponent(currency)
    sign = "-" if amount_minor < 0 else ""
    whole, fraction = divmod(abs(amount_minor), 10**digits)
    text = f"{whole:,}"
    if digits:
        text += f".{fraction:0{digits}d}"
    return sign + text
