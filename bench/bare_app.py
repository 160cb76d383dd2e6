"""The floors for bench.api_saturation: bare Flask apps under the same
gunicorn settings as paycron's API, with no authentication, validation,
idempotency lookup or metrics.

- ``create_app()``: the create endpoint parses a JSON body and answers 201;
  no database. What Flask and gunicorn cost by themselves.
- ``create_app(insert=True)``: the same, plus paycron's create statement (the
  idempotency row, the payment and its created event in one durable
  transaction) through a psycopg pool. What the write costs by itself: the
  gap between it and paycron is paycron's own request handling.

    gunicorn ... 'bench.bare_app:create_app()'
    gunicorn ... 'bench.bare_app:create_app(insert=True)'   # needs DATABASE_URL
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import datetime

from flask import Flask, jsonify, request


def create_app(insert: bool = False) -> Flask:
    app = Flask(__name__)
    write = _insert_statement() if insert else None

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


def _insert_statement():
    from psycopg_pool import ConnectionPool

    from paycron.sql import q

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
