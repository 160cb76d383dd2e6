"""Both clients of the card processor answer every wire case alike: the
blocking one (urllib3, the threaded executor and every rare path) and the
event loop's (its own connections, ``EXECUTOR=asyncio``), the latter on
both loops a worker may run it on (uvloop's, asyncio's where uvloop is not
installed)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator

import pytest
import uvloop

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


#: The event loops the loop's client is held to, by name.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def loop_charge(url: str, request: ChargeRequest, *, loop: str | None = None) -> CallResult:
    """One charge on a new loop: ``loop``'s, else the policy's (``any_loop``)."""

    async def charge() -> CallResult:
        client = AsyncCardProcessor(url, timeout=2)
        try:
            return await client.charge(request)
        finally:
            await client.close()

    with asyncio.Runner(loop_factory=LOOPS[loop] if loop else None) as runner:
        return runner.run(charge())


@pytest.fixture(params=["blocking", *(f"loop-{name}" for name in LOOPS)])
def charge_at(request) -> ChargeAt:
    """One charge at a URL with one of the two clients (the loop's on each
    loop), each test once each."""
    if request.param == "blocking":
        return blocking_charge
    return functools.partial(loop_charge, loop=request.param.removeprefix("loop-"))


@pytest.fixture(params=list(LOOPS))
def any_loop(request) -> Iterator[str]:
    """The test once on each loop: every loop ``asyncio.run`` makes meanwhile is that one."""
    previous = asyncio.get_event_loop_policy()
    policy = (
        uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()
    )
    asyncio.set_event_loop_policy(policy)
    try:
        yield request.param
    finally:
        asyncio.set_event_loop_policy(previous)
