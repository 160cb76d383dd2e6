"""A webhook delivery ends by its deadline: a receiver that trickles its
answer (a byte every quarter second, a socket read timeout never trips)
fails the delivery at WEBHOOK_TIMEOUT_SECONDS and backs the endpoint off,
instead of holding a relay thread for as long as it likes."""

from __future__ import annotations

import random
import time

from paycron.config import Config
from paycron.store import webhooks
from paycron.store.db import make_pool
from scheduler.relay import RelayConfig, WebhookRelay
from tests.factories import insert_event
from tests.support import TricklingServer, wait_until_sendable

#: The trickled answer takes over 25 s; the delivery is given 1 s.
TIMEOUT_SECONDS = 1.0
#: Far above the deadline plus scheduling delays, far below the trickle.
WELL_BEFORE_THE_ANSWER = 8.0


def test_a_trickling_receiver_fails_its_delivery_by_the_deadline(config, conn):
    receiver = TricklingServer(b"ok")
    settings = RelayConfig.from_config(
        Config(webhook_allow_private_hosts=True),
        timeout_seconds=TIMEOUT_SECONDS,
        lease_seconds=10.0,
        poll_seconds=0.02,
    )
    pool = make_pool(config, max_size=settings.pool_size, name="relay-deadline-test")
    relay = WebhookRelay(pool=pool, config=settings, rng=random.Random(7))
    try:
        endpoint = webhooks.create_endpoint(conn, actor="alice", url=receiver.url + "/hooks")
        wait_until_sendable(conn, insert_event(conn, payer="alice"))
        started = time.monotonic()
        counts = relay.run_once()
        seconds = time.monotonic() - started
    finally:
        receiver.close()
        relay.close()
        pool.close()
    assert (counts.delivered, counts.failed) == (0, 1)
    assert seconds < WELL_BEFORE_THE_ANSWER
    row = conn.execute(
        "SELECT attempts, last_status, last_error, delivered_at FROM webhook_deliveries"
        " WHERE endpoint_id = %s",
        (endpoint["id"],),
    ).fetchone()
    assert (row["attempts"], row["last_status"], row["delivered_at"]) == (1, None, None)
    assert row["last_error"] == "deadline_exceeded"
