"""The pool's check on checkout: no round trip for a connection checked a
moment ago whose socket is quiet, and still never a dead connection handed
out (a session the server ended is noticed on its socket)."""

from __future__ import annotations

import time

import psycopg_pool
import pytest

from paycron.store import db
from paycron.store.db import connect, make_pool


@pytest.fixture
def round_trips(monkeypatch):
    calls = []
    real = psycopg_pool.ConnectionPool.check_connection

    def counted(conn):
        calls.append(conn)
        return real(conn)

    monkeypatch.setattr(psycopg_pool.ConnectionPool, "check_connection", staticmethod(counted))
    return calls


def test_a_busy_connection_is_not_round_tripped_on_every_checkout(config, round_trips):
    with make_pool(config, max_size=1, name="check-test") as pool:
        for _ in range(20):
            with pool.connection() as conn:
                conn.execute("SELECT 1")
    assert len(round_trips) <= 2  # the first checkout, and one more if a second passed


def test_a_quiet_connection_is_round_tripped_again_after_a_while(config, round_trips, monkeypatch):
    monkeypatch.setattr(db, "CHECK_EVERY_SECONDS", 0.05)
    with make_pool(config, max_size=1, name="check-test") as pool:
        for _ in range(3):
            with pool.connection() as conn:
                conn.execute("SELECT 1")
            time.sleep(0.1)
    assert len(round_trips) == 3


def test_a_session_the_server_ended_is_never_handed_out(config):
    with make_pool(config, max_size=1, name="check-test") as pool:
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        with connect(config) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.2)  # the server's end of the connection arrives
        with pool.connection() as conn:  # within the second: only the socket is looked at
            assert conn.info.backend_pid != pid
            assert conn.execute("SELECT 1 AS one").fetchone()["one"] == 1
