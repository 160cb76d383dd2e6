"""The floors for bench.api_saturation: bare Flask apps under the same
gunicorn settings as paycron's API, with no authentication, validation,
idempotency lookup or metrics.

- ``create_app()``: the create endpoint parses a JSON body and answers 201;
  no database. What Flask and gunicorn cost by themselves.
- ``create_app(insert=True)``: the same, plus paycron's create statement (the
  idempotency row, the payment and its created event in one durable
  transaction) through a psycopg pool. What the write costs by itself: the
  gap between it and paycron is paycron's own request handling. Its wait
  for Postgres blocks the whole gevent worker (psycopg's C wait, chosen when
  gunicorn's master imported psycopg before the worker patched ``select``):
  no other request of that worker runs meanwhile.
- ``create_app(insert=True, cooperative=True)``: the same statement waited
  for as paycron's API must (``paycron.store.db`` makes psycopg wait through
  gevent's ``select``, so a create waiting on a row lock stalls only itself).

    gunicorn ... 'bench.bare_app:create_app()'
    gunicorn ... 'bench.bare_app:create_app(insert=True)'   # needs DATABASE_URL
    gunicorn ... 'bench.bare_app:create_app(insert=True, cooperative=True)'
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import datetime

from flask import Flask, jsonify, request


def create_app(insert: bool = False, cooperative: bool = False) -> Flask:
    app = Flask(__name__)
    write = _insert_statement(cooperative) if insert else None

    @app.post("/v1/scheduled-payments")
    def create():
        body = request.get_json()
        payment = {"id": str(uuid.uuid4()), "status": "PENDING", **body}
        if write is not None:
            write(payment, request.headers["Idempotency-Key"], request.get_data())
        response = jsonify(payment)
        response.status_code = 201
        return response

    @app.get("/healthz")
    def healthz():
        return jsonify({"status": "ok"})

    return app


def _insert_statement(cooperative: bool):
    from psycopg_pool import ConnectionPool

    from paycron.sql import q
    from paycron.store.db import cooperate_with_gevent

    if cooperative:
        cooperate_with_gevent()

    pool = ConnectionPool(
        os.environ["DATABASE_URL"], min_size=1, max_size=10, kwargs={"autocommit": True}, open=True
    )
    statement = q("create_payment")

    def write(payment: dict, key: str, raw_body: bytes) -> None:
        due_at = datetime.fromisoformat(payment["dueAt"])
        with pool.connection() as conn:
            conn.execute(
                statement,
                {
                    "actor": "bench-bare",
                    "key": key,
                    "request_hash": hashlib.sha256(raw_body).digest(),
                    "id": payment["id"],
                    "due_at": due_at,
                    "payee": payment["payee"],
                    "amount_minor": payment["amount"],
                    "currency": "USD",
                    "run_at": due_at,
                    "payment_method": None,
                    "customer": None,
                    "processor": "fake",
                },
            ).fetchone()

    return write
