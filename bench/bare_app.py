"""The floor for bench.api_saturation: a bare Flask app under the same
gunicorn settings whose create endpoint parses a JSON body and answers 201,
with no authentication, validation or database.

    gunicorn ... 'bench.bare_app:create_app()'
"""

from __future__ import annotations

import uuid

from flask import Flask, jsonify, request


def create_app() -> Flask:
    app = Flask(__name__)

    @app.post("/v1/scheduled-payments")
    def create():
        body = request.get_json()
        response = jsonify({"id": str(uuid.uuid4()), "status": "PENDING", **body})
        response.status_code = 201
        return response

    @app.get("/healthz")
    def healthz():
        return jsonify({"status": "ok"})

    return app
