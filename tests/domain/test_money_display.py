"""Amounts as people read them: major units with the currency's decimals."""

from __future__ import annotations

import pytest

from paycron.domain.money import ISO_4217, exponent, major_units


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [
        (50003, "USD", "500.03"),
        (5, "USD", "0.05"),
        (2500, "eur", "25.00"),
        (500, "JPY", "500"),
        (5120, "BHD", "5.120"),
        (7, "KWD", "0.007"),
        (123456789, "USD", "1,234,567.89"),
        (1234567, "KRW", "1,234,567"),
        (100000000, "TND", "100,000.000"),
    ],
)
def test_major_units_use_the_currencys_exponent(amount, currency, shown):
    assert major_units(amount, currency) == shown


def test_every_listed_exponent_is_an_iso_code_and_the_rest_have_two():
    assert exponent("JPY") == 0 and exponent("USD") == 2 and exponent("BHD") == 3
    assert exponent("GBP") == 2 and exponent("XYZ") == 2
    from paycron.domain.money import EXPONENTS

    assert set(EXPONENTS) <= ISO_4217


def test_exact_for_any_size():
    assert major_units(10**20 + 1, "USD") == "1,000,000,000,000,000,000.01"
