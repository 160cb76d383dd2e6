"""The idempotency key a payment's calls carry at the processor.

A payment starts at key generation 1, whose key is the payment id itself;
a payment the processor is known not to hold a charge for may move to the
next generation, ``<id>:<n>``. The schema computes the same key in SQL
(``paycron_idempotency_key``), and a test holds the two together.
"""

from __future__ import annotations


def gateway_key(payment_id: object, generation: int) -> str:
    """The idempotency key of a payment's key generation (docs/design.md): the
    payment id for the first, ``<id>:<n>`` after."""
    return str(payment_id) if generation <= 1 else f"{payment_id}:{generation}"
