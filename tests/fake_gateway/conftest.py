"""One fake gateway for the black-box tests of this directory, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fake_gateway.fakeclient import start_gateway


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
