"""A burst of Stripe's signed events: the web answers each in
milliseconds, and the scheduler's gateway-event service drains them paced by
the shared per-second call window.

    python -m bench.gateway_events_burst [--events 10000] [--rate 500]

Makes N bank debits at the fake gateway's Stripe surface (through the SDK)
and N payments waiting on them (AWAITING_GATEWAY), settles the debits, then
posts a signed ``payment_intent.succeeded`` for each debit to
``POST /v1/gateway-events/stripe`` (Flask test client, in process) and
prints the answer times; then runs the service until every event is
applied and prints the drain time and rate against the window's ceiling
(``--rate``, as ``GATEWAY_RATE_LIMIT``: each event costs one retrieve).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import mkdtemp

import redis

from bench.harness import REDIS_URL, parse_args, private_database
from devtools.fake_gateway import STRIPE_API_KEY, STRIPE_WEBHOOK_SECRET, GatewayHandle
from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http
from paycron.config import STRIPE_API_VERSION, Config
from paycron.domain.ids import new_payment_id
from paycron.limits.pacing import CallLimiter
from paycron.processors.factory import build_processor
from paycron.store.db import connect, make_pool
from scheduler.gateway_events import GatewayEventService


def debits(handle: GatewayHandle, n: int) -> list[tuple[uuid.UUID, datetime, str]]:
    """``n`` processing bank debits at the stub, each for a payment id of ours."""
    client = handle.stripe_client()
    due = datetime.now(UTC) - timedelta(minutes=5)

    def one(_):
        payment_id = new_payment_id(due)
        intent = client.v1.payment_intents.create(
            params={
                "amount": 2500,
                "currency": "usd",
                "customer": "cus_burst",
                "payment_method": "pm_bank_processing_succeeds",
                "confirm": True,
                "off_session": True,
                "metadata": {"paycron_payment_id": str(payment_id)},
            }
        )
        return payment_id, due, intent.id

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def waiting_payments(conn, made) -> None:
    with (
        conn.transaction(),
        conn.cursor().copy(
            "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at, status, "
            "gateway_intent_id, awaiting_since, next_poll_at, processor, customer, "
            "payment_method) FROM STDIN"
        ) as copy,
    ):
        later = datetime.now(UTC) + timedelta(days=1)  # no poll during the bench
        for payment_id, due, intent in made:
            copy.write_row(
                (
                    payment_id,
                    due,
                    "burst",
                    "shop",
                    2500,
                    "USD",
                    due,
                    "AWAITING_GATEWAY",
                    intent,
                    due,
                    later,
                    "stripe",
                    "cus_burst",
                    "pm_bank_processing_succeeds",
                )
            )


def event_body(payment_id: uuid.UUID, intent: str) -> bytes:
    """The debit's ``payment_intent.succeeded`` as Stripe sends it (the stub
    keeps only its latest events, so the burst builds its own)."""
    return json.dumps(
        {
            "id": f"evt_{uuid.uuid4().hex[:24]}",
            "object": "event",
            "type": "payment_intent.succeeded",
            "created": int(time.time()),
            "livemode": False,
            "api_version": STRIPE_API_VERSION,
            "data": {
                "object": {
                    "id": intent,
                    "object": "payment_intent",
                    "status": "succeeded",
                    "amount": 2500,
                    "currency": "usd",
                    "metadata": {"paycron_payment_id": str(payment_id)},
                }
            },
        }
    ).encode()


def signed(payload: bytes) -> dict:
    at = int(time.time())
    mac = hmac.new(
        STRIPE_WEBHOOK_SECRET.encode(), f"{at}.".encode() + payload, hashlib.sha256
    ).hexdigest()
    return {"Stripe-Signature": f"t={at},v1={mac}", "Content-Type": "application/json"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=500)
    args = parse_args(parser, events=30, rate=200)
    port = free_port()
    procs = ProcessGroup(Path(mkdtemp(prefix="paycron-events-burst-")), {})
    with private_database() as database_url:
        try:
            wait_http(
                f"http://127.0.0.1:{port}/healthz", procs.start("gateway", gateway_args(port))
            )
            handle = GatewayHandle(f"http://127.0.0.1:{port}", timeout=60)
            handle.stripe(enabled_events=["payment_intent.succeeded"])
            config = Config(
                database_url=database_url,
                redis_url=REDIS_URL,
                gateway="stripe",
                redis_namespace=f"paycron-bench-{uuid.uuid4().hex[:8]}",
                stripe_api_key=STRIPE_API_KEY,
                stripe_api_base=handle.stripe_url,
                stripe_webhook_secret=(STRIPE_WEBHOOK_SECRET,),
                gateway_rate_limit=args.rate,
                api_rate_limit=10**9,
                api_rate_burst=10**9,
            )
            started = time.monotonic()
            made = debits(handle, args.events)
            with connect(config) as conn:
                waiting_payments(conn, made)
            handle.stripe_settle()
            print(
                f"{args.events} bank debits made, waiting and settled at the stub in "
                f"{time.monotonic() - started:.0f}s"
            )
            bodies = [event_body(payment_id, intent) for payment_id, _, intent in made]
            from web import close_app, create_app

            app = create_app(config)
            client = app.test_client()
            times = []
            for body in bodies:
                t = time.perf_counter()
                answer = client.post("/v1/gateway-events/stripe", data=body, headers=signed(body))
                times.append(1000 * (time.perf_counter() - t))
                assert answer.status_code == 200, answer.json
            close_app(app)
            times.sort()
            print(
                f"web: {len(times)} events answered 200, p50 {statistics.median(times):.2f} "
                f"ms, p99 {times[int(0.99 * len(times))]:.2f} ms, max {times[-1]:.2f} ms"
            )
            pool = make_pool(config, max_size=6, name="bench-events")
            limiter = CallLimiter(redis.Redis.from_url(REDIS_URL), config)
            service = GatewayEventService(
                config=config,
                pool=pool,
                gateway=build_processor(config, max_connections=4, call_limiter=limiter),
            )
            t = time.monotonic()
            settled = 0
            while True:
                counts = service.run_once()
                settled += counts.settled
                with pool.connection() as conn:
                    left = conn.execute(
                        "SELECT count(*) AS n FROM gateway_events WHERE applied_at IS NULL"
                    ).fetchone()["n"]
                if left == 0:
                    break
            drain = time.monotonic() - t
            with pool.connection() as conn:
                completed = conn.execute(
                    "SELECT count(*) AS n FROM payments WHERE status = 'COMPLETED'"
                ).fetchone()["n"]
            service.close()
            pool.close()
            print(
                f"applier: {args.events} events applied in {drain:.1f}s = "
                f"{args.events / drain:.0f}/s against a window of {args.rate}/s (ideal "
                f"{args.events / args.rate:.1f}s); {settled} settled, {completed} COMPLETED"
            )
        finally:
            procs.stop()


if __name__ == "__main__":
    main()
