"""Fixtures: one fresh Postgres database per test run (migrated once), a
private Redis key namespace per run (never FLUSHALL: the server is shared),
the Flask app, API keys and row factories."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import redis as redis_lib
from werkzeug.serving import make_server

from devtools.fake_gateway import GatewayHandle
from devtools.procs import ProcessGroup, free_port, gateway_args, wait_http
from paycron.config import Config
from paycron.store import apikeys, partitions
from paycron.store.db import connect
from paycron.store.migrate import MIGRATIONS_DIR, migrate, migration_files
from web import close_app

ADMIN_DSN = os.environ.get(
    "PAYCRON_TEST_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TEST_REDIS_URL = os.environ.get("PAYCRON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RUN_ID = uuid.uuid4().hex[:10]

#: Every process a test starts inherits this (from os.environ), so the run can
#: find any that outlived it, in whatever session or process group it put itself.
RUN_MARK = f"PAYCRON_TEST_RUN={RUN_ID}"
os.environ["PAYCRON_TEST_RUN"] = RUN_ID

#: Tables emptied between tests (cheap DELETEs: the partitions stay).
_TABLES = (
    "payments",
    "attempts",
    "payment_events",
    "dead_letters",
    "idempotency_keys",
    "api_keys",
    "refunds",
    "webhook_replays",
    "webhook_deliveries",
    "webhook_endpoints",
    "reconciliation_items",
    "reconciliation_runs",
    "gateway_events",
    "customers",
    "history_minutes",
)


def _marked_processes() -> list[int]:
    """Live processes, other than this one, started by this test run."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if RUN_MARK.encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_run():
    """Set up first, so torn down last: once every fixture has stopped what
    it started, no process of this run may be left. Any left is killed, by
    its id, and the run fails saying which."""
    yield
    deadline = time.monotonic() + 10
    while (left := _marked_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for pid in left:
        with contextlib.suppress(OSError):
            described.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}"[:200])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "processes outlived the test run:\n" + "\n".join(described)


def dsn_for(dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=dbname)


def create_database(name: str) -> str:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return dsn_for(name)


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: Held (on the admin database) while a template is looked for, built or copied.
TEMPLATE_LOCK_KEY = 0x70637470  # "pctp"


def template_name(today: date) -> str:
    """Today's template: the migrations and the day partitions this code
    makes, so a change to either makes a new one."""
    digest = hashlib.sha256()
    for path in [*migration_files(), MIGRATIONS_DIR.parent / "sql" / "admin.sql"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    config = Config()
    digest.update(f"{config.horizon_days} {config.partition_margin_days}".encode())
    return f"paycron_template_{today:%Y%m%d}_{digest.hexdigest()[:12]}"


def create_migrated_database(name: str) -> str:
    """Database ``name``, migrated, with its day partitions: a copy of
    today's template, which the first test process to need it builds
    (375 partitions are seconds of DDL; a copy is under one). Templates of
    earlier days are dropped then."""
    today = datetime.now(UTC).date()
    template = template_name(today)
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            if not admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (template,)
            ).fetchone():
                _build_template(admin, template)
                _drop_templates_before(admin, today)
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))
    return dsn_for(name)


def _build_template(admin, template: str) -> None:
    """Built under another name, renamed when whole: a run that dies while
    building leaves no template, only the other name, dropped next time."""
    building = f"{template}_building"
    admin.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
    config = Config(database_url=create_database(building))
    with connect(config) as conn:
        migrate(conn)
        partitions.ensure_partitions(conn, config)
    # No connections: nothing (autovacuum included) is in it when it is copied.
    admin.execute(f'ALTER DATABASE "{building}" RENAME TO "{template}"')
    admin.execute(f'ALTER DATABASE "{template}" WITH ALLOW_CONNECTIONS false')


