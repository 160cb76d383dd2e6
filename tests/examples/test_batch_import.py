"""examples/batch_import.py against a live server: a CSV streamed in
batches, retried through 429s and a lost answer without a payment twice,
refused rows reported, and a second run that creates nothing."""

from __future__ import annotations

import csv
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from web import close_app

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "batch_import.py"
BATCH = "/v1/scheduled-payments/batch"


class LosesOneAnswer:
    """The app, except that the second batch it processes has its answer
    replaced by a 503, as when a connection drops after the commit."""

    def __init__(self, app):
        self.app, self.processed, self.lost = app, 0, 0

    def __call__(self, environ, start_response):
        if environ["PATH_INFO"] != BATCH:
            return self.app(environ, start_response)
        status = []
        body = b"".join(self.app(environ, lambda s, h, *a: status.append((s, h))))
        if status[0][0].startswith("200"):
            self.processed += 1
            if self.processed == 2:
                self.lost += 1
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"the answer was lost"]
        start_response(*status[0])
        return [body]


@pytest.fixture
def serve():
    servers = []

    def start(app) -> str:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()


def write_csv(path: Path, rows: int) -> None:
    due = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0).isoformat()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["idempotency_key", "payee", "amount", "due_at", "currency"])
        for n in range(rows):
            writer.writerow([f"sub-{n}-2027-01", f"subscriber-{n}", 990 + n % 7, due, ""])
        writer.writerow(["bad-amount", "someone", "12.5", due, ""])  # line rows + 2
        writer.writerow(["bad-due", "someone", "100", "2001-01-01T00:00:00Z", "EUR"])


def run(url: str, key: str, csv_path: Path, rejects: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(csv_path), "--url", url, "--key", key]
        + ["--batch-size", "200", "--in-flight", "2", "--rejects", str(rejects)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def count(conn, table) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def test_a_csv_is_imported_once_through_429s_and_a_lost_answer(
    config, make_key, conn, serve, tmp_path
):
    from web import create_app

    # 200 items a batch, 100 tokens a second: every batch after the first waits ~2 s.
    limited = create_app(
        config.with_overrides(api_rate_limit=100, api_rate_burst=200, batch_max_items=200)
    )
    unlimited = create_app(config)
    key = make_key("billing")
    csv_path, rejects = tmp_path / "payments.csv", tmp_path / "rejects.csv"
    write_csv(csv_path, 600)
    try:
        flaky = LosesOneAnswer(limited)
        first = run(serve(flaky), key, csv_path, rejects)
        assert first.returncode == 1, first.stderr  # two rows were refused
        # the batch whose answer was lost was written: its retry replays it
        assert "602 rows" in first.stdout
        assert "400 created, 200 already there (replayed), 2 refused" in first.stdout
        assert flaky.lost == 1 and "(503)" in first.stderr and "(429)" in first.stderr
        assert count(conn, "payments") == count(conn, "idempotency_keys") == 600
        with rejects.open() as f:
            refused = list(csv.DictReader(f))
        assert [(r["line"], r["reason"].split()[0]) for r in refused] == [
            ("602", "VALIDATION_FAILED"),
            ("603", "VALIDATION_FAILED"),
        ]
        assert "amount" in refused[0]["reason"] and "dueAt" in refused[1]["reason"]

        again = run(serve(unlimited), key, csv_path, rejects)
        assert "0 created, 600 already there (replayed), 2 refused; 0 retries" in again.stdout
        assert count(conn, "payments") == 600
    finally:
        for app in (limited, unlimited):
            close_app(app)
