"""A PostgreSQL cluster under Patroni with etcd, all on 127.0.0.1, for the
failover benchmark (``python -m bench.failover --patroni``) and its tests.

- :class:`Etcd`: a three-member etcd cluster (each member a few MB; three
  fit on this machine easily), so losing one keeps a quorum.
- :class:`Relay`: a TCP relay per Patroni member in front of each etcd
  member. Cutting a member's relays partitions that member (its agent)
  from the consensus store while everything else still reaches it: the
  network fault Patroni's leader lease is made for, on loopback only.
- :class:`PatroniCluster`: two or three PostgreSQL members, each run by its
  own Patroni agent (the system's ``patroni`` and PostgreSQL binaries, as
  the ``postgres`` user), ``synchronous_mode: true`` (and, as an option,
  ``synchronous_mode_strict``), ``use_pg_rewind`` so a deposed leader comes
  back as a replica on its own.

Nothing here promotes, rewinds or reconfigures a server itself: that is
Patroni's job, and what the benchmark measures.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psycopg
import psycopg.sql
import yaml

from devtools.procs import free_port

SCOPE = "paycron-bench"
#: Lines of each member's logs a failure to start quotes.
LOG_TAIL = 20


@dataclass(frozen=True)
class Timing:
    """Patroni's three clocks (its ``bootstrap.dcs`` settings).

    ``ttl``: the leader key's lease; a leader that cannot renew it for this
    long loses it, and a replica may take over. ``loop_wait``: seconds
    between the agents' loops. ``retry_timeout``: how long a DCS or
    PostgreSQL operation is retried before the leader demotes itself."""

    ttl: int = 30
    loop_wait: int = 10
    retry_timeout: int = 10

    @property
    def name(self) -> str:
        return f"ttl={self.ttl} loop_wait={self.loop_wait} retry_timeout={self.retry_timeout}"


#: Patroni's own defaults.
DEFAULT = Timing(30, 10, 10)
#: A tuned set: the smallest Patroni accepts with room (ttl must exceed
#: loop_wait + 2 * retry_timeout; Patroni warns below that).
TUNED = Timing(10, 2, 3)


def _pg_bin_dir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not found:
        raise RuntimeError("PostgreSQL's binaries are not installed")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# -- etcd ---------------------------------------------------------------------------------


def cluster_version_decided(version: dict) -> bool:
    """Whether etcd's ``/version`` answer shows the cluster running at its
    servers' own minor version (not the 3.0.0 a new cluster starts at)."""
    server, cluster = version.get("etcdserver", ""), version.get("etcdcluster", "")
    return cluster.split(".")[:2] == server.split(".")[:2] != [""]


class Etcd:
    """``members`` etcd servers forming one cluster on loopback ports."""

    def __init__(self, workdir: Path, members: int = 3):
        self.workdir = workdir
        self.names = [f"etcd{n}" for n in range(members)]
        self.client_ports = {name: free_port() for name in self.names}
        self.peer_ports = {name: free_port() for name in self.names}
        self.procs: dict[str, subprocess.Popen] = {}

    def _args(self, name: str) -> list[str]:
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer_ports[n]}" for n in self.names)
        client = f"http://127.0.0.1:{self.client_ports[name]}"
        peer = f"http://127.0.0.1:{self.peer_ports[name]}"
        return [
            "etcd",
            "--name", name,
            "--data-dir", str(self.workdir / name),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", cluster,
            "--initial-cluster-token", SCOPE,
            "--initial-cluster-state", "new",
            # Loopback: a 100 ms heartbeat and a 1 s election are generous.
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip

    def start(self) -> None:
        for name in self.names:
            self._start(name)
        self.wait_healthy()

    def _start(self, name: str) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            self._args(name), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.healthy(name) for name in self.procs):
                return
            time.sleep(0.2)
        raise RuntimeError(f"etcd did not become healthy (logs in {self.workdir})")

    def healthy(self, name: str) -> bool:
        """Healthy, and the cluster version decided: a new cluster reports
        3.0.0 until its members agree on their own version, and Patroni,
        which reads ``/version`` once, would then keep talking ``/v3alpha``
        to a server that answers it 404 for ever."""
        base = f"http://127.0.0.1:{self.client_ports[name]}"
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as answer:
                if json.load(answer).get("health") != "true":
                    return False
            with urllib.request.urlopen(f"{base}/version", timeout=1) as answer:
                version = json.load(answer)
        except (OSError, ValueError):
            return False
        return cluster_version_decided(version)

    def stop(self) -> None:
        for proc in self.procs.values():
            _kill_group(proc)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()


