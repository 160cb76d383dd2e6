"""End-to-end throughput: N payments all due now, an instant gateway, the
rate limit out of the way. paycron (scheduler + Dramatiq workers + the fake
gateway over HTTP) beside a raw-SQL loop that claims in batches and then,
per payment, inserts its attempt and CASes it in a transaction of its own.

    python -m bench.throughput [--payments 20000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness import (
    System,
    max_charges_per_key,
    parse_args,
    private_database,
    settled_counts,
    wait_until_settled,
)
from devtools.factories import bulk_insert
from paycron.config import Config
from paycron.sql import parse_blocks
from paycron.store.db import connect
from paycron.store.transitions import claim_due

BASELINE = parse_blocks((Path(__file__).parent / "baseline.sql").read_text())
SETTINGS = {
    "GATEWAY_RATE_LIMIT": "1000000",
    "CLAIM_BATCH": "500",
    "MESSAGE_GROUP_SIZE": "20",
    "LEASE_SECONDS": "300",
    "GATEWAY_TIMEOUT_SECONDS": "5",
    "SWEEP_INTERVAL_SECONDS": "0.2",
    "DB_POOL_MAX": "20",
}


def run_paycron(database_url: str, n: int, *, worker_processes: int, worker_threads: int) -> dict:
    system = System(
        database_url, SETTINGS, worker_processes=worker_processes, worker_threads=worker_threads
    )
    try:
        system.start_gateway()
        system.start_engine()
        with connect(system.config()) as conn:
            bulk_insert(conn, n)
            seconds = wait_until_settled(conn, n, timeout=600)
            completed = settled_counts(conn)["completed"]
        ledger = system.ledger()
    finally:
        system.stop()
    return {
        "seconds": seconds,
        "per_second": n / seconds,
        "completed": completed,
        "charges": len(ledger),
        "max_charges_per_key": max_charges_per_key(ledger),
    }


def run_baseline(database_url: str, n: int, batch: int = 100) -> dict:
    import time

    config = Config(database_url=database_url)
    with connect(config) as conn:
        conn.execute("DELETE FROM payments")
        conn.execute("DELETE FROM attempts")
        bulk_insert(conn, n)
        started = time.monotonic()
        done = 0
        while True:
            claims = claim_due(conn, limit=batch, lease_seconds=300)
            if not claims:
                break
            for claim in claims:
                with conn.transaction():
                    conn.execute(
                        BASELINE["baseline_attempt_and_cas"],
                        {"id": claim.payment_id, "due_at": claim.due_at, "attempt": claim.attempt},
                        prepare=True,
                    )
                done += 1
        seconds = time.monotonic() - started
    return {"seconds": seconds, "per_second": done / seconds, "completed": done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=20_000)
    parser.add_argument("--worker-processes", type=int, default=2)
    parser.add_argument("--worker-threads", type=int, default=16)
    args = parse_args(parser, payments=200)
    with private_database() as url:
        engine = run_paycron(
            url,
            args.payments,
            worker_processes=args.worker_processes,
            worker_threads=args.worker_threads,
        )
        baseline = run_baseline(url, args.payments)
    print(f"payments: {args.payments}")
    print(
        f"paycron end to end : {engine['per_second']:8.0f} payments/s "
        f"({engine['seconds']:.1f} s, completed {engine['completed']}, "
        f"gateway charges {engine['charges']}, max charges/key "
        f"{engine['max_charges_per_key']})"
    )
    print(
        f"raw SQL loop       : {baseline['per_second']:8.0f} payments/s "
        f"({baseline['seconds']:.1f} s)"
    )
    print(f"ratio paycron / raw: {engine['per_second'] / baseline['per_second']:.2f}")


if __name__ == "__main__":
    main()
