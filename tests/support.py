"""Helpers several test files need: a clock the test moves by hand, and a
Sentry transport that keeps what it would have sent."""

from __future__ import annotations

import json
import time

from sentry_sdk.transport import Transport


class Clock:
    """Stands in for ``time.time`` where a part takes a clock
    (``CircuitBreaker(clock=...)``): time passes only when the test says."""

    def __init__(self, start: float | None = None):
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CapturingTransport(Transport):
    """Keeps every envelope Sentry would send."""

    def __init__(self, options=None):
        super().__init__(options)
        self.envelopes = []

    def capture_envelope(self, envelope):
        self.envelopes.append(envelope)

    def text(self) -> str:
        """Everything sent, as text: what must not contain a secret."""
        parts = []
        for envelope in self.envelopes:
            for item in envelope.items:
                parts.append(item.payload.get_bytes().decode(errors="replace"))
        return "\n".join(parts)

    def events(self) -> list[dict]:
        found = []
        for envelope in self.envelopes:
            for item in envelope.items:
                if item.type == "event":
                    found.append(json.loads(item.payload.get_bytes()))
        return found
