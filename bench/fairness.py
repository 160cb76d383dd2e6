"""Fair claiming across payers (docs/design.md): small payers beside one
payer's big backlog, everything due in the same second.

    python -m bench.fairness                 # both cases
    python -m bench.fairness --case small    # 1,500 + 15 at 100/s only

Case "small": one payer's 1,500 payments and another's 15, ceiling 100/s
(target: the small payer's last first attempt <= 3 s late). Case "many":
100 payers x 10 beside one payer's 100,000, ceiling 500/s (targets: the
small payers' p99 <= 5 s; the whole drain <= 1.05 x N / ceiling). The
engine runs as the Procfile ships it; the fake gateway answers after a
lognormal latency around --latency-ms. Prints each group's p50/p99/max.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from bench.harness import (
    due_in,
    max_charges_per_key,
    parse_args,
    private_database,
    procfile_system,
    wait_until_settled,
)
from bench.latency import latency_faults
from devtools.factories import bulk_insert
from paycron.sql import parse_blocks
from paycron.store.db import connect

QUERIES = parse_blocks("""
-- name: lateness_by_group
-- First-attempt lateness of the big payer's payments and of everyone else's.
SELECT (p.payer = %(big)s) AS big,
       count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - a.due_at))
           AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - a.due_at))
           AS p99,
       max(extract(epoch FROM a.started_at - a.due_at)) AS max
FROM attempts a JOIN payments p ON p.id = a.payment_id AND p.due_at = a.due_at
WHERE a.attempt = 1
GROUP BY 1 ORDER BY 1;
""")

#: name: (big backlog, small payers, payments each, ceiling per second)
CASES = {
    "small": (1500, 1, 15, 100),
    "many": (100_000, 100, 10, 500),
    "smoke": (60, 2, 5, 100),  # --smoke: proves the command runs
}


def run_case(name: str, latency_ms: int, lead_seconds: float = 15.0) -> None:
    big, payers, each, ceiling = CASES[name]
    total = big + payers * each
    with (
        private_database() as url,
        procfile_system(url, ceiling=ceiling, **latency_faults(latency_ms)) as system,
    ):
        spike = due_in(lead_seconds)
        with connect(system.config()) as conn:
            bulk_insert(conn, big, due_at=spike, payer="big")
            for n in range(payers):
                bulk_insert(conn, each, due_at=spike, payer=f"small-{n:03d}")
            conn.execute("ANALYZE payments")
            time.sleep(max(0.0, (spike - datetime.now(UTC)).total_seconds()))
            drain = wait_until_settled(conn, total, timeout=3600, tick=0.5)
            groups = {
                r["big"]: r for r in conn.execute(QUERIES["lateness_by_group"], {"big": "big"})
            }
        ledger = system.ledger()
    ideal = total / ceiling
    print(
        f"\ncase {name}: one payer's {big:,} beside {payers} payer(s) x {each}, all due at "
        f"one second; ceiling {ceiling}/s, latency ~{latency_ms} ms"
    )
    for is_big, label in ((False, "small payers"), (True, "big payer")):
        g = groups[is_big]
        print(
            f"  {label:13}: n={g['n']:>6}  lateness p50 {g['p50']:6.2f} s  p99 "
            f"{g['p99']:6.2f} s  max {g['max']:6.2f} s"
        )
    small = groups[False]
    if name == "small":
        print(
            f"  target: the small payer's last first attempt <= 3 s late: "
            f"{small['max']:.2f} s -> {'met' if small['max'] <= 3 else 'MISSED'}"
        )
    else:
        print(
            f"  target: small payers' p99 <= 5 s: {small['p99']:.2f} s -> "
            f"{'met' if small['p99'] <= 5 else 'MISSED'}"
        )
    print(
        f"  drain {drain:.1f} s; ideal N / ceiling {ideal:.1f} s; ratio {drain / ideal:.3f} "
        f"(target <= 1.05)"
    )
    print(f"  charges {len(ledger)}, max per key {max_charges_per_key(ledger)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--latency-ms", type=int, default=300)
    parser.add_argument(
        "--lead-seconds", type=float, default=15.0, help="how far ahead the spike is written"
    )
    args = parse_args(parser, case=["smoke"], latency_ms=20, lead_seconds=3.0)
    for name in args.case or ["small", "many"]:
        run_case(name, args.latency_ms, args.lead_seconds)


if __name__ == "__main__":
    main()