def _drop_templates_before(admin, today: date) -> None:
    rows = admin.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE 'paycron\\_template\\_%%'"
        " AND substring(datname from 18 for 8) < %s",
        (f"{today:%Y%m%d}",),
    ).fetchall()
    for (name,) in rows:
        with contextlib.suppress(psycopg.Error):  # being copied: next time
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(scope="session")
def database_url():
    name = f"paycron_test_{RUN_ID}"
    yield create_migrated_database(name)
    drop_database(name)


@pytest.fixture(scope="session")
def redis_url():
    client = redis_lib.Redis.from_url(TEST_REDIS_URL)
    client.ping()
    yield TEST_REDIS_URL
    # Remove only this run's keys.
    for key in client.scan_iter(match=f"paycron-test-{RUN_ID}*", count=1000):
        client.delete(key)


@pytest.fixture(scope="session")
def gateway_server(tmp_path_factory):
    port = free_port()
    group = ProcessGroup(tmp_path_factory.mktemp("gateway"))
    proc = group.start("gateway", [*gateway_args(port), "--seed", "7"])
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", proc)
    yield url
    group.stop()


@pytest.fixture
def stripe_config(config, gateway):
    """The engine configured for Stripe, on the fake gateway's Stripe surface
    (its default secret key and webhook signing secret)."""
    from devtools.fake_gateway import STRIPE_API_KEY, STRIPE_WEBHOOK_SECRET

    return config.with_overrides(
        gateway="stripe",
        stripe_api_key=STRIPE_API_KEY,
        stripe_api_base=gateway.stripe_url,
        stripe_webhook_secret=(STRIPE_WEBHOOK_SECRET,),
    )


@pytest.fixture
def gateway(gateway_server):
    """The shared fake gateway, reset: no faults, an empty ledger."""
    handle = GatewayHandle(gateway_server)
    handle.reset()
    yield handle
    handle.close()


@pytest.fixture
def executor_kind() -> str:
    """The executor a test runs (a test parametrizes it over
    tests.aio_support.EXECUTORS to run against both)."""
    return "threads"


@pytest.fixture
def engine(config, gateway, executor_kind):
    """Sweeper, executor and reaper in-process against the real gateway."""
    from tests.inprocess import Engine

    eng = Engine(config, executor_kind=executor_kind)
    yield eng
    eng.close()


@pytest.fixture
def redis_client(redis_url):
    return redis_lib.Redis.from_url(redis_url)


@pytest.fixture
def config(database_url, redis_url, request) -> Config:
    """Test settings: short delays, and Redis keys private to this test."""
    namespace = f"paycron-test-{RUN_ID}-{uuid.uuid4().hex[:8]}"
    gateway_url = "http://127.0.0.1:9"  # nothing listens: tests that call use `gateway`
    if "gateway" in request.fixturenames:
        gateway_url = request.getfixturevalue("gateway").url
    return Config(
        database_url=database_url,
        redis_url=redis_url,
        redis_namespace=namespace,
        gateway_url=gateway_url,
        gateway_timeout_seconds=2,
        lease_seconds=30,
        retry_delays=(0.0, 0.0, 0.0, 0.0, 0.0),
        circuit_min_calls=1000,
        webhook_allow_private_hosts=True,  # the test receivers are on loopback
        # No test but tests/limits/test_rate_limits.py should ever meet the limiter.
        api_rate_limit=1_000_000,
        api_rate_burst=1_000_000,
    )


@pytest.fixture
def conn(database_url):
    with connect(Config(database_url=database_url)) as connection:
        yield connection


@pytest.fixture(scope="session")
def _cleaner(database_url):
    # One warm connection: a cold one pays ~250 ms to open 375 partitions.
    with connect(Config(database_url=database_url)) as connection:
        yield connection


def _existing_tables(conn) -> list[str]:
    rows = conn.execute(
        "SELECT t FROM unnest(%s::text[]) t WHERE to_regclass(t) IS NOT NULL", (list(_TABLES),)
    ).fetchall()
    return [r["t"] for r in rows]


