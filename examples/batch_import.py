"""Stream a CSV of payments into paycron's batch create.

    python examples/batch_import.py payments.csv --url http://127.0.0.1:8000 \
        --key "$PAYCRON_API_KEY" [--batch-size 1000] [--in-flight 1] [--rejects rejects.csv]

The CSV has a header row naming its columns: ``idempotency_key``, ``payee``,
``amount`` (integer minor units), ``due_at`` (RFC 3339 with an offset) and
optionally ``currency``, ``payment_method``, ``customer``. Rows are read as
they are sent, ``--batch-size`` at a time, ``--in-flight`` batches sent at
once (one by default: an import then leaves room for other clients of the
same server; two nearly double the rate on a server with cores to spare,
while it checks one batch its database writes the other), so a file of
millions costs the memory of a few batches.

Every row carries its own idempotency key, so sending a batch again is
safe: what was created is answered again (``replayed``), never created
twice. That is why this script retries without fear: a 429 after its
``Retry-After``, a 5xx or a lost connection with backoff, the same batch
each time; and why a whole import that stopped halfway can simply be run
again from the start. Keep the keys stable (e.g. ``<subscription>-<month>``).

Items the API refuses (400: an invalid field; 409: a key already used with
another body) are not retried: they are written to ``--rejects`` (or
standard error) with their line and reason, and the exit status is 1.

Needs only httpx (``pip install httpx``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

PATH = "/v1/scheduled-payments/batch"
#: Columns of the CSV and the item fields they fill.
COLUMNS = {
    "idempotency_key": "idempotencyKey",
    "payee": "payee",
    "amount": "amount",
    "due_at": "dueAt",
    "currency": "currency",
    "payment_method": "paymentMethod",
    "customer": "customer",
}
REQUIRED = ("idempotency_key", "payee", "amount", "due_at")
#: Sending one batch is given up after this many attempts (about 2 minutes
#: of backoff): the server is then down for longer than a retry should hide.
MAX_ATTEMPTS = 8
#: Backoff after a 5xx or a lost connection: 0.5 s, doubling, at most 16 s.
FIRST_BACKOFF, MAX_BACKOFF = 0.5, 16.0


@dataclass
class Tally:
    created: int = 0
    replayed: int = 0
    refused: int = 0
    retries: int = 0
    rejects: list[tuple[int, str, str]] = field(default_factory=list)


def read_items(lines) -> Iterator[tuple[int, dict]]:
    """(line number, item) for each row; a row that cannot become an item
    (an amount that is not an integer) is still sent, for the API to refuse
    with its own message."""
    reader = csv.DictReader(lines)
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise SystemExit(f"the CSV has no column {', '.join(missing)}")
    for row in reader:
        item = {}
        for column, name in COLUMNS.items():
            value = row.get(column)
            if value in (None, "") and column not in REQUIRED:
                continue
            item[name] = value
        try:
            item["amount"] = int(item["amount"])
        except (TypeError, ValueError):
            pass  # sent as it is: the API answers this item's 400
        yield reader.line_num, item


def batches(items: Iterator[tuple[int, dict]], size: int) -> Iterator[list[tuple[int, dict]]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def send(client: httpx.Client, items: list[dict]) -> tuple[list[dict], int]:
    """POST one batch until it is processed; its results and the retries it
    took. Retries the same batch on 429 (after Retry-After), 5xx and
    connection errors."""
    backoff = FIRST_BACKOFF
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            response = client.post(PATH, json={"items": items})
        except httpx.TransportError as exc:
            reason = f"{type(exc).__name__}"
            wait = backoff
        else:
            if response.status_code == 200:
                return response.json()["results"], attempt - 1
            if response.status_code == 429:
                reason, wait = "429", float(response.headers.get("Retry-After", backoff))
            elif response.status_code >= 500:
                reason, wait = str(response.status_code), backoff
            else:  # the batch itself is wrong (400, 401, 413, 415): no retry helps
                raise SystemExit(f"the batch was refused: {response.status_code} {response.text}")
        if attempt == MAX_ATTEMPTS:
            raise SystemExit(f"giving up after {attempt} attempts (last: {reason})")
        print(f"retrying a batch in {wait:.1f} s ({reason})", file=sys.stderr)
        time.sleep(wait)
        backoff = min(MAX_BACKOFF, backoff * 2)
    raise AssertionError("unreachable")


def run(
    path: str, url: str, key: str, batch_size: int, timeout: float, in_flight: int = 1
) -> Tally:
    tally = Tally()
    headers = {"Authorization": f"Bearer {key}"}
    with open(path, newline="", encoding="utf-8") as lines:
        with (
            httpx.Client(base_url=url, headers=headers, timeout=timeout) as client,
            ThreadPoolExecutor(in_flight) as pool,
        ):
            sent: deque[tuple[list[tuple[int, dict]], Future]] = deque()
            for chunk in batches(read_items(lines), batch_size):
                sent.append((chunk, pool.submit(send, client, [item for _, item in chunk])))
                if len(sent) >= in_flight:  # answers are tallied in the file's order
                    tally_batch(tally, *sent.popleft())
            while sent:
                tally_batch(tally, *sent.popleft())
    return tally


def tally_batch(tally: Tally, chunk: list[tuple[int, dict]], answered: Future) -> None:
    results, retries = answered.result()
    tally.retries += retries
    for (line, _), result in zip(chunk, results, strict=True):
        if result["status"] == 201:
            if result["replayed"]:
                tally.replayed += 1
            else:
                tally.created += 1
            continue
        tally.refused += 1
        error = result["error"]
        reason = error["code"]
        if error.get("errors"):
            reason += " " + json.dumps(error["errors"], sort_keys=True)
        tally.rejects.append((line, reason, error["detail"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stream a CSV of payments into paycron.")
    parser.add_argument("csv", help="the payments, one row each, with a header row")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="paycron's API")
    parser.add_argument("--key", required=True, help="an API key (its actor is the payer)")
    parser.add_argument("--batch-size", type=int, default=1000, help="items per request")
    parser.add_argument("--in-flight", type=int, default=1, help="batches sent at once")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--rejects", help="write refused rows here (CSV), not to stderr")
    args = parser.parse_args(argv)
    started = time.monotonic()
    tally = run(args.csv, args.url, args.key, args.batch_size, args.timeout, args.in_flight)
    seconds = time.monotonic() - started
    if tally.rejects:
        out = open(args.rejects, "w", newline="") if args.rejects else sys.stderr
        writer = csv.writer(out)
        writer.writerow(["line", "reason", "detail"])
        writer.writerows(tally.rejects)
        if args.rejects:
            out.close()
    total = tally.created + tally.replayed + tally.refused
    print(
        f"{total} rows in {seconds:.1f} s: {tally.created} created, {tally.replayed} "
        f"already there (replayed), {tally.refused} refused; {tally.retries} retries"
    )
    return 1 if tally.refused else 0


if __name__ == "__main__":
    sys.exit(main())
