"""One fake gateway for the black-box tests of this directory, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import stripe

from devtools.fake_gateway import GatewayHandle, stripe_args
from tests.fake_gateway.fakeclient import start_gateway
from tests.fake_gateway.stripeclient import sdk
from tests.support import WebhookReceiver


@pytest.fixture(scope="session")
def fake_gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group, url = start_gateway(tmp_path_factory.mktemp("fake-gateway"))
    yield url
    group.stop()


@pytest.fixture
def client(fake_gateway_url: str) -> Iterator[httpx.Client]:
    """A client on a freshly reset gateway."""
    with httpx.Client(base_url=fake_gateway_url, timeout=10) as http:
        http.post("/_reset").raise_for_status()
        yield http


@pytest.fixture
def gateway_handle(fake_gateway_url: str) -> Iterator[GatewayHandle]:
    """The fake's controls (card and Stripe surfaces), freshly reset."""
    handle = GatewayHandle(fake_gateway_url)
    handle.reset()
    yield handle
    handle.close()


@pytest.fixture
def sdk_client(gateway_handle: GatewayHandle) -> stripe.StripeClient:
    """The official Stripe SDK on the fake's Stripe surface, as the engine configures it."""
    return sdk(gateway_handle.stripe_url)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A webhook endpoint in the test process, where paycron receives Stripe's events."""
    endpoint = WebhookReceiver(path="/v1/gateway-events/stripe")
    yield endpoint
    endpoint.close()


#: The key the second gateway is started with (its command line, not a control).
CLI_API_KEY = "sk_test_from_the_command_line"


@pytest.fixture(scope="session")
def short_memory_gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second fake, started with a one-second key retention and its own Stripe key."""
    group, url = start_gateway(
        tmp_path_factory.mktemp("short-memory-gateway"),
        "--key-retention-seconds",
        "1",
        *stripe_args(api_key=CLI_API_KEY, search_lag_seconds=0),
    )
    yield url
    group.stop()
