"""Spikes at a real processor's latency (docs/design.md).

N payments due in the same second; the fake gateway answers after a
lognormal latency around the given median (p99 = 2 x median) and refuses
calls above the ceiling with 429. The engine runs exactly as the Procfile
ships it, with only GATEWAY_RATE_LIMIT set. Prints first-attempt lateness
against the bound 1.1 x N / ceiling + 5 s, the drain, calls in flight, CPU
per payment, lease expirations and charges per key.

    python -m bench.latency                     # both spikes
    python -m bench.latency --payments 3000 --ceiling 500 --latency-ms 300
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from bench.harness import (
    ALL_TIME,
    cpu_seconds,
    due_in,
    in_flight,
    max_charges_per_key,
    parse_args,
    private_database,
    procfile_system,
    settled_counts,
    wait_until_settled,
)
from devtools.factories import bulk_insert
from paycron.store.db import connect
from paycron.store.stats import lateness

#: The two spikes: (payments, ceiling per second, median latency ms).
SPIKES = ((3000, 500, 300), (2000, 200, 1000))


def latency_faults(median_ms: int) -> dict:
    """A processor's latency: lognormal around the median, p99 twice it."""
    return {
        "latency_dist": "lognormal",
        "latency_p50_ms": median_ms,
        "latency_p99_ms": 2 * median_ms,
        "latency_cap_ms": 5 * median_ms,
    }


def run_spike(payments: int, ceiling: int, median_ms: int, *, lead_seconds: float = 8.0) -> dict:
    with (
        private_database() as url,
        procfile_system(url, ceiling=ceiling, **latency_faults(median_ms)) as system,
    ):
        spike = due_in(lead_seconds)
        with connect(system.config()) as conn:
            bulk_insert(conn, payments, due_at=spike)
            time.sleep(max(0.0, (spike - datetime.now(UTC)).total_seconds()))
            gateway_proc, *engine_procs = system.procs.procs
            cpu_before = cpu_seconds(engine_procs), cpu_seconds([gateway_proc])
            drain = wait_until_settled(conn, payments, timeout=1800, tick=0.2)
            cpu = cpu_seconds(engine_procs) - cpu_before[0]
            gateway_cpu = cpu_seconds([gateway_proc]) - cpu_before[1]
            late = lateness(conn, since=ALL_TIME)
            flight = in_flight(conn)
            expiries = settled_counts(conn)["lease_expired"]
        ledger = system.ledger()
        gateway = system.gateway_stats()
    return {
        "payments": payments,
        "ceiling": ceiling,
        "median_ms": median_ms,
        "drain": drain,
        "late": late,
        "in_flight": flight,
        "cpu": cpu,
        "gateway_cpu": gateway_cpu,
        "lease_expired": expiries,
        "charges": len(ledger),
        "max_per_key": max_charges_per_key(ledger),
        "rate_limited": gateway.get("rate_limited"),
    }


def report(r: dict) -> None:
    n, ceiling = r["payments"], r["ceiling"]
    ideal = n / ceiling
    bound = 1.1 * ideal + 5
    late = r["late"]
    print(
        f"\n{n} payments due at one second, ceiling {ceiling}/s, latency "
        f"~{r['median_ms']} ms (lognormal, p99 {2 * r['median_ms']} ms)"
    )
    print(
        f"  lateness p50 / p99 / max : {late['p50']:.1f} / {late['p99']:.1f} / {late['max']:.1f} s"
    )
    print(
        f"  bound 1.1 x N/ceiling + 5: {bound:.1f} s   -> "
        f"{'met' if late['p99'] <= bound else 'MISSED'}"
    )
    print(
        f"  drain (spike -> terminal): {r['drain']:.1f} s (ideal {ideal:.1f} s); effective "
        f"{n / r['drain']:.0f}/s"
    )
    print(
        f"  calls in flight          : max {r['in_flight']['max']}, mean "
        f"{r['in_flight']['mean']:.0f} (ceiling x latency = "
        f"{ceiling * r['median_ms'] / 1000:.0f})"
    )
    print(
        f"  CPU per payment          : {1000 * r['cpu'] / n:.2f} ms in the engine "
        f"(scheduler + workers; the fake gateway {1000 * r['gateway_cpu'] / n:.2f} ms)"
    )
    print(f"  lease expirations        : {r['lease_expired']};  429s: {r['rate_limited']}")
    print(f"  charges {r['charges']}, max per key {r['max_per_key']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int)
    parser.add_argument("--ceiling", type=int)
    parser.add_argument("--latency-ms", type=int)
    parser.add_argument(
        "--lead-seconds", type=float, default=8.0, help="how far ahead the spike is written"
    )
    args = parse_args(parser, payments=60, ceiling=200, latency_ms=20, lead_seconds=3.0)
    spikes = SPIKES
    if args.payments or args.ceiling or args.latency_ms:
        spikes = ((args.payments or 3000, args.ceiling or 500, args.latency_ms or 300),)
    for spike in spikes:
        report(run_spike(*spike, lead_seconds=args.lead_seconds))


if __name__ == "__main__":
    main()
