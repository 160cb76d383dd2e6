"""Wake-ups for the sweep: a create announces a payment falling due within
the sweep interval on a Postgres channel (LISTEN/NOTIFY); one connection per
scheduler process listens and wakes the sweeper at once. A notification that
is lost (the listener reconnecting, a failover) only delays the claim to the
next known run_at or the next interval: the sweep's schedule stays the
safety net.
"""

from __future__ import annotations

import logging
import threading

from paycron.config import Config
from paycron.sql import q
from paycron.store.db import connect

log = logging.getLogger("paycron.wake")

#: How often the listener looks at ``stop`` while no notification comes.
POLL_STOP_SECONDS = 0.5
#: After a lost connection, the listener connects again after this.
RECONNECT_SECONDS = 1.0


class DueWake:
    """An event the sweeper sleeps on: set by a notification on the due
    channel, and by ``stop`` (so a sleeping sweeper ends promptly)."""

    def __init__(self, config: Config):
        self.config = config
        self.event = threading.Event()
        self.listening = threading.Event()  # for tests: LISTEN is in place

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less if woken; True if woken."""
        woke = self.event.wait(max(0.0, seconds))
        self.event.clear()
        return woke

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="due-wake", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with connect(self.config) as conn:
                    conn.execute(q("listen_due"))
                    self.listening.set()
                    self.event.set()  # whatever was announced while not listening
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=POLL_STOP_SECONDS):
                            self.event.set()
            except Exception as exc:  # the database is away: the interval still sweeps
                self.listening.clear()
                log.warning("due listener: %s; connecting again", type(exc).__name__)
                stop.wait(RECONNECT_SECONDS)
        self.event.set()
