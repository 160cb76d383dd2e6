"""What binding customers to payers costs a create (docs/design.md): a create
naming a customer its payer already uses is the one statement a create
without one is; only the first create naming a customer binds it, in a
transaction of its own.

    python -m bench.create_customer                # 500 creates of each kind
    python -m bench.create_customer --requests 200

Times ``POST /v1/scheduled-payments`` through the Flask test client of one
app per processor, alternating five kinds after a warm-up: no customer (to
the GATEWAY=fake app), a customer the payer already uses and a new customer
each time (to a GATEWAY=stripe app with PAYMENT_METHOD_CHECK=false: no call
reaches Stripe), and with the check on (docs/customers.md), against the fake
processor's Stripe surface started in its own process: a (customer, method)
pair asked before (its verdict kept) and a new pair each time (one
``GET /v1/payment_methods/{id}`` through the SDK, and a new customer bound).
Prints each kind's median and p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import mkdtemp

from bench.harness import REDIS_URL, parse_args, private_database
from devtools.fake_gateway import STRIPE_API_KEY
from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http
from paycron.config import Config
from paycron.store import apikeys
from paycron.store.db import connect

URL = "/v1/scheduled-payments"
PAYER = "bench-payer"
WARMUP = 20


def run(requests: int) -> None:
    port = free_port()
    procs = ProcessGroup(Path(mkdtemp(prefix="paycron-bench-customer-")), {})
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", procs.start("gateway", gateway_args(port)))
        times = _measure(requests, f"http://127.0.0.1:{port}/stripe")
    finally:
        procs.stop()
    print(f"{requests} creates of each kind, one payer, through the test client")
    for kind, samples in times.items():
        p95 = statistics.quantiles(samples, n=20)[-1]
        print(f"  {kind:<22} median {statistics.median(samples):6.2f} ms  p95 {p95:6.2f} ms")


def _measure(requests: int, stripe_base: str) -> dict[str, list[float]]:
    from web import close_app, create_app

    with private_database("paycron_bench_customer") as url:
        with connect(Config(database_url=url)) as conn:
            key, _ = apikeys.create_api_key(conn, PAYER)
        base = Config.from_env(
            {
                "DATABASE_URL": url,
                "REDIS_URL": REDIS_URL,
                "REDIS_NAMESPACE": f"paycron-bench-{uuid.uuid4().hex[:8]}",
                "API_RATE_LIMIT": "1000000",
                "API_RATE_BURST": "1000000",
            }
        )
        apps = {
            "fake": create_app(base),
            "stripe": create_app(
                base.with_overrides(
                    gateway="stripe", stripe_api_key="sk_test_bench", payment_method_check=False
                )
            ),
            "checked": create_app(
                base.with_overrides(
                    gateway="stripe", stripe_api_key=STRIPE_API_KEY, stripe_api_base=stripe_base
                )
            ),
        }
        try:
            clients = {name: app.test_client() for name, app in apps.items()}
            keys = itertools.count()
            due = (datetime.now(UTC) + timedelta(days=1)).isoformat()

            def create(kind: str) -> float:
                body = {"payee": "shop", "amount": 2500, "dueAt": due}
                app = "fake" if kind == "no customer" else "stripe"
                client = clients["checked" if kind.startswith("checked") else app]
                if kind != "no customer":
                    customer = (
                        "cus_bench"
                        if kind in ("customer in use", "checked, pair seen")
                        else f"cus_{uuid.uuid4().hex}"
                    )
                    body.update(paymentMethod="pm_card_visa", customer=customer)
                started = time.perf_counter()
                response = client.post(
                    URL,
                    json=body,
                    headers={"Authorization": f"Bearer {key}", "Idempotency-Key": f"k{next(keys)}"},
                )
                elapsed = (time.perf_counter() - started) * 1000
                assert response.status_code == 201, response.get_data(as_text=True)
                return elapsed

            kinds = (
                "no customer",
                "customer in use",
                "new customer",
                "checked, pair seen",
                "checked, new pair",
            )
            for kind in kinds:
                for _ in range(WARMUP):
                    create(kind)
            times = {kind: [] for kind in kinds}
            for _ in range(requests):
                for kind in kinds:
                    times[kind].append(create(kind))
        finally:
            for app in apps.values():
                close_app(app)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    args = vars(parse_args(parser, requests=20))
    args.pop("smoke")
    run(**args)


if __name__ == "__main__":
    main()