# -- a relay that can be cut ---------------------------------------------------------------


class Relay:
    """Forwards TCP from a loopback port to ``target``; :meth:`cut` resets
    every connection and refuses new ones (a partition), :meth:`mend` lets
    them through again."""

    def __init__(self, target: int):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = threading.Event()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.cut_off.is_set():
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                _reset(client)
                continue
            with self.lock:
                self.pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        try:
            while not self.stopped.is_set() and not self.cut_off.is_set():
                for key, _ in selector.select(timeout=0.2):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            pass
        finally:
            selector.close()
            _reset(a)
            _reset(b)
            with self.lock, contextlib.suppress(ValueError):
                self.pairs.remove((a, b))

    def cut(self) -> None:
        self.cut_off.set()
        with self.lock:
            pairs = list(self.pairs)
        for a, b in pairs:
            _reset(a)
            _reset(b)

    def mend(self) -> None:
        self.cut_off.clear()

    def close(self) -> None:
        self.stopped.set()
        self.cut()
        self.listener.close()


def _reset(sock: socket.socket) -> None:
    """Close with a RST, as a partition that drops the link would look."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.close()


# -- Patroni members ----------------------------------------------------------------------


class Member:
    """One PostgreSQL server and the Patroni agent that runs it."""

    def __init__(self, cluster: PatroniCluster, name: str):
        self.cluster, self.name = cluster, name
        self.dir = cluster.workdir / name
        self.dir.mkdir()
        _chown(self.dir)
        self.data = self.dir / "data"
        self.port = free_port()
        self.api_port = free_port()
        self.relays = [Relay(port) for port in cluster.etcd.client_ports.values()]
        self.agent: subprocess.Popen | None = None
        self.config = self.dir / "patroni.yml"
        self._write_config()

    def _write_config(self) -> None:
        timing = self.cluster.timing
        settings = {
            "scope": SCOPE,
            "name": self.name,
            "log": {"level": "INFO", "dir": str(self.dir), "file_num": 2},
            "restapi": {
                "listen": f"127.0.0.1:{self.api_port}",
                "connect_address": f"127.0.0.1:{self.api_port}",
            },
            # use_proxies: talk to these addresses only, never to the members
            # etcd advertises (the relays are what a partition cuts).
            "etcd3": {
                "hosts": [f"127.0.0.1:{relay.port}" for relay in self.relays],
                "use_proxies": True,
            },
            "bootstrap": {
                "dcs": {
                    "ttl": timing.ttl,
                    "loop_wait": timing.loop_wait,
                    "retry_timeout": timing.retry_timeout,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": self.cluster.synchronous,
                    "synchronous_mode_strict": self.cluster.strict,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 300,
                            "shared_buffers": "256MB",
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "256MB",
                            "wal_log_hints": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "data-checksums"],
                "pg_hba": [
                    "local all all trust",
                    "host replication postgres 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data),
                "bin_dir": _pg_bin_dir(),
                "pgpass": str(self.dir / "pgpass"),
                # A replica's base backup starts at once (the default waits
                # for a spread checkpoint: minutes on an idle primary).
                "basebackup": [{"checkpoint": "fast"}],
                "authentication": {
                    "replication": {"username": "postgres", "password": "unused"},
                    "superuser": {"username": "postgres", "password": "unused"},
                    "rewind": {"username": "postgres", "password": "unused"},
                },
                "parameters": {"unix_socket_directories": str(self.dir)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }
        self.config.write_text(yaml.safe_dump(settings))
        _chown(self.config)

    # the agent
    def start_agent(self) -> None:
        log = (self.dir / "agent.out").open("ab")
        self.agent = subprocess.Popen(
            _as_postgres(["patroni", str(self.config)]),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill_agent(self) -> None:
        """SIGKILL the Patroni agent alone: its PostgreSQL runs on, unmanaged
        (a crashed agent, as no watchdog is configured here)."""
        assert self.agent is not None
        for pid in _descendants_named(self.agent.pid, "patroni"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.agent.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.agent.wait(timeout=10)

    # the server
    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill_postmaster(self) -> None:
        """SIGKILL the postmaster and its backends; the agent lives on."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        for victim in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)

    def partition(self) -> None:
        """Cut this member's agent off from every etcd member."""
        for relay in self.relays:
            relay.cut()

    def heal(self) -> None:
        for relay in self.relays:
            relay.mend()

    @property
    def url(self) -> str:
        return self.dsn("postgres")

    def dsn(self, dbname: str) -> str:
        """This member alone, database ``dbname``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def role(self) -> str | None:
        """What the agent's REST API says this member is, or None."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.api_port}/patroni", timeout=1
            ) as answer:
                return json.load(answer).get("role")
        except (OSError, ValueError):
            return None

    def accepts_writes(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=1, autocommit=True) as conn:
                return not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        for relay in self.relays:
            relay.close()
        if self.agent is not None:
            _kill_group(self.agent, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.agent.wait(timeout=15)
            _kill_group(self.agent)
        self.kill_postmaster()


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _descendants_named(pid: int, word: str) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        children = _children(frontier.pop())
        frontier += children
        for child in children:
            with contextlib.suppress(OSError):
                if word in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(child)
    return found


class PatroniCluster:
    """etcd and ``members`` PostgreSQL members under Patroni."""

    def __init__(
        self, *, members: int = 2, timing: Timing = DEFAULT, strict: bool = False,
        synchronous: bool = True, dbname: str = "paycron",
    ):  # fmt: skip
        self.workdir = Path(tempfile.mkdtemp(prefix="paycron-patroni-"))
        _chown(self.workdir)
        self.timing, self.strict, self.dbname = timing, strict, dbname
        self.synchronous = synchronous
        self.etcd = Etcd(self.workdir / "etcd")
        (self.workdir / "etcd").mkdir()
        self.members = [Member(self, f"pg{n}") for n in range(members)]

    @property
    def url(self) -> str:
        """Every member, ``target_session_attrs=read-write``: the engine's
        ``DATABASE_URL``."""
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        return (
            f"postgresql://postgres@{hosts}/{self.dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def start(self, timeout: float = 120) -> None:
        self.etcd.start()
        # The first agent bootstraps the cluster; the others clone it.
        self.members[0].start_agent()
        self.wait_leader(timeout)
        for member in self.members[1:]:
            member.start_agent()
        with psycopg.connect(self.leader().url, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(self.dbname))
            )
        self.wait_synchronous(timeout)

    def leader(self) -> Member:
        for member in self.members:
            if member.role() in ("master", "primary") and member.accepts_writes():
                return member
        raise LookupError("no leader")

    def wait_leader(self, timeout: float = 120, *, not_: Member | None = None) -> Member:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(LookupError):
                leader = self.leader()
                if leader is not not_:
                    return leader
            time.sleep(0.1)
        raise self._failed(f"no leader after {timeout} s")

    def synchronous_standby(self) -> str | None:
        """The member the leader's commits wait for, per the DCS."""
        for member in self.members:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{member.api_port}/cluster", timeout=1
                ) as answer:
                    for listed in json.load(answer).get("members", []):
                        if listed.get("role") == "sync_standby":
                            return listed["name"]
                    return None
        return None

    def wait_synchronous(self, timeout: float = 120) -> str | None:
        if not self.synchronous:
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.synchronous_standby()
            if name is not None:
                return name
            time.sleep(0.2)
        raise self._failed(f"no synchronous standby after {timeout} s")

    def _failed(self, what: str) -> RuntimeError:
        """``what``, with the end of each member's logs: the work directory
        goes when the cluster is destroyed, before anyone reads it."""
        tails = []
        for member in self.members:
            for name in ("agent.out", "patroni.log"):
                with contextlib.suppress(OSError):
                    lines = (member.dir / name).read_text(errors="replace").splitlines()
                    tails.append(f"-- {member.name}/{name}:\n" + "\n".join(lines[-LOG_TAIL:]))
        return RuntimeError("\n".join([f"{what} (logs in {self.workdir})", *tails]))

    def stop(self) -> None:
        for member in self.members:
            member.stop()
        self.etcd.stop()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def main() -> None:
    """Start a cluster and print its URL and roles; then wait for Ctrl-C
    (``--smoke``: stop at once)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--smoke", action="store_true", help="start, report, stop")
    parser.add_argument("--members", type=int, default=2)
    args = parser.parse_args()
    cluster = PatroniCluster(members=args.members, timing=TUNED)
    try:
        started = time.monotonic()
        cluster.start()
        print(f"up in {time.monotonic() - started:.1f} s: {cluster.url}")
        print(f"leader {cluster.leader().name}, sync standby {cluster.synchronous_standby()}")
        if not args.smoke:
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
    finally:
        cluster.destroy()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally clause runs
    main()
