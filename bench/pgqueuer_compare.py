"""paycron beside pgqueuer on bench.throughput's workload: N payments due
now, an instant fake gateway, the rate limit out of the way.

pgqueuer gets one job per payment. Its handler makes the same gateway call
as paycron's worker (``POST /v1/charges``, ``Idempotency-Key`` = payment id,
paycron's own urllib3 keep-alive client) and the same two writes in one
transaction (the attempt row + the payment's CAS to COMPLETED, cf.
bench/baseline.sql). Its workers are real processes started with pgqueuer's
own supervisor (``pgqueuer.run(factory)``, what ``pgq run`` calls);
handlers are ``async`` (pgqueuer requires it), the blocking gateway call and
write run on a thread pool, as pgqueuer's docs advise for blocking code.

pgqueuer's driver is asyncpg by default (``pip install 'pgqueuer[asyncpg]'``),
the one its docs recommend for the QueueManager. ``--pgq-driver psycopg``
is there for comparison: its NOTIFY watcher holds the connection's lock up
to a second while it waits, and pgqueuer runs every query of a worker on
that one connection, so dequeues and acks stall behind it (measured here:
85-290 payments/s, erratic, against ~360-420 with asyncpg).

Measured the same way for both: from the moment the work is committed and
due (payment rows for paycron, jobs for pgqueuer) until every payment is
terminal in Postgres. pgqueuer's enqueue is done before the clock starts,
as it would be at create time; its duration is printed apart.

    python -m bench.pgqueuer_compare [--payments 20000] [--pgq-processes 3]
        [--pgq-threads 16] [--pgq-batch 50] [--pgq-max-tasks 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import psycopg

from bench.harness import (
    System,
    cpu_seconds,
    max_charges_per_key,
    parse_args,
    postgres_cpu_seconds,
    private_database,
    settled_counts,
    sustained_rate,
    wait_until_settled,
)
from bench.throughput import SETTINGS, run_baseline, run_paycron
from paycron.config import Config
from paycron.domain.ids import new_payment_id
from paycron.store.db import connect

ENTRYPOINT = "charge_payment"

#: The same unit of work as bench/baseline.sql, for a job that is its own
#: claim: the SUCCEEDED attempt row (attempt 1, the gateway's charge id) and
#: the payment's compare-and-swap to COMPLETED, one statement, one transaction.
ATTEMPT_AND_CAS = """
WITH att AS (
    INSERT INTO attempts (payment_id, attempt, gateway_key, outcome, finished_at, due_at,
                          gateway_ref, worker)
    VALUES (%(id)s, 1, %(id)s::text, 'SUCCEEDED', now(), %(due_at)s, %(ref)s, %(worker)s)
)
UPDATE payments SET status = 'COMPLETED', attempt = 1, updated_at = now()
WHERE id = %(id)s AND due_at = %(due_at)s AND status = 'PENDING'
"""


# --------------------------------------------------------------------------
# The pgqueuer worker: `python -m bench.pgqueuer_compare --worker`


def asyncpg_params(url: str) -> dict:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return {
        "host": info.get("host"),
        "port": int(info.get("port") or 5432),
        "user": info.get("user"),
        "password": info.get("password"),
        "database": info.get("dbname"),
        # paycron's session settings (paycron/store/db.py): without custom
        # plans, asyncpg's prepared statements turn generic after five runs
        # and lock every day partition (~1,900 locks each), which ran this
        # server out of its lock table ("out of shared memory") mid-run.
        "server_settings": {"plan_cache_mode": "force_custom_plan", "TimeZone": "UTC"},
    }


@contextlib.asynccontextmanager
async def factory() -> AsyncIterator[object]:
    """pgqueuer's factory: a PgQueuer over a psycopg async connection
    (autocommit, as pgqueuer requires) with the charge entrypoint."""
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from paycron.domain.enums import Outcome
    from paycron.domain.processing import ChargeRequest
    from paycron.processors.card.client import CardProcessor
    from paycron.store.db import make_pool
    from paycron.store.transitions import worker_name

    config = Config.from_env()
    threads = int(os.environ.get("PGQ_BENCH_THREADS", "16"))
    if os.environ.get("PGQ_BENCH_DRIVER", "asyncpg") == "asyncpg":
        import asyncpg

        connection = await asyncpg.connect(**asyncpg_params(config.database_url))
        pgq = PgQueuer.from_asyncpg_connection(connection)
    else:
        connection = await psycopg.AsyncConnection.connect(config.database_url, autocommit=True)
        pgq = PgQueuer.from_psycopg_connection(connection)
    executor = ThreadPoolExecutor(threads, thread_name_prefix="charge")
    pool = make_pool(config, min_size=2, max_size=threads, name="pgq-bench")
    gateway = CardProcessor(config.gateway_url, timeout=config.gateway_timeout_seconds)
    worker = worker_name()

    def charge_and_record(payload: bytes) -> None:
        text_id, due, amount = payload.decode().split(",")
        result = gateway.charge(
            ChargeRequest(
                reference=text_id, idempotency_key=text_id, amount=int(amount), currency="USD"
            )
        )
        if result.outcome is not Outcome.SUCCEEDED:
            raise RuntimeError(f"gateway answered {result.outcome} for {text_id}")
        with pool.connection() as conn, conn.transaction():
            conn.execute(
                ATTEMPT_AND_CAS,
                {
                    "id": uuid.UUID(text_id),
                    "due_at": datetime.fromisoformat(due),
                    "ref": result.gateway_ref,
                    "worker": worker,
                },
                prepare=True,
            )

    @pgq.entrypoint(ENTRYPOINT)
    async def charge_payment(job: Job) -> None:
        await asyncio.get_running_loop().run_in_executor(executor, charge_and_record, job.payload)

    try:
        yield pgq
    finally:
        executor.shutdown(wait=True)
        pool.close()
        gateway.close()
        await connection.close()


def run_worker(batch: int, max_tasks: int) -> None:
    """One pgqueuer worker process, as `pgq run` starts it (uvloop, signal
    handlers, supervisor), through pgqueuer's programmatic ``run``: the 1.6.0
    CLI fails at start-up with typer 0.29 (``--log-level`` arrives as a str)."""
    import uvloop
    from pgqueuer import run

    uvloop.run(
        run(
            factory,
            batch_size=batch,
            dequeue_timeout=timedelta(seconds=1),
            max_concurrent_tasks=max_tasks or None,
        )
    )


# --------------------------------------------------------------------------
# The driver


async def install_pgqueuer(url: str) -> None:
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await Queries.from_psycopg_connection(conn).install()


async def enqueue(url: str, payloads: list[bytes]) -> float:
    """One batch enqueue of every job (one statement); its duration."""
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries.from_psycopg_connection(conn)
        started = time.monotonic()
        await queries.enqueue([ENTRYPOINT] * len(payloads), payloads, [0] * len(payloads))
        return time.monotonic() - started


def insert_payments(conn, n: int) -> list[bytes]:
    """``n`` PENDING payments due just now, by COPY; one job payload each."""
    due_at = datetime.now(UTC) - timedelta(seconds=2)
    payloads = []
    with conn.cursor().copy(
        "COPY payments (id, due_at, payer, payee, amount_minor, currency, run_at) FROM STDIN"
    ) as copy:
        for i in range(n):
            due = due_at - timedelta(microseconds=i)
            amount = 100 + i % 10_000
            pid = new_payment_id(due)
            copy.write_row((pid, due, "alice", "shop", amount, "USD", due))
            payloads.append(f"{pid},{due.isoformat()},{amount}".encode())
    return payloads


def run_pgqueuer(
    database_url: str,
    n: int,
    *,
    worker_args: list[str],
    processes: int,
    env: dict[str, str] | None = None,
    faults: dict | None = None,
    warmup: int = 0,
    tick: float = 0.5,
) -> dict:
    """``processes`` pgqueuer workers (``python <worker_args>``) drain ``n``
    jobs against a fake gateway with ``faults`` (after ``warmup`` jobs,
    untimed); the rate, and the CPU the workers, their Postgres backends and
    the gateway spent meanwhile."""
    asyncio.run(install_pgqueuer(database_url))
    system = System(database_url, SETTINGS)
    try:
        system.start_gateway(**(faults or {}))
        for i in range(processes):
            system.procs.start(f"pgqueuer-{i}", worker_args, env=env)
        with connect(system.config()) as conn:
            time.sleep(3)  # the workers are up and listening, as paycron's are
            for proc in system.procs.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a pgqueuer worker exited; see {system.logdir}")
            if warmup:
                asyncio.run(enqueue(database_url, insert_payments(conn, warmup)))
                wait_until_settled(conn, warmup, timeout=120, tick=tick)
            payloads = insert_payments(conn, n)
            gateway_proc, *workers = system.procs.procs
            enqueue_seconds = asyncio.run(enqueue(database_url, payloads))
            mark = conn.execute("SELECT now() AS t").fetchone()["t"]
            cpu_before = (
                cpu_seconds(workers),
                cpu_seconds([gateway_proc]),
                postgres_cpu_seconds(database_url),
            )
            seconds = wait_until_settled(conn, n, timeout=600, tick=tick)
            cpu = cpu_seconds(workers) - cpu_before[0]
            gateway_cpu = cpu_seconds([gateway_proc]) - cpu_before[1]
            postgres_cpu = postgres_cpu_seconds(database_url) - cpu_before[2]
            completed = settled_counts(conn)["completed"] - warmup
            sustained = sustained_rate(conn, mark)
        ledger = system.ledger()
        at_once = system.gateway_stats()["charges_in_progress_max"]
    finally:
        system.stop()
    return {
        "seconds": seconds,
        "per_second": n / seconds,
        "sustained": sustained,
        "completed": completed,
        "enqueue_seconds": enqueue_seconds,
        "charges": len(ledger) - warmup,
        "max_charges_per_key": max_charges_per_key(ledger),
        # the most charge requests the processor was answering at once
        "calls_at_once": at_once,
        "cpu": cpu,
        "gateway_cpu": gateway_cpu,
        "postgres_cpu": postgres_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=20_000)
    parser.add_argument("--worker-processes", type=int, default=2, help="paycron's")
    parser.add_argument("--worker-threads", type=int, default=16, help="paycron's")
    parser.add_argument(
        "--pgq-processes",
        type=int,
        default=3,
        help="pgqueuer worker processes (paycron runs 3: 2 workers + 1 scheduler)",
    )
    parser.add_argument(
        "--pgq-threads",
        type=int,
        default=16,
        help="threads per pgqueuer process for the blocking call + write",
    )
    parser.add_argument("--pgq-batch", type=int, default=50, help="pgqueuer --batch-size")
    parser.add_argument(
        "--pgq-max-tasks",
        type=int,
        default=200,
        help="pgqueuer --max-concurrent-tasks per process (0: unlimited)",
    )
    parser.add_argument(
        "--pgq-driver",
        choices=("asyncpg", "psycopg"),
        default="asyncpg",
        help="pgqueuer's connection driver (psycopg: see the module doc)",
    )
    parser.add_argument(
        "--skip-paycron", action="store_true", help="pgqueuer alone (for tuning it)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(parser, payments=100, pgq_processes=1, pgq_threads=4)
    if args.worker:
        run_worker(args.pgq_batch, args.pgq_max_tasks)
        return
    engine = baseline = None
    if not args.skip_paycron:
        with private_database() as url:
            engine = run_paycron(
                url,
                args.payments,
                worker_processes=args.worker_processes,
                worker_threads=args.worker_threads,
            )
            baseline = run_baseline(url, args.payments)
    with private_database() as url:
        worker = [
            "-m",
            "bench.pgqueuer_compare",
            "--worker",
            "--pgq-batch",
            str(args.pgq_batch),
            "--pgq-max-tasks",
            str(args.pgq_max_tasks),
        ]
        pgq = run_pgqueuer(
            url,
            args.payments,
            worker_args=worker,
            processes=args.pgq_processes,
            env={"PGQ_BENCH_THREADS": str(args.pgq_threads), "PGQ_BENCH_DRIVER": args.pgq_driver},
        )
    from importlib.metadata import version

    print(f"payments: {args.payments}, instant gateway, rate limit out of the way")
    if engine is not None:
        print(
            f"paycron end to end : {engine['per_second']:8.0f} payments/s "
            f"({engine['seconds']:.1f} s, completed {engine['completed']}, gateway charges "
            f"{engine['charges']}, max charges/key {engine['max_charges_per_key']}; "
            f"{args.worker_processes} worker processes x {args.worker_threads} threads)"
        )
    print(
        f"pgqueuer {version('pgqueuer')}     : {pgq['per_second']:8.0f} payments/s "
        f"({pgq['seconds']:.1f} s, completed {pgq['completed']}, gateway charges "
        f"{pgq['charges']}, max charges/key {pgq['max_charges_per_key']}; "
        f"{args.pgq_driver}, {args.pgq_processes} processes, batch {args.pgq_batch}, max tasks "
        f"{args.pgq_max_tasks or 'unlimited'}, {args.pgq_threads} threads; "
        f"enqueue of {args.payments} jobs took {pgq['enqueue_seconds']:.2f} s, untimed)"
    )
    if baseline is not None:
        print(
            f"raw SQL loop       : {baseline['per_second']:8.0f} payments/s "
            f"({baseline['seconds']:.1f} s, no HTTP, no queue)"
        )
    if engine is not None:
        print(f"ratio paycron / pgqueuer: {engine['per_second'] / pgq['per_second']:.2f}")
        print(f"ratio paycron / raw     : {engine['per_second'] / baseline['per_second']:.2f}")


if __name__ == "__main__":
    main()
