"""web.gunicorn_conf: a worker that has loaded the app freezes what it
holds, so the cyclic collector stops walking the app's long-lived objects
on every full collection (a fifth of a batch create's CPU)."""

from __future__ import annotations

import gc

from web import gunicorn_conf


def test_a_loaded_worker_freezes_its_objects():
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        gunicorn_conf.post_worker_init(worker=None)
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
