"""Webhook egress (docs/design.md): the relay connects to the address it checked,
IPv4 hidden in IPv6 is checked too, and refusals do not echo addresses."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from paycron.config import Config
from paycron.store import webhooks
from paycron.store.db import make_pool
from scheduler.relay import RelayConfig, WebhookRelay
from tests.factories import insert_event
from tests.support import WebhookReceiver, wait_until_sendable
from web import close_app

#: A public address (it was example.com's): what the rebinding name answers first.
PUBLIC = "93.184.215.14"
#: Stands in for a public address where a test really connects: it is on
#: loopback, so no test sends anything off this machine.
STAND_IN = "127.0.0.2"
#: Like the relay tests' settings, with the check on.
CHECKED = RelayConfig.from_config(
    Config(),
    timeout_seconds=1.0,
    lease_seconds=10.0,
    backoff_base_seconds=0.05,
    backoff_max_seconds=0.4,
)


def requests(receiver: WebhookReceiver) -> list[tuple[str, str]]:
    """Each request's Host header and target, in arrival order."""
    return [(d.headers["Host"], d.path) for d in receiver.deliveries]


@pytest.fixture
def receiver():
    with contextlib.closing(WebhookReceiver()) as made:
        yield made


@pytest.fixture
def relay_for(config):
    """relay_for(settings, **kwargs) -> a WebhookRelay with its own pool, closed after."""
    made = []

    def make(settings: RelayConfig, **kwargs) -> WebhookRelay:
        pool = make_pool(config, max_size=settings.pool_size, name="egress-test")
        made.append(WebhookRelay(pool=pool, config=settings, rng=random.Random(1), **kwargs))
        return made[-1]

    yield make
    for relay in made:
        relay.close()
        relay.pool.close()


