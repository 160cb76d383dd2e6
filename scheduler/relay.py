"""The webhook relay: each payer's events, POSTed to each of its endpoints.

Per endpoint, an ordered stream from its creation on, delivered at least
once: the cursor (txid, id) on the endpoint row moves past an event only
after a 2xx. Any other answer, or none within the timeout, backs that
endpoint off (1 s doubling to 10 min, ±20% jitter: ``DEFAULT_BACKOFF_*``;
retried for as long as the endpoint exists) and the same event
heads its stream next time. Every attempt is a ``webhook_deliveries`` row.

Any number of relays run (one thread in each scheduler process): an
endpoint is claimed with a lease (``FOR UPDATE SKIP LOCKED``), no
transaction is held across an HTTP call, and cursor moves are fenced on the
lease. Endpoints are served concurrently by a small thread pool with a short
per-request timeout, and the next endpoint is claimed as soon as a worker is
free, so a slow or dead endpoint delays only itself.

Operators' replays (``webhook_replays``, queued by the console) are claimed
before streams and sent once each, the same way, outside their endpoint's
stream: its cursor does not move (docs/console.md, "Webhook deliveries").

Each request: ``POST <url>`` with the event as JSON (the ``/v1/events``
shape) and the headers

    Content-Type: application/json
    Paycron-Event-Id: <event id>
    Paycron-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, f"{t}.{body}")>

keyed with the endpoint's secret (the whole ``whsec_...`` string) over the
exact body bytes; a retry is signed anew with its own ``t``. Redirects are
not followed (a 3xx is a failure). Receivers should verify the signature in
constant time, refuse a ``t`` older than a few minutes, and de-duplicate on
``Paycron-Event-Id`` (at least once means a rare repeat).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import urllib3
from psycopg_pool import ConnectionPool

from paycron.config import Config
from paycron.deadline import DeadlineExceeded, deadline, pool_manager
from paycron.errors import ConfigError
from paycron.observability.outages import FailureLog
from paycron.store import webhooks
from paycron.store.events import to_wire
from paycron.store.webhooks import Lease, Recorded
from scheduler.service import ERROR_PAUSE_SECONDS, PeriodicService

log = logging.getLogger("paycron.relay")

#: Events sent per claim before the endpoint goes to the back of the queue.
DEFAULT_BATCH = 100
#: A claim's lease, at least; sends start only in its first half (see ``_serve``).
DEFAULT_LEASE_SECONDS = 60.0
#: Idle poll: how soon a new event is noticed when nothing is in flight.
DEFAULT_POLL_SECONDS = 0.5
#: After a failed delivery: this, doubling per attempt, capped
#: (WEBHOOK_BACKOFF_MAX_SECONDS), ± jitter.
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_JITTER = 0.2
#: Response bytes read (for keep-alive); a longer body drops the connection.
_MAX_RESPONSE_BYTES = 4096
_USER_AGENT = "paycron-webhooks/1"


@dataclass(frozen=True)
class RelayConfig:
    """The relay's section of the configuration: what the environment sets
    (WEBHOOK_*, through :meth:`from_config`) and the relay's own constants."""

    concurrency: int  # WEBHOOK_CONCURRENCY: endpoints served at once; also the claim batch
    timeout_seconds: float  # WEBHOOK_TIMEOUT_SECONDS: one delivery's limit, wall clock
    backoff_max_seconds: float  # WEBHOOK_BACKOFF_MAX_SECONDS
    allow_private_hosts: bool  # WEBHOOK_ALLOW_PRIVATE_HOSTS: loopback/private receivers too
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    batch: int = DEFAULT_BATCH
    poll_seconds: float = DEFAULT_POLL_SECONDS
    backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_jitter: float = DEFAULT_BACKOFF_JITTER

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.batch < 1:
            raise ConfigError("relay concurrency and batch must be >= 1")
        if self.timeout_seconds * 4 > self.lease_seconds:
            raise ConfigError(
                "relay timeout must be <= lease / 4: a send starts only in the "
                "first half of the lease and must end inside it"
            )
        if not 0 <= self.backoff_jitter < 1:
            raise ConfigError("relay backoff jitter must be in [0, 1)")
        if self.timeout_seconds <= 0:  # urllib3 reads 0 as "non-blocking": every send fails
            raise ConfigError("WEBHOOK_TIMEOUT_SECONDS must be > 0")
        if not 0 < self.backoff_base_seconds <= self.backoff_max_seconds:
            # a zero backoff would retry a failing endpoint in a tight loop
            raise ConfigError("WEBHOOK_BACKOFF_MAX_SECONDS must be >= the base backoff (1 s)")

    @classmethod
    def from_config(cls, config: Config, **overrides) -> RelayConfig:
        """The relay's settings from the environment's; a long timeout stretches
        the lease (4 x timeout) rather than failing the lease/4 rule."""
        timeout = overrides.pop("timeout_seconds", config.webhook_timeout_seconds)
        settings = {
            "concurrency": config.webhook_concurrency,
            "timeout_seconds": timeout,
            "backoff_max_seconds": config.webhook_backoff_max_seconds,
            "allow_private_hosts": config.webhook_allow_private_hosts,
            "lease_seconds": max(DEFAULT_LEASE_SECONDS, 4 * timeout),
        }
        return cls(**{**settings, **overrides})

    @property
    def pool_size(self) -> int:
        """Database connections the relay can use at once: the claim plus one per worker."""
        return self.concurrency + 1


