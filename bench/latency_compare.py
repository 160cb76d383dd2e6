"""The uncapped rate at a real processor's latency: paycron beside pgqueuer
used asynchronously, same gateway settings, same run (issue 10, SPEC §13).

N payments due now; the fake gateway answers after a lognormal latency
around the median (bench.latency's shape: p99 twice the median) with no
ceiling of its own. paycron runs the Procfile as shipped with every setting
at its default except GATEWAY_RATE_LIMIT, set high enough never to bind.
pgqueuer runs as its users would write it at this latency: one process, an
``async def`` job making the call with an aiohttp ``ClientSession``
(``POST /v1/charges``, ``Idempotency-Key`` = payment id, a connector as
wide as the tasks) and the two writes of bench.pgqueuer_compare (the
SUCCEEDED attempt row and the payment's CAS, one statement) on the asyncpg
pool pgqueuer itself runs on, ``max_concurrent_tasks=200``.

Both are timed from the moment the work is due (payments for paycron, the
committed enqueue for pgqueuer) until every payment is terminal in Postgres.
CPU per payment is user + system time of the engine's processes (paycron:
scheduler and workers; pgqueuer: its worker) over that window, the fake
gateway's apart. Target: paycron >= 1.5 x pgqueuer.

    python -m bench.latency_compare [--payments 6000] [--latency-ms 300]
        [--pgq-max-tasks 200] [--pgq-batch 10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from bench.harness import (
    System,
    cpu_seconds,
    in_flight,
    max_charges_per_key,
    private_database,
    settled_counts,
    wait_until_settled,
)
from bench.latency import latency_faults
from bench.pgqueuer_compare import ATTEMPT_AND_CAS, ENTRYPOINT, asyncpg_params, run_pgqueuer
from devtools.factories import bulk_insert
from paycron.config import Config
from paycron.db import connect

#: High enough that paycron's shared call window never binds.
UNCAPPED_RATE_LIMIT = 100_000
#: bench.pgqueuer_compare's statement with asyncpg's positional parameters.
ATTEMPT_AND_CAS_ASYNCPG = (ATTEMPT_AND_CAS.replace("%(id)s", "$1::uuid")
                           .replace("%(due_at)s", "$2::timestamptz")
                           .replace("%(ref)s", "$3::text").replace("%(worker)s", "$4::text"))


# --------------------------------------------------------------------------
# The pgqueuer worker: `python -m bench.latency_compare --worker`


@contextlib.asynccontextmanager
async def async_factory(max_tasks: int) -> AsyncIterator[object]:
    """pgqueuer's factory: a PgQueuer over an asyncpg pool whose charge job
    is a coroutine from end to end (aiohttp call, asyncpg write)."""
    import aiohttp
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from paycron.transitions import worker_name

    config = Config.from_env()
    pool = await asyncpg.create_pool(**asyncpg_params(config.database_url))
    pgq = PgQueuer.from_asyncpg_pool(pool)
    # aiohttp's connector holds 100 connections by default: as wide as the
    # tasks instead, or the connector, not pgqueuer, would bound what is in flight.
    session = aiohttp.ClientSession(
        base_url=config.gateway_url, connector=aiohttp.TCPConnector(limit=max_tasks),
        timeout=aiohttp.ClientTimeout(total=config.gateway_timeout_seconds))
    worker = worker_name()

    @pgq.entrypoint(ENTRYPOINT)
    async def charge_payment(job: Job) -> None:
        text_id, due, amount = job.payload.decode().split(",")
        async with session.post(
                "/v1/charges", headers={"Idempotency-Key": text_id},
                json={"amount": int(amount), "currency": "USD", "reference": text_id},
        ) as response:
            if response.status not in (200, 201):
                raise RuntimeError(f"gateway answered {response.status} for {text_id}")
            charge = await response.json()
        await pool.execute(ATTEMPT_AND_CAS_ASYNCPG, uuid.UUID(text_id),
                           datetime.fromisoformat(due), charge["id"], worker)

    try:
        yield pgq
    finally:
        await session.close()
        await pool.close()


def run_worker(batch: int, max_tasks: int) -> None:
    """One pgqueuer worker process as `pgq run` starts it (uvloop, signal
    handlers, supervisor); see bench.pgqueuer_compare.run_worker."""
    import uvloop
    from pgqueuer import run

    uvloop.run(run(functools.partial(async_factory, max_tasks), batch_size=batch,
                   dequeue_timeout=timedelta(seconds=1), max_concurrent_tasks=max_tasks))


# --------------------------------------------------------------------------
# The driver


def run_paycron(database_url: str, n: int, median_ms: int, *, lead_seconds: float = 8.0
                ) -> dict:
    """The Procfile as shipped, only GATEWAY_RATE_LIMIT set (out of the way);
    ``n`` payments due at one second, written ``lead_seconds`` ahead."""
    system = System(database_url, {"GATEWAY_RATE_LIMIT": str(UNCAPPED_RATE_LIMIT)},
                    worker_processes=None, worker_threads=None)  # the Procfile's
    try:
        system.start_gateway(**latency_faults(median_ms))
        system.start_engine()
        due = (datetime.now(UTC) + timedelta(seconds=lead_seconds)).replace(microsecond=0)
        with connect(system.config()) as conn:
            bulk_insert(conn, n, due_at=due)
            time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
            gateway_proc, *engine_procs = system.procs.procs
            cpu_before = cpu_seconds(engine_procs), cpu_seconds([gateway_proc])
            seconds = wait_until_settled(conn, n, timeout=600, tick=0.1)
            cpu = cpu_seconds(engine_procs) - cpu_before[0]
            gateway_cpu = cpu_seconds([gateway_proc]) - cpu_before[1]
            counts = settled_counts(conn)
            flight = in_flight(conn)
        ledger = system.ledger()
    finally:
        system.stop()
    return {"seconds": seconds, "per_second": n / seconds, "completed": counts["completed"],
            "lease_expired": counts["lease_expired"], "in_flight": flight, "cpu": cpu,
            "gateway_cpu": gateway_cpu, "charges": len(ledger),
            "max_charges_per_key": max_charges_per_key(ledger)}


def run_pgqueuer_async(database_url: str, n: int, median_ms: int, *, batch: int,
                       max_tasks: int) -> dict:
    worker = ["-m", "bench.latency_compare", "--worker", "--pgq-batch", str(batch),
              "--pgq-max-tasks", str(max_tasks)]
    return run_pgqueuer(database_url, n, worker_args=worker, processes=1,
                        faults=latency_faults(median_ms), tick=0.1)


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def report(name: str, r: dict, n: int, loadavg: str, detail: str) -> None:
    print(f"  {name:<18}: {r['per_second']:6.0f} payments/s ({r['seconds']:.1f} s); CPU per "
          f"payment {1000 * r['cpu'] / n:.2f} ms (gateway {1000 * r['gateway_cpu'] / n:.2f} ms)"
          f"; completed {r['completed']}, charges {r['charges']}, max/key "
          f"{r['max_charges_per_key']}; {detail}; {loadavg} at start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=6000)
    parser.add_argument("--latency-ms", type=int, default=300, help="median gateway latency")
    parser.add_argument("--pgq-max-tasks", type=int, default=200)
    parser.add_argument("--pgq-batch", type=int, default=10,
                        help="pgqueuer's batch size (default: `pgq run`'s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="pairs of runs (paycron, then pgqueuer); the ratio of medians")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.pgq_batch, args.pgq_max_tasks)
        return
    n, median = args.payments, args.latency_ms
    from importlib.metadata import version

    print(f"{n} payments due now, fake gateway ~{median} ms (lognormal, p99 {2 * median} ms), "
          f"no ceiling; paycron: the Procfile as shipped, GATEWAY_RATE_LIMIT="
          f"{UNCAPPED_RATE_LIMIT}; pgqueuer {version('pgqueuer')}: async job (aiohttp "
          f"{version('aiohttp')} + asyncpg), {args.pgq_max_tasks} tasks, batch "
          f"{args.pgq_batch}, one process")
    rates: dict[str, list[float]] = {"paycron": [], "pgqueuer": []}
    for i in range(args.rounds):
        print(f"round {i + 1}")
        loadavg = load()
        with private_database() as url:
            engine = run_paycron(url, n, median)
        flight = engine["in_flight"]
        report("paycron", engine, n, loadavg,
               f"in flight max {flight['max']} mean {flight['mean']:.0f}, lease expirations "
               f"{engine['lease_expired']}")
        loadavg = load()
        with private_database() as url:
            pgq = run_pgqueuer_async(url, n, median, batch=args.pgq_batch,
                                     max_tasks=args.pgq_max_tasks)
        report("pgqueuer (async)", pgq, n, loadavg,
               f"enqueue {pgq['enqueue_seconds']:.2f} s, untimed")
        print(f"  ratio paycron / pgqueuer: {engine['per_second'] / pgq['per_second']:.2f} "
              f"(target >= 1.5); CPU per payment paycron / pgqueuer: "
              f"{engine['cpu'] / pgq['cpu']:.2f}")
        rates["paycron"].append(engine["per_second"])
        rates["pgqueuer"].append(pgq["per_second"])
    if args.rounds > 1:
        paycron, pgq_rate = statistics.median(rates["paycron"]), statistics.median(
            rates["pgqueuer"])
        print(f"median of {args.rounds}: paycron {paycron:.0f}/s, pgqueuer {pgq_rate:.0f}/s, "
              f"ratio {paycron / pgq_rate:.2f}")


if __name__ == "__main__":
    main()