@pytest.fixture
def tls_receiver(tmp_path, monkeypatch):
    """A receiver with a self-signed certificate for hooks.test, which the
    relay trusts (SSL_CERT_FILE is read by the default context)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=hooks.test",
            "-addext",
            "subjectAltName=DNS:hooks.test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    made = WebhookReceiver(tls=context)
    yield made
    made.close()


def _delivery(conn, endpoint_id) -> dict | None:
    return conn.execute(
        "SELECT attempts, last_status, last_error FROM webhook_deliveries WHERE endpoint_id = %s",
        (endpoint_id,),
    ).fetchone()


#: Once its event is sendable, the relay tries an endpoint in its first run:
#: this bounds the runs, for a relay that never tries it.
TRIES_WITHIN_SECONDS = 15.0


def deliver(relay: WebhookRelay, conn, endpoint_id, event_id: int) -> dict:
    """Once the event is sendable (another database's long transaction may
    hold it back), run the relay until it has tried the endpoint; its
    delivery row."""
    wait_until_sendable(conn, event_id)
    deadline = time.monotonic() + TRIES_WITHIN_SECONDS
    while True:
        relay.run_once()
        row = _delivery(conn, endpoint_id)
        if row is not None or time.monotonic() > deadline:
            return row
        time.sleep(0.05)


class Rebinding:
    """A DNS server that rebinds ``name``: the first answer is "public"
    (STAND_IN), every later one 127.0.0.1. Other names resolve as usual."""

    def __init__(self, name: str):
        self.name = name
        self.answers = 0
        self._real = socket.getaddrinfo

    def getaddrinfo(self, host, port, *args, **kwargs):
        if host != self.name:
            return self._real(host, port, *args, **kwargs)
        self.answers += 1
        address = STAND_IN if self.answers == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0))]


def test_a_rebinding_name_does_not_reach_loopback(conn, relay_for, receiver, monkeypatch):
    """The system resolver itself rebinds, so the check and any second
    lookup (urllib3's, before the fix) both go through it. The "public"
    first answer is STAND_IN, which the check is told to treat as public,
    with a receiver of its own on the same port."""
    dns = Rebinding("rebind.test")
    monkeypatch.setattr(socket, "getaddrinfo", dns.getaddrinfo)
    real_is_public = webhooks.is_public
    monkeypatch.setattr(
        webhooks, "is_public", lambda address: str(address) == STAND_IN or real_is_public(address)
    )
    public = WebhookReceiver(host=STAND_IN, port=receiver.port)
    try:
        endpoint = webhooks.create_endpoint(
            conn, actor="alice", url=f"http://rebind.test:{receiver.port}/hooks"
        )
        event = insert_event(conn, payer="alice")

        deliver(relay_for(CHECKED), conn, endpoint["id"], event)
    finally:
        public.close()

    assert receiver.deliveries == []  # loopback never reached
    assert requests(public) == [(f"rebind.test:{receiver.port}", "/hooks")]
    assert dns.answers == 1  # one lookup, checked and used
    assert _delivery(conn, endpoint["id"])["last_status"] == 200


def test_the_relay_sends_to_the_address_it_resolved_with_the_urls_host(conn, relay_for, receiver):
    asked = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    # hooks.test resolves nowhere (RFC 6761): only the relay's own answer reaches the receiver.
    endpoint = webhooks.create_endpoint(
        conn, actor="alice", url=f"http://hooks.test:{receiver.port}/in/paycron?v=1"
    )
    event = insert_event(conn, payer="alice")

    deliver(
        relay_for(dataclasses.replace(CHECKED, allow_private_hosts=True), resolve=resolve),
        conn,
        endpoint["id"],
        event,
    )

    assert requests(receiver) == [(f"hooks.test:{receiver.port}", "/in/paycron?v=1")]
    assert asked == ["hooks.test"]
    assert _delivery(conn, endpoint["id"])["last_status"] == 200


@pytest.mark.parametrize("name, delivered", [("hooks.test", True), ("other.test", False)])
def test_https_is_verified_against_the_urls_host_not_the_address(
    conn, relay_for, tls_receiver, name, delivered
):
    """Connected to 127.0.0.1, the relay still sends the URL's host as SNI
    and requires a certificate for it: other.test's URL gets hooks.test's
    certificate and is refused."""
    endpoint = webhooks.create_endpoint(
        conn, actor="alice", url=f"https://{name}:{tls_receiver.port}/hooks"
    )
    event = insert_event(conn, payer="alice")

    deliver(
        relay_for(
            dataclasses.replace(CHECKED, allow_private_hosts=True),
            resolve=lambda host: ["127.0.0.1"],
        ),
        conn,
        endpoint["id"],
        event,
    )

    assert tls_receiver.server_names == [name]
    row = _delivery(conn, endpoint["id"])
    if delivered:
        assert requests(tls_receiver) == [(f"hooks.test:{tls_receiver.port}", "/hooks")]
        assert row["last_status"] == 200
    else:
        assert tls_receiver.deliveries == []
        assert row["last_status"] is None and row["last_error"] == "SSLError"


def test_the_relay_refuses_a_name_that_resolves_to_loopback(conn, relay_for, receiver):
    endpoint = webhooks.create_endpoint(
        conn, actor="alice", url=f"http://hooks.test:{receiver.port}/"
    )
    event = insert_event(conn, payer="alice")

    deliver(
        relay_for(CHECKED, resolve=lambda host: [PUBLIC, "127.0.0.1"]),
        conn,
        endpoint["id"],
        event,
    )

    assert receiver.deliveries == []
    assert _delivery(conn, endpoint["id"])["last_error"] == "forbidden_destination"


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 (RFC 6052) of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the metadata service
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b:1::7f00:1",  # local-use NAT64 (RFC 8215)
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
    ],
)
def test_ipv4_embedded_in_ipv6_is_checked(address):
    assert webhooks.forbidden_destination(f"http://[{address}]/hook") is not None
    assert (
        webhooks.forbidden_destination("http://hooks.test/hook", resolve=lambda host: [address])
        is not None
    )


@pytest.mark.parametrize(
    "address",
    [
        PUBLIC,
        "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
        "64:ff9b::5db8:d70e",  # NAT64 of the public address: the translator reaches it
        "2002:5db8:d70e::1",  # 6to4 of it
    ],
)
def test_public_addresses_pass(address):
    assert (
        webhooks.forbidden_destination("http://hooks.test/hook", resolve=lambda host: [address])
        is None
    )


@pytest.mark.parametrize("answer", [["10.0.0.7"], ["fd00::7"], [PUBLIC, "64:ff9b::a00:7"]])
def test_the_registration_error_names_the_rule_not_the_address(
    config, alice, conn, answer, monkeypatch
):
    from web import create_app

    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):
        if host != "internal.example":
            return real(host, port, *args, **kwargs)
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (a, 0),
            )
            for a in answer
        ]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    app = create_app(config.with_overrides(webhook_allow_private_hosts=False))
    try:
        response = app.test_client().post(
            "/v1/webhook-endpoints", json={"url": "http://internal.example/hook"}, headers=alice
        )
    finally:
        close_app(app)
    assert response.status_code == 400
    [message] = response.get_json()["errors"]["url"]
    assert "non-public" in message
    for address in answer:
        assert address not in response.get_data(as_text=True)
    assert conn.execute("SELECT count(*) AS n FROM webhook_endpoints").fetchone()["n"] == 0