@dataclass
class RelayCounts:
    endpoints: int = 0
    delivered: int = 0
    failed: int = 0
    replayed: int = 0  # operators' replays sent (whatever the answer)

    def add(self, other: RelayCounts) -> None:
        self.endpoints += other.endpoints
        self.delivered += other.delivered
        self.failed += other.failed
        self.replayed += other.replayed


class WebhookRelay(PeriodicService):
    name = "webhook-relay"

    def __init__(
        self,
        *,
        pool: ConnectionPool,
        config: RelayConfig,
        rng: random.Random | None = None,
        resolve: webhooks.Resolver = webhooks.resolve_host,
    ):
        self.pool = pool
        self._resolve = resolve  # tests answer for names they invent
        self.config = config
        self.interval_seconds = config.poll_seconds
        self._rng = rng or random.Random()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix="webhook"
        )
        timeout = self.config.timeout_seconds
        # Each delivery has a wall-clock deadline (paycron/deadline.py): a
        # receiver that trickles its answer holds a relay thread no longer.
        self._http = pool_manager(
            num_pools=64,
            maxsize=self.config.concurrency,
            block=False,
            retries=False,
            timeout=urllib3.Timeout(connect=min(timeout, 3.0), read=timeout),
        )

    def run_once(self) -> RelayCounts:
        """Send the replays operators asked for, then claim endpoints with
        events to send and serve them, concurrently, each until a claim
        comes back short."""
        counts = RelayCounts()
        while True:
            replays = self._claim_replays(self.config.concurrency)
            for sent in self._executor.map(self._replay, replays):
                counts.add(sent)
            if len(replays) < self.config.concurrency:
                break
        while True:
            leases = self._claim(self.config.concurrency)
            for served in self._executor.map(self._serve, leases):
                counts.add(served)
            if len(leases) < self.config.concurrency:
                return counts

    def run(self, stop: threading.Event | None = None) -> None:
        """Deliver until ``stop`` (or :meth:`stop`). A worker is given a new
        endpoint as soon as it is free, never held back by a slow one
        elsewhere: the one service whose loop is not "run once, then sleep"."""
        if stop is not None:
            self._stopping = stop
        running: set[Future] = set()
        claim_failures = FailureLog("webhook relay claim")
        delivery_failures = FailureLog("webhook delivery")
        while not self._stopping.is_set():
            finished = {f for f in running if f.done()}
            running -= finished
            for future in finished:
                if future.exception() is not None:
                    delivery_failures.failed(future.exception())
            free = self.config.concurrency - len(running)
            try:
                # Operators' replays first: they are few, and someone waits on them.
                replays = self._claim_replays(free) if free else []
                free -= len(replays)
                leases = self._claim(free) if free else []
            except Exception as exc:  # a database outage: log, back off, go on
                claim_failures.failed(exc)
                self._stopping.wait(ERROR_PAUSE_SECONDS)
                continue
            claim_failures.succeeded()
            running |= {self._executor.submit(self._replay, replay) for replay in replays}
            running |= {self._executor.submit(self._serve, lease) for lease in leases}
            if running:
                wait(running, timeout=self.config.poll_seconds, return_when=FIRST_COMPLETED)
            else:
                self._stopping.wait(self.config.poll_seconds)
        wait(running)

    def start(self, stop: threading.Event | None = None) -> threading.Thread:
        """:meth:`run` in a daemon thread of its own (the scheduler's way)."""
        self._thread = threading.Thread(target=self.run, args=(stop,), name=self.name, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        """Stop, let deliveries in flight finish (each within its timeout), free threads."""
        self.stop()
        if self._thread is not None:
            self._thread.join()
        self._executor.shutdown(wait=True)
        self._http.clear()

    def _claim(self, limit: int) -> list[Lease]:
        with self.pool.connection() as conn:
            return webhooks.claim_endpoints(
                conn, limit=limit, lease_seconds=self.config.lease_seconds
            )

    def _claim_replays(self, limit: int) -> list[webhooks.Replay]:
        with self.pool.connection() as conn:
            return webhooks.claim_replays(
                conn, limit=limit, lease_seconds=self.config.lease_seconds
            )

    def _replay(self, replay: webhooks.Replay) -> RelayCounts:
        """Send one replay as any delivery is sent (the destination checked,
        signed anew, within the timeout) and record its answer; the stream's
        cursor and its deliveries are not touched."""
        if not replay.live or replay.event is None:
            status, error, latency = (
                None,
                "endpoint_deleted" if not replay.live else "event_gone",
                None,
            )
        else:
            status, error, latency = self._timed_post(replay.lease, replay.event)
        with self.pool.connection() as conn:
            webhooks.record_replay(conn, replay.id, status=status, error=error, latency_ms=latency)
        return RelayCounts(replayed=1)

    def _timed_post(self, lease: Lease, event: dict) -> tuple[int | None, str | None, int]:
        """:meth:`_post` and its wall time in milliseconds (the destination's
        check, the request and the answer)."""
        started = time.monotonic()
        status, error = self._post(lease, event)
        return status, error, round((time.monotonic() - started) * 1000)

    def _serve(self, lease: Lease) -> RelayCounts:
        """Send one endpoint's next events in order, stopping at the first
        failure. A send starts only while a whole timeout still fits in the
        first half of the lease, so it always ends while the lease holds."""
        counts = RelayCounts(endpoints=1)
        send_until = time.monotonic() + self.config.lease_seconds / 2
        with self.pool.connection() as conn:
            events = webhooks.pending_events(conn, lease, limit=self.config.batch)
        for event in events:
            if (
                self._stopping.is_set()
                or time.monotonic() + self.config.timeout_seconds > send_until
            ):
                break
            status, error, latency = self._timed_post(lease, event)
            if status is None or not 200 <= status < 300:
                self._back_off(lease, event, status, error, latency)
                counts.failed += 1
                return counts  # released by the back-off
            counts.delivered += 1
            with self.pool.connection() as conn:
                recorded = webhooks.record_delivered(conn, lease, event, status, latency_ms=latency)
            if recorded is Recorded.LEASE_LOST:
                log.warning("webhook lease lost: endpoint %s", lease.endpoint_id)
                return counts
            if recorded is Recorded.DELETED:
                break
        with self.pool.connection() as conn:
            webhooks.release(conn, lease)
        return counts

    def _back_off(
        self,
        lease: Lease,
        event: dict,
        status: int | None,
        error: str,
        latency_ms: int | None = None,
    ) -> None:
        config = self.config
        delay = webhooks.backoff(
            event["attempts"] + 1,
            base=config.backoff_base_seconds,
            cap=config.backoff_max_seconds,
            jitter=config.backoff_jitter,
            rng=self._rng,
        )
        with self.pool.connection() as conn:
            webhooks.record_failed(
                conn,
                lease,
                event,
                status=status,
                error=error,
                delay=delay,
                latency_ms=latency_ms,
            )
        log.info(
            "webhook to endpoint %s failed (%s), retry in %.1fs", lease.endpoint_id, error, delay
        )

    def _post(self, lease: Lease, event: dict) -> tuple[int | None, str | None]:
        """(HTTP status or None, error or None) for one signed POST, sent to
        the address the destination check resolved (see :meth:`_request`)."""
        destination = webhooks.check_destination(
            lease.url, resolve=self._resolve, allow_private=self.config.allow_private_hosts
        )
        if isinstance(destination, webhooks.Refused):
            return None, destination.code
        body = json.dumps(to_wire(event), separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": _USER_AGENT,
            webhooks.EVENT_ID_HEADER: str(event["id"]),
            webhooks.SIGNATURE_HEADER: webhooks.signature(lease.secret, int(time.time()), body),
        }
        try:
            with deadline(self.config.timeout_seconds):
                response = self._request(destination, body, headers)
                try:
                    if len(response.read(_MAX_RESPONSE_BYTES)) < _MAX_RESPONSE_BYTES:
                        response.release_conn()  # read to the end: keep the connection alive
                    else:
                        response.close()
                except (urllib3.exceptions.HTTPError, OSError):
                    response.close()  # the status line arrived; the body is not ours to judge
        except DeadlineExceeded:
            return None, "deadline_exceeded"
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return None, type(exc).__name__
        status = response.status
        return status, None if 200 <= status < 300 else f"http_{status}"

    def _request(
        self, destination: webhooks.Destination, body: bytes, headers: dict
    ) -> urllib3.BaseHTTPResponse:
        """POST to the checked address, never to the name: urllib3 would
        resolve the name again, and a rebinding DNS server answers 127.0.0.1
        the second time. The URL's host still names the request (Host
        header) and, for https, the TLS server name and the certificate."""
        tls = (
            {
                "server_hostname": destination.host.strip("[]"),
                "assert_hostname": destination.host.strip("[]"),
            }
            if destination.scheme == "https"
            else None
        )
        pool = self._http.connection_from_host(
            destination.address, port=destination.port, scheme=destination.scheme, pool_kwargs=tls
        )
        return pool.urlopen(
            "POST",
            destination.target,
            body=body,
            headers={**headers, "Host": destination.host_header},
            redirect=False,
            assert_same_host=False,
            preload_content=False,
        )
