"""The gateway-event service: applies the processor's stored events and polls
payments whose event never came (docs/design.md), one River-shaped service.

Each run: apply pending events in batches (retrieve the processor-side
payment, then :func:`paycron.store.processor_events.settle`); an event whose
payment has not recorded its call yet stays pending and is tried again with
backoff. Then poll waiting payments whose next poll is due (5 min, 30 min,
2 h, then every 12 h without an event): each is claimed by moving its next
poll out, committed, and only then asked about, so no connection waits on
the processor. Every retrieve takes a token from the shared call window
(the adapter's), so neither path pushes charges past the processor's limit.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from paycron.config import Config
from paycron.domain import policy
from paycron.errors import ProcessorPaymentMissing
from paycron.observability import metrics
from paycron.processors.base import Processor
from paycron.store import processor_events as gateway_events
from paycron.store.db import Pool
from paycron.store.processor_events import SETTLING_TYPES, Result
from scheduler.service import PeriodicService

log = logging.getLogger("paycron.gateway_events")

#: Events or polls per batch; a run goes on while batches come back full.
BATCH = 100
#: An event that cannot apply yet is tried again after this, doubling, up to the cap...
EVENT_RETRY_SECONDS, EVENT_RETRY_MAX_SECONDS = 5.0, 3600.0
#: ...and is given up after this many tries (the poller settles its payment anyway).
EVENT_MAX_ATTEMPTS = 40
#: Retrieves of a batch in flight at once (each takes a token of the window).
CONCURRENCY = 32
#: An event being applied is someone's for this long (a crash only delays it).
EVENT_CLAIM_SECONDS = 60.0
#: Who the audit rows and events name.
EVENT_ACTOR, POLL_ACTOR = "gateway-event", "gateway-poll"


@dataclass
class EventCounts:
    applied: int = 0
    waiting: int = 0  # events that could not apply yet
    polled: int = 0
    settled: int = 0
    paged: int = 0
    failed: int = 0  # retrieves that failed (tried again later)

    def add(self, other: EventCounts) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


class GatewayEventService(PeriodicService):
    name = "gateway-events"
    interval_seconds = 1.0

    def __init__(
        self,
        *,
        config: Config,
        pool: Pool,
        gateway: Processor,
        batch: int = BATCH,
        concurrency: int = CONCURRENCY,
    ):
        self.config = config
        self.pool = pool
        self.gateway = gateway
        self.batch = batch
        # Retrieves of a batch run side by side (a processor answers in
        # 300 ms: one at a time, 10,000 events would take an hour); the
        # shared call window still paces them.
        self.calls = ThreadPoolExecutor(concurrency, thread_name_prefix="gateway-events")

    def run_once(self) -> EventCounts:
        counts = EventCounts()
        while self._apply_events(counts) == self.batch:
            pass
        while self._poll(counts) == self.batch:
            pass
        if counts.applied or counts.polled:
            log.info("gateway events: %s", counts)
        return counts

    def close(self) -> None:
        self.calls.shutdown()
        self.gateway.close()

    # ---- events

    def _apply_events(self, counts: EventCounts) -> int:
        with self.pool.connection() as conn:
            events = gateway_events.claim_pending(
                conn,
                limit=self.batch,
                claim_seconds=EVENT_CLAIM_SECONDS,
                processor=self.gateway.name,
            )
        for outcome in self.calls.map(self._apply, events):
            counts.add(outcome)
        return len(events)

    def _apply(self, event: dict) -> EventCounts:
        """One event: retrieved (no connection held meanwhile), then applied."""
        counts = EventCounts()
        if event["type"] not in SETTLING_TYPES or not event["intent_id"]:
            return self._done(event, Result.IGNORED, counts)
        if event["payment_id"] is None:
            return self._done(event, Result.UNKNOWN_PAYMENT, counts)
        try:
            charge = self.gateway.retrieve(event["intent_id"])
        except ProcessorPaymentMissing as exc:
            # Signed by the processor, about a payment it does not hold for
            # this account (another account's, or our configuration's): a
            # human must look; asking again will not find it.
            _page_missing(event["payment_id"], event["intent_id"], exc)
            return self._done(event, Result.PAGED, counts)
        except Exception as exc:  # the processor is down: the event waits
            log.warning("gateway event %s: retrieve failed (%s)", event["id"], type(exc).__name__)
            counts.failed += 1
            return self._later(event, Result.NOT_YET, counts)
        if charge.reference != str(event["payment_id"]):
            # Signed, but not what the processor holds: nothing changes.
            log.warning(
                "gateway event %s names payment %s, the processor's %s says %r",
                event["id"],
                event["payment_id"],
                charge.id,
                charge.reference,
            )
            result = Result.DISAGREES
        else:
            with self.pool.connection() as conn:
                result = gateway_events.settle(conn, event["payment_id"], charge, actor=EVENT_ACTOR)
        if result is Result.NOT_YET and event["attempts"] + 1 < EVENT_MAX_ATTEMPTS:
            counts.waiting += 1
            return self._later(event, result, counts)
        return self._done(event, result, counts)

    def _done(self, event: dict, result: Result, counts: EventCounts) -> EventCounts:
        with self.pool.connection() as conn:
            gateway_events.mark_applied(
                conn, processor=event["processor"], event_id=event["id"], result=result
            )
        counts.applied += 1
        counts.settled += result in (Result.COMPLETED, Result.FAILED)
        counts.paged += result is Result.PAGED
        return counts

    def _later(self, event: dict, result: Result, counts: EventCounts) -> EventCounts:
        delay = min(EVENT_RETRY_SECONDS * 2 ** min(event["attempts"], 16), EVENT_RETRY_MAX_SECONDS)
        with self.pool.connection() as conn:
            gateway_events.apply_later(
                conn, processor=event["processor"], event_id=event["id"], result=result, delay=delay
            )
        return counts

    # ---- polls

    def _poll(self, counts: EventCounts) -> int:
        now = datetime.now(UTC)
        with self.pool.connection() as conn:
            due = gateway_events.claim_due_polls(
                conn,
                now=now,
                limit=self.batch,
                intervals=policy.poll_intervals(self.config),
                processor=self.gateway.name,
            )
        for outcome in self.calls.map(lambda row: self._poll_one(row, now), due):
            counts.add(outcome)
        return len(due)

    def _poll_one(self, row: dict, now: datetime) -> EventCounts:
        counts = EventCounts(polled=1)
        try:
            charge = self.gateway.retrieve(row["gateway_intent_id"])
        except ProcessorPaymentMissing as exc:
            # What the payment waits for is not there to ask about: never
            # polled silently forever. Paged now and at every later poll.
            _page_missing(row["id"], row["gateway_intent_id"], exc)
            counts.failed += 1
            counts.paged += 1
            return counts
        except Exception as exc:  # asked again at its next poll
            log.warning("poll of payment %s failed (%s)", row["id"], type(exc).__name__)
            counts.failed += 1
            return counts
        with self.pool.connection() as conn:
            result = gateway_events.settle(conn, row["id"], charge, actor=POLL_ACTOR)
        counts.settled += result in (Result.COMPLETED, Result.FAILED)
        counts.paged += result is Result.PAGED
        waited = (now - row["awaiting_since"]).total_seconds()
        if result is Result.STILL_PROCESSING and waited > policy.AWAITING_PAGE_AFTER:
            log.error(
                "payment %s has waited %.0f days for processor payment %s: page",
                row["id"],
                waited / 86400,
                charge.id,
            )
            counts.paged += 1
        return counts


def _page_missing(payment_id, intent_id: str, exc: Exception) -> None:
    """Page (ERROR, so Sentry; and the metric) a waiting payment whose
    processor-side payment cannot be retrieved."""
    metrics.PROCESSOR_PAYMENT_MISSING.inc()
    log.error(
        "payment %s waits for processor payment %s, which the processor does not hold "
        "for this account (%s): check the processor account and settle it by hand: page",
        payment_id,
        intent_id,
        exc,
    )
