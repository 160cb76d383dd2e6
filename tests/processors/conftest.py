"""Both clients of the card processor answer every wire case alike: the
blocking one (urllib3, the threaded executor and every rare path) and the
event loop's (its own connections, ``EXECUTOR=asyncio``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from paycron.domain.processing import CallResult, ChargeRequest
from paycron.processors.card.aio import AsyncCardProcessor
from paycron.processors.card.client import CardProcessor

ChargeAt = Callable[[str, ChargeRequest], CallResult]


def blocking_charge(url: str, request: ChargeRequest) -> CallResult:
    client = CardProcessor(url, timeout=2)
    try:
        return client.charge(request)
    finally:
        client.close()


def loop_charge(url: str, request: ChargeRequest) -> CallResult:
    async def charge() -> CallResult:
        client = AsyncCardProcessor(url, timeout=2)
        try:
            return await client.charge(request)
        finally:
            await client.close()

    return asyncio.run(charge())


@pytest.fixture(params=["blocking", "loop"])
def charge_at(request) -> ChargeAt:
    """One charge at a URL with one of the two clients, each test once each."""
    return blocking_charge if request.param == "blocking" else loop_charge
