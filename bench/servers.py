"""Private Postgres and Redis servers a harness may kill and restart.

Never the machine's shared servers: the soak restarts Postgres with an
``immediate`` shutdown and Redis losing everything in it. Postgres comes
from the system's binaries, run as the ``postgres`` OS user (``initdb``
refuses root); Redis from the system's ``redis-server``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import psycopg.sql
import redis

from devtools.procs import free_port


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PrivatePostgres:
    """One server of the system's binaries on a free port, data under /tmp.

    ``data``: an existing data directory (a standby's base backup) instead of
    a fresh ``initdb``. ``settings``: extra ``-c`` options at every start."""

    def __init__(
        self,
        *,
        data: Path | None = None,
        settings: dict[str, str] | None = None,
        checksums: bool = False,
    ):
        self.dir = data.parent if data else Path(tempfile.mkdtemp(prefix="paycron-pg-"))
        self.data = data or self.dir / "data"
        self.port = free_port()
        self.settings = settings or {}
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        if data is None:
            subprocess.run(
                _as_postgres(
                    [
                        _pg_bin("initdb"),
                        "-D",
                        str(self.data),
                        "-U",
                        "postgres",
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        *(["--data-checksums"] if checksums else []),
                    ]
                ),
                check=True,
                capture_output=True,
            )
        self.url = self.dsn("postgres")

    def dsn(self, dbname: str) -> str:
        """This server alone, database ``dbname``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=300 "
            f"-c unix_socket_directories={self.dir} -c shared_buffers=256MB"
        )
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        log = self.dir / "server.log"
        started = subprocess.run(
            _as_postgres(
                [
                    _pg_bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    options,
                    "-l",
                    str(log),
                    "-w",
                    "start",
                ]
            ),
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else started.stderr
            raise RuntimeError(f"Postgres in {self.data} did not start:\n{tail}")
        self.wait()

    def wait(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError("private Postgres did not come up")

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            _as_postgres([_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
            capture_output=True,
        )

    def restart_immediate(self) -> None:
        """Crash-stop (no checkpoint) and start again: recovery replays the WAL."""
        self.stop("immediate")
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, at once, as
        if its machine died (no shutdown, no last WAL sent, sockets reset)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(v) for v in victims) and time.monotonic() < deadline:
            time.sleep(0.02)
        # Dead, perhaps not yet reaped (its parent is whoever adopted it): a
        # zombie's pid in the lock file would stop the next start or pg_rewind.
        for lock in (self.data / "postmaster.pid", self.dir / f".s.PGSQL.{self.port}.lock"):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def alter_system(self, **settings: str) -> None:
        """``ALTER SYSTEM SET`` each setting and reload (the running server)."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            for name, value in settings.items():
                conn.execute(
                    psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        psycopg.sql.Identifier(name), psycopg.sql.Literal(value)
                    )
                )
            conn.execute("SELECT pg_reload_conf()")

    def is_primary(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                return not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        except psycopg.OperationalError:
            return False

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class ReplicatedPostgres:
    """A primary and one streaming standby (docs/operations.md), each a
    :class:`PrivatePostgres`. ``synchronous``: the primary names the standby
    in ``synchronous_standby_names`` with ``synchronous_commit=on``, so a
    commit returns only once the standby has flushed it; otherwise the
    standby trails asynchronously.

    :attr:`url` names both servers with ``target_session_attrs=read-write``
    (libpq tries them in order and keeps the one that accepts writes), the
    form ``DATABASE_URL`` takes in production. Settings that change at run
    time (``synchronous_standby_names``) live in ``postgresql.auto.conf``
    (``ALTER SYSTEM``), not on the command line, so a reload changes them.
    """

    STANDBY_NAME = "paycron_standby"

    def __init__(self, *, synchronous: bool = True, dbname: str = "paycron"):
        self.synchronous = synchronous
        self.dbname = dbname
        # Checksums let pg_rewind bring a killed primary back as a standby.
        self.primary = PrivatePostgres(checksums=True)
        # In the configuration file, not on the command line: pg_rewind's own
        # crash recovery of a killed primary must keep the WAL it needs too.
        with (self.primary.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in _REPLICATION.items())
        self.standby: PrivatePostgres | None = None
        self.killed: list[PrivatePostgres] = []

    def start(self) -> None:
        self.primary.start()
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(self.dbname))
            )
        self.standby = self._new_standby_of(self.primary)
        self.standby.start()
        self.primary.alter_system(
            synchronous_standby_names=self.STANDBY_NAME if self.synchronous else "",
            synchronous_commit="on",
        )
        self.wait_streaming()

    def _new_standby_of(self, source: PrivatePostgres) -> PrivatePostgres:
        standby_dir = Path(tempfile.mkdtemp(prefix="paycron-pg-standby-"))
        if os.geteuid() == 0:
            shutil.chown(standby_dir, "postgres", "postgres")
        data = standby_dir / "data"
        try:
            _run(
                [
                    _pg_bin("pg_basebackup"),
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(source.port),
                    "-U",
                    "postgres",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                ]
            )
        except BaseException:
            shutil.rmtree(standby_dir, ignore_errors=True)
            raise
        standby = PrivatePostgres(data=data)
        self._follow(standby, source)
        return standby

    def _follow(self, standby: PrivatePostgres, source: PrivatePostgres) -> None:
        """Make ``standby``'s data directory a standby of ``source``: its own
        ``synchronous_standby_names`` cleared (a promoted standby has no
        standby of its own until one joins), ``primary_conninfo`` with the
        name the primary waits for."""
        auto = standby.data / "postgresql.auto.conf"
        lines = [
            line
            for line in auto.read_text().splitlines()
            if not line.startswith(("primary_conninfo", "synchronous_standby_names"))
        ]
        lines += [
            f"primary_conninfo = 'host=127.0.0.1 port={source.port} user=postgres "
            f"application_name={self.STANDBY_NAME}'",
            "synchronous_standby_names = ''",
        ]
        _write_as_postgres(auto, "\n".join(lines) + "\n")
        _write_as_postgres(standby.data / "standby.signal", "")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{server.port}" for server in self.servers())
        return (
            f"postgresql://postgres@{hosts}/{self.dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def servers(self) -> list[PrivatePostgres]:
        """Every server the URL names: the killed primary stays in the list, as
        a dead host stays in an operator's DATABASE_URL."""
        return [self.primary, *([self.standby] if self.standby else []), *self.killed]

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary reports its standby streaming (and, when
        synchronous, as its synchronous standby)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.primary.url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication"
                    " WHERE application_name = %s AND state = 'streaming'",
                    (self.STANDBY_NAME,),
                ).fetchone()
            if row and row[0] == want:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the standby is not streaming ({want}) after {timeout}s")

    def kill_primary(self) -> None:
        """SIGKILL the primary. It is never started again as a primary: it
        stays down until :meth:`rejoin_killed` rewinds it into a standby."""
        self.primary.kill()
        self.killed.append(self.primary)

    def stall_sender(self) -> int:
        """SIGSTOP the primary's WAL sender: from now on nothing it writes
        reaches the standby, as with a slow link or a busy standby (a
        synchronous primary's commits wait; an asynchronous one's do not).
        The sender dies with the primary (:meth:`kill_primary`)."""
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_replication WHERE application_name = %s",
                (self.STANDBY_NAME,),
            ).fetchone()
        if row is None:
            raise RuntimeError("no WAL sender to stall")
        os.kill(row[0], signal.SIGSTOP)
        return row[0]

    def promote(self) -> float:
        """Promote the standby (``pg_ctl promote``); it becomes the primary, with
        no synchronous standby until one joins. Seconds the promotion took."""
        assert self.standby is not None
        started = time.monotonic()
        _run([_pg_bin("pg_ctl"), "-D", str(self.standby.data), "-w", "promote"])
        self.primary, self.standby = self.standby, None
        while not self.primary.is_primary():
            time.sleep(0.05)
        return time.monotonic() - started

    def rejoin_killed(self) -> None:
        """Rewind the killed primary onto the new primary's timeline
        (``pg_rewind``) and start it as the new synchronous standby."""
        old = self.killed[-1]  # still listed (and destroyed) if this fails
        # A promoted server records its new timeline in its control file only
        # at its next checkpoint; until then pg_rewind sees one timeline and
        # decides there is nothing to rewind.
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        _run(
            [
                _pg_bin("pg_rewind"),
                "-D",
                str(old.data),
                f"--source-server=host=127.0.0.1 port={self.primary.port} user=postgres"
                " dbname=postgres",
            ]
        )
        self._follow(old, self.primary)
        old.start()
        self.standby = self.killed.pop()
        self.primary.alter_system(
            synchronous_standby_names=self.STANDBY_NAME if self.synchronous else ""
        )
        self.wait_streaming()

    def stop_standby(self) -> None:
        """The standby dies (SIGKILL) while the primary lives: with synchronous
        replication, every commit now waits for it."""
        assert self.standby is not None
        self.standby.kill()

    def start_standby(self) -> None:
        assert self.standby is not None
        self.standby.start()
        self.wait_streaming()

    def destroy(self) -> None:
        for server in self.servers():
            server.destroy()


#: Every server of a pair: streaming replication, and hot standby reads
#: (the harness reads a standby to see what it holds).
_REPLICATION = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "wal_keep_size": "256MB",
    "wal_log_hints": "on",
}


def _run(args: list[str]) -> None:
    """One of the system's PostgreSQL tools as the ``postgres`` user; its
    standard error in the exception if it fails."""
    done = subprocess.run(_as_postgres(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"{Path(args[0]).name} failed ({done.returncode}):\n"
            f"{done.stdout[-1500:]}{done.stderr[-3000:]}"
        )


def _write_as_postgres(path: Path, text: str) -> None:
    path.write_text(text)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


class PrivateRedis:
    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private Redis did not come up")

    def restart_empty(self) -> None:
        """Kill it (nothing is persisted) and start a fresh, empty one."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.start()

    def destroy(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
