"""Reading a request's body: whole, bounded in size and in time, before any
view sees it.

Every request that has a body (a ``Content-Length`` or a chunked one) is
read here into memory, at most ``MAX_BODY_BYTES`` (beyond: 413
``BODY_TOO_LARGE``, whether the length was announced or the body chunked)
and within ``WEB_BODY_TIMEOUT_SECONDS`` from the first byte read (beyond: 408
``REQUEST_TIMEOUT``: a client sending a byte now and then holds a
connection for that long, no more). The views then read the buffered copy.

The deadline is kept on the connection's own socket (gunicorn passes it as
``gunicorn.socket``): each read waits at most the time left. Under the
gevent worker (the Procfile's) a slow body holds a greenlet, not a thread;
the deadline bounds how long.
"""

from __future__ import annotations

import io
import time

from flask import Flask, current_app, request

from web.problems import Problem

_CHUNK = 65536


def _too_large(limit: int) -> Problem:
    return Problem(413, "BODY_TOO_LARGE", f"the body is larger than {limit} bytes (MAX_BODY_BYTES)")


def buffer_body() -> None:
    environ = request.environ
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    length = None if chunked else request.content_length
    if not chunked and not length:
        return
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if request.url_rule is not None and request.url_rule.rule.endswith("/scheduled-payments/batch"):
        # a batch carries up to BATCH_MAX_ITEMS creates: its own, larger limit
        limit = current_app.extensions["paycron.config"].max_batch_body_bytes
    if length is not None and length > limit:
        raise _too_large(limit)
    timeout = current_app.extensions["paycron.config"].web_body_timeout_seconds
    stream, sock = environ["wsgi.input"], environ.get("gunicorn.socket")
    previous = sock.gettimeout() if sock is not None else None
    deadline = time.monotonic() + timeout
    body = bytearray()
    wanted = length if length is not None else limit + 1
    try:
        while len(body) < wanted:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if sock is not None:
                sock.settimeout(remaining)
            chunk = stream.read(min(_CHUNK, wanted - len(body)))
            if not chunk:
                break
            body += chunk
    except TimeoutError:  # socket.timeout is TimeoutError
        raise Problem(
            408,
            "REQUEST_TIMEOUT",
            f"the body did not arrive within {timeout:g} s (WEB_BODY_TIMEOUT_SECONDS)",
        ) from None
    finally:
        if sock is not None:
            sock.settimeout(previous)
    if len(body) > limit:
        raise _too_large(limit)
    if length is not None and len(body) < length:
        raise Problem(400, "INCOMPLETE_BODY", "the body ended before its Content-Length")
    environ["wsgi.input"] = io.BytesIO(bytes(body))
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    environ["wsgi.input_terminated"] = False


def install(app: Flask) -> None:
    app.before_request_funcs.setdefault(None, []).insert(0, buffer_body)
