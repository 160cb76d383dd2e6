"""How the scheduler process is wired (scheduler/__main__.py's ``build``),
checked by what the parts do, not by reading their attributes."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time

from scheduler import gateway_events
from scheduler.__main__ import build
from scheduler.gateway_events import GatewayEventService
from tests.support import QuietHandler, serve_on_loopback

#: Each retrieve takes this long at the processor, so a burst's calls overlap.
ANSWER_SECONDS = 0.3


class SlowProcessor:
    """The card processor's retrieve on loopback, answering after a pause,
    counting the connections it was asked on."""

    def __init__(self):
        self.connections: set[int] = set()
        self._lock = threading.Lock()
        processor = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a connection can be reused

            def do_GET(self):
                with processor._lock:
                    processor.connections.add(id(self.connection))
                time.sleep(ANSWER_SECONDS)
                charge = {"id": "ch_1", "reference": "p", "amount": 1, "currency": "USD"}
                self.answer(200, json.dumps({**charge, "status": "succeeded"}).encode())

        self.server = serve_on_loopback(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_event_service_keeps_a_connection_per_retrieve_in_flight(config, caplog):
    """The processor-events service retrieves CONCURRENCY intents at once: its
    HTTP pool keeps as many connections, so a second burst reuses them all
    (no "Connection pool is full, discarding connection", no new handshake)."""
    processor = SlowProcessor()
    scheduler = build(dataclasses.replace(config, gateway_url=processor.url))
    try:
        [service] = [s for s in scheduler.services if isinstance(s, GatewayEventService)]
        threads = gateway_events.CONCURRENCY
        with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
            for _ in range(2):
                charges = list(service.calls.map(service.gateway.retrieve, ["ch_1"] * threads))
                assert [c.id for c in charges] == ["ch_1"] * threads
    finally:
        scheduler.close()
        processor.close()
    assert "Connection pool is full" not in caplog.text
    assert len(processor.connections) <= threads  # the second burst made no new one
