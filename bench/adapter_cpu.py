"""CPU per payment in the worker's gateway client: the fake's urllib3 adapter
beside Stripe's official SDK (over our urllib3 transport), in one run.

Starts the fake gateway (both surfaces) in its own process, then from this
process charges N payments through each adapter with the worker's thread
count, and prints this process's CPU seconds per charge (user + system: the
client's cost alone; the fake's CPU is not counted) and the wall rate. A
real latency is added on the fake (``--latency-ms``) so the threads overlap
as a worker's calls do.

    python -m bench.adapter_cpu [--charges 3000] [--threads 32] [--latency-ms 300]
"""

from __future__ import annotations

import argparse
import resource
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import mkdtemp

from bench.harness import parse_args
from devtools.fake_gateway import STRIPE_API_KEY, GatewayHandle
from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http
from paycron.config import STRIPE_API_VERSION
from paycron.domain.enums import Outcome
from paycron.domain.processing import ChargeRequest
from paycron.processors.card.client import HttpGateway
from paycron.processors.stripe.client import StripeGateway


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(name: str, gateway, charges: int, threads: int) -> dict:
    requests = [
        ChargeRequest(
            reference=str(uuid.uuid4()),
            idempotency_key=str(uuid.uuid4()),
            amount=2500,
            currency="USD",
            customer="cus_bench",
            payment_method="pm_card_visa",
        )
        for _ in range(charges)
    ]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(gateway.charge, requests[:threads]))  # warm: connections, imports
        cpu, wall = cpu_seconds(), time.monotonic()
        results = list(pool.map(gateway.charge, requests[threads:]))
        cpu, wall = cpu_seconds() - cpu, time.monotonic() - wall
    made = len(results)
    ok = sum(r.outcome is Outcome.SUCCEEDED for r in results)
    return {
        "name": name,
        "charges": made,
        "succeeded": ok,
        "cpu_ms": 1000 * cpu / made,
        "rate": made / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--latency-ms", type=int, default=300)
    args = parse_args(parser, charges=60, threads=8, latency_ms=20)
    port = free_port()
    procs = ProcessGroup(Path(mkdtemp(prefix="paycron-adapter-cpu-")), {})
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", procs.start("gateway", gateway_args(port)))
        handle = GatewayHandle(f"http://127.0.0.1:{port}")
        handle.faults(latency_ms=args.latency_ms)
        fake = HttpGateway(handle.url, timeout=10, max_connections=args.threads)
        sdk = StripeGateway(
            api_key=STRIPE_API_KEY,
            api_base=handle.stripe_url,
            api_version=STRIPE_API_VERSION,
            timeout=10,
            max_connections=args.threads,
        )
        rows = [
            measure("fake card API, urllib3 (HttpGateway)", fake, args.charges, args.threads),
            measure("Stripe SDK over urllib3 (StripeGateway)", sdk, args.charges, args.threads),
        ]
        fake.close()
        sdk.close()
    finally:
        procs.stop()
    print(
        f"{args.charges} charges each, {args.threads} threads, {args.latency_ms} ms "
        "at the fake; CPU of this (client) process only"
    )
    for row in rows:
        print(
            f"  {row['name']:42} {row['cpu_ms']:6.2f} ms CPU per charge, "
            f"{row['rate']:6.0f} charges/s, {row['succeeded']}/{row['charges']} succeeded"
        )
    print(f"  the SDK costs {rows[1]['cpu_ms'] / rows[0]['cpu_ms']:.1f}x the CPU per charge")


if __name__ == "__main__":
    main()