@pytest.fixture(autouse=True)
def _clean(request):
    cleaner = (
        request.getfixturevalue("_cleaner") if "database_url" in request.fixturenames else None
    )
    yield
    if cleaner is not None:
        for table in _existing_tables(cleaner):
            cleaner.execute(f"DELETE FROM {table}")


@pytest.fixture
def app(config):
    from web import create_app

    application = create_app(config)
    yield application
    close_app(application)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def make_key(conn):
    def make(actor: str, admin: bool = False) -> str:
        key, _ = apikeys.create_api_key(conn, actor, admin=admin)
        return key

    return make


@pytest.fixture
def alice(make_key) -> dict:
    return {"Authorization": f"Bearer {make_key('alice')}"}


@pytest.fixture
def bob(make_key) -> dict:
    return {"Authorization": f"Bearer {make_key('bob')}"}


@pytest.fixture
def live_server(app):
    """The app on a real threaded HTTP server, for concurrency tests."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def scripted():
    """A gateway the test scripts (tests.support.ScriptedProcessor)."""
    from tests.support import ScriptedProcessor

    with contextlib.closing(ScriptedProcessor()) as gateway:
        yield gateway


@pytest.fixture
def sentry(config):
    """Sentry initialised as a process would be, sending to a transport
    that keeps every envelope (tests.support.CapturingTransport)."""
    import sentry_sdk

    from paycron.observability.sentry import init_sentry
    from tests.support import CapturingTransport

    transport = CapturingTransport()
    assert init_sentry(
        config.with_overrides(sentry_dsn="https://key@sentry.invalid/1"),
        component="worker",
        transport=transport,
    )
    yield transport
    sentry_sdk.get_client().close()
    sentry_sdk.init(dsn=None)


def future(seconds: float = 3600) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def iso(when: datetime) -> str:
    return when.isoformat()


#: Test folders whose tests start processes (servers, workers, a browser) or
#: run harnesses: the slow lane. Everything else is the fast lane.
SLOW_FOLDERS = ("processes",)

#: ./dev test runs the slow lane in two processes (pytest-xdist, ``--dist
#: loadgroup``): each test is a unit of work on its own, except that the
#: tests of one group run one after another, in one process. A group is named
#: here, by node id (a file's, or one test's), not by xdist_group marks: xdist
#: passes those on by rewriting node ids, which pytest 9.2 no longer reads.
SLOW_LANE_GROUPS = {
    # Each drives the whole system hard for half a minute or more (the
    # soaks, the failover, the benchmarks that saturate the API, ./dev up's
    # whole Procfile from a fresh clone): two at once would compete for the
    # CPU, on a machine with two.
    "tests/processes/test_first_hour.py": "whole system",
    "tests/processes/test_soak_short.py": "whole system",
    "tests/processes/test_failover_short.py": "whole system",
    "tests/processes/test_batch_bench.py": "whole system",
    "tests/processes/test_bench_smoke.py::test_bench_smoke[api_saturation]": "whole system",
    "tests/processes/test_bench_smoke.py::test_bench_smoke[slowloris]": "whole system",
    # A module-scoped browser or cluster, started once (and one at a time).
    "tests/processes/test_console_browser.py": "browser",
    "tests/processes/test_console_bulk_browser.py": "browser",
    "tests/processes/test_patroni.py": "patroni",
}


def slow_lane_unit(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: its group, or itself."""
    for prefix, group in SLOW_LANE_GROUPS.items():
        if nodeid == prefix or nodeid.startswith(f"{prefix}::"):
            return group
    return nodeid


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups of SLOW_LANE_GROUPS."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlowLaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return slow_lane_unit(nodeid)

    return SlowLaneScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parent
    for item in items:
        folder = item.path.resolve().relative_to(root).parts[0]
        if folder in SLOW_FOLDERS or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def audit_lines():
    """Every line written to the audit log (``paycron.audit``) while the
    test runs, parsed: a list that fills as the test goes."""
    import json
    import logging

    lines: list[dict] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(json.loads(record.getMessage()))

    logger = logging.getLogger("paycron.audit")
    handler = Keep(level=logging.INFO)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
