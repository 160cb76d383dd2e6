"""gunicorn's settings for the web process (``--config python:web.gunicorn_conf``).

Before gunicorn forks a worker, its master reads the settings and reaches
Postgres and Redis: a wrong setting or a server that does not answer ends
``web`` with one line naming the setting and exit status 2 (without this,
every worker would fail to boot with a traceback, one after another).
Pending migrations do not stop it: ``/readyz`` answers 503 until they are
applied, and says to run ``paycron migrate``."""

from __future__ import annotations

import gc
import logging

from paycron.config import Config
from paycron.observability.sentry import init_sentry
from paycron.observability.startup import one_line_errors, preflight, schema_pending
from paycron.store.migrate import describe_pending


def on_starting(server) -> None:
    with one_line_errors("web"):
        config = Config.from_env()
        init_sentry(config, component="web")
        preflight(config)
        pending = schema_pending(config)
    if pending:
        logging.getLogger("gunicorn.error").warning(
            "%s; /readyz answers 503 until then", describe_pending(pending)
        )


def post_worker_init(worker) -> None:
    """The worker has loaded the app: what exists now (modules, schemas, the
    OpenAPI document) lives as long as the worker, so the cyclic collector
    stops walking it. Every full collection walked all of it again: a fifth
    of a batch create's CPU (docs/batch.md)."""
    gc.freeze()
