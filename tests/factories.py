"""Rows the tests seed: the shared factories (``devtools.factories``, which
the benchmarks use too)."""

from __future__ import annotations

from devtools.factories import bulk_insert, insert_event, insert_payment

__all__ = ["bulk_insert", "insert_event", "insert_payment"]
