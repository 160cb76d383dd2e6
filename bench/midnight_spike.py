"""Midnight spike: N payments due in the same second, the gateway's ceiling
at R/s. Trigger lateness (first attempt's start - due time) against the
ideal drain time N/R, 429s seen, lease expirations, charges per key.

    python -m bench.midnight_spike [--payments 20000] [--ceiling 500]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from bench.harness import (
    ALL_TIME,
    System,
    max_charges_per_key,
    parse_args,
    private_database,
    settled_counts,
    wait_until_settled,
)
from devtools.factories import bulk_insert
from paycron.sql import parse_blocks
from paycron.store.db import connect
from paycron.store.stats import lateness

QUERIES = parse_blocks("""
-- name: spike_expiries
-- Lease expirations and 429 answers recorded in the attempts.
SELECT count(*) FILTER (WHERE outcome = 'LEASE_EXPIRED') AS lease_expired,
       count(*) FILTER (WHERE outcome = 'RATE_LIMITED') AS rate_limited,
       count(*) AS attempts
FROM attempts;
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=20_000)
    parser.add_argument("--ceiling", type=int, default=500)
    parser.add_argument(
        "--lead-seconds",
        type=float,
        default=8.0,
        help="how far ahead of the spike the rows are written",
    )
    args = parse_args(parser, payments=100, ceiling=200, lead_seconds=3.0)
    settings = {
        "GATEWAY_RATE_LIMIT": str(args.ceiling),
        "SWEEP_INTERVAL_SECONDS": "0.5",
        "LEASE_SECONDS": "120",
        "GATEWAY_TIMEOUT_SECONDS": "10",
        "MESSAGE_GROUP_SIZE": "5",
    }
    with private_database() as url:
        system = System(url, settings, worker_processes=2, worker_threads=16)
        try:
            system.start_gateway(rate_limit_per_s=args.ceiling)
            system.start_engine()
            spike = (datetime.now(UTC) + timedelta(seconds=args.lead_seconds)).replace(
                microsecond=0
            )
            with connect(system.config()) as conn:
                bulk_insert(conn, args.payments, due_at=spike)
                time.sleep(max(0.0, (spike - datetime.now(UTC)).total_seconds()))
                drain = wait_until_settled(conn, args.payments, timeout=1800)
                late = lateness(conn, since=ALL_TIME)
                counts = conn.execute(QUERIES["spike_expiries"]).fetchone()
                expiries = settled_counts(conn)["lease_expired"]
            ledger = system.ledger()
            gateway = system.gateway_stats()
        finally:
            system.stop()
    ideal = args.payments / args.ceiling
    print(f"payments {args.payments} due at one second, ceiling {args.ceiling}/s")
    print(f"ideal drain (count / ceiling) : {ideal:7.1f} s")
    print(f"drain (spike -> all terminal) : {drain:7.1f} s")
    print(
        f"lateness p50 / p99 / max      : {late['p50']:.1f} / {late['p99']:.1f} / "
        f"{late['max']:.1f} s   (p99 / ideal = {late['p99'] / ideal:.2f})"
    )
    print(
        f"429s answered by the gateway  : {gateway['rate_limited']} "
        f"(attempts recorded RATE_LIMITED: {counts['rate_limited']})"
    )
    print(
        f"lease expirations             : {counts['lease_expired']} attempts, {expiries} payments"
    )
    print(
        f"gateway charges               : {len(ledger)}; max per key {max_charges_per_key(ledger)}"
    )


if __name__ == "__main__":
    main()
