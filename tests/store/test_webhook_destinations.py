"""Webhook destinations an endpoint may not name: IPv4 carried in IPv6 by
stateless translation (SIIT), and site-local IPv6 (fast: no relay, no
database; the relay's own checks are tests/processes/test_webhook_egress.py)."""

from __future__ import annotations

import ipaddress

import pytest

from paycron.store import webhooks


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:0:7f00:1",  # SIIT (IPv4-translated, RFC 2765) of 127.0.0.1
        "::ffff:0:a9fe:a9fe",  # SIIT of 169.254.169.254
        "::ffff:0:a00:1",  # SIIT of 10.0.0.1
        "::ffff:7f00:1",  # IPv4-mapped 127.0.0.1, written in hex
        "fec0::1",  # site-local
        "fec0:1:2::3",
        "feff:ffff::1",  # the top of fec0::/10
    ],
)
def test_translated_and_site_local_addresses_are_refused(address):
    assert not webhooks.is_public(ipaddress.ip_address(address))
    assert webhooks.forbidden_destination(f"http://[{address}]/hook") is not None
    assert (
        webhooks.forbidden_destination("http://hooks.test/hook", resolve=lambda host: [address])
        is not None
    )


@pytest.mark.parametrize("address", ["::ffff:0:5db8:d70e", "2606:4700::1111"])
def test_public_ones_still_pass(address):
    # SIIT of a public IPv4 address reaches that address: allowed like NAT64's
    assert webhooks.is_public(ipaddress.ip_address(address))
