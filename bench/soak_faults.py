"""The soak's message-path faults, injected from the harness (bench/soak.py).

- :class:`LossyRedisRelay`: a loopback TCP relay the schedulers reach Redis
  through. On a seeded fraction of the broker's ``enqueue`` commands it
  forwards the command, waits until Redis has begun to answer (the message
  is in the queue), holds the reply a moment, then drops the client's
  connection without relaying it: the sweeper's enqueue raises although its
  message was delivered.
- :class:`MessageDuplicator`: copies messages out of the Dramatiq queue (queued,
  or fetched and not yet acked) and pushes the copies back under new message
  ids, some at once and some a few seconds late: the same claims delivered
  twice, as a redelivery or a publisher's retry would.

Both only count what they did; the soak's checks judge the outcome.
"""

from __future__ import annotations

import json
import random
import selectors
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

import redis


def parse_command(buf: bytes | bytearray, start: int = 0) -> tuple[list[bytes], int] | None:
    """One RESP request (an array of bulk strings, as every client sends) from
    ``buf[start:]``: its arguments and the offset after it, or None if it is
    not all there yet."""
    if start >= len(buf):
        return None
    if buf[start : start + 1] != b"*":  # an inline command: one line
        end = buf.find(b"\r\n", start)
        return None if end < 0 else (bytes(buf[start:end]).split(), end + 2)
    end = buf.find(b"\r\n", start)
    if end < 0:
        return None
    count, pos, args = int(buf[start + 1 : end]), end + 2, []
    for _ in range(count):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(buf[pos + 1 : end])
        if len(buf) < end + 2 + size + 2:
            return None
        args.append(bytes(buf[end + 2 : end + 2 + size]))
        pos = end + 2 + size + 2
    return args, pos


def is_enqueue(args: list[bytes]) -> bool:
    """Dramatiq's RedisBroker enqueues through its dispatch script:
    ``EVALSHA <sha> <numkeys> <keys...> enqueue ...``."""
    if len(args) < 4 or args[0].upper() not in (b"EVALSHA", b"EVAL"):
        return False
    try:
        first_argv = 3 + int(args[2])
    except ValueError:
        return False
    return len(args) > first_argv and args[first_argv] == b"enqueue"


class LossyRedisRelay:
    """A relay on 127.0.0.1 in front of ``upstream_url``; :attr:`url` is the
    Redis URL to give the processes whose enqueue replies may be lost. A
    lost reply is held ``hold`` seconds (uniform) before the connection
    drops: by default up to 0.3 s, six times the workers' idle poll, so a
    worker often starts the message before the sweeper hands its claims
    back (the race the release's fence is for)."""

    def __init__(
        self, upstream_url: str, *, rate: float, seed: int, hold: tuple[float, float] = (0, 0.3)
    ):
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.rate, self.hold = rate, hold
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.enqueues = 0  # enqueue commands relayed
        self.lost = 0  # of which the reply was dropped after Redis answered
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}{parts.path or '/0'}"
        self.closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._accept, name="redis-relay", daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _lose_this_one(self) -> bool:
        with self.lock:
            self.enqueues += 1
            return self.rng.random() < self.rate

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, "client")
        sel.register(upstream, selectors.EVENT_READ, "upstream")
        pending, losing = bytearray(), False
        try:
            while not self.closed.is_set():
                for key, _ in sel.select(timeout=1):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.data == "upstream":
                        if losing:  # Redis ran it and answers: nobody hears
                            time.sleep(self.rng.uniform(*self.hold))
                            with self.lock:
                                self.lost += 1
                            return
                        client.sendall(data)
                        continue
                    pending += data
                    pos = 0
                    while (parsed := parse_command(pending, pos)) is not None:
                        args, end = parsed
                        if is_enqueue(args) and self._lose_this_one():
                            upstream.sendall(bytes(pending[:end]))
                            del pending[:end]
                            sel.unregister(client)  # nothing more from it is relayed
                            losing = True
                            break
                        pos = end
                    if not losing and pos:
                        upstream.sendall(bytes(pending[:pos]))
                        del pending[:pos]
        except OSError:
            return
        finally:
            sel.close()
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


class MessageDuplicator:
    """Copies a seeded fraction of the messages it sees in Dramatiq's queue
    (``<namespace>:<queue>.msgs``: queued, or fetched and not yet acked) and
    re-enqueues each copy under new message ids, at once or up to
    ``max_delay`` seconds later. Copies are never copied again."""

    def __init__(
        self,
        redis_url: str,
        *,
        namespace: str,
        queue: str,
        rate: float,
        seed: int,
        max_delay: float = 3.0,  # a late copy: after its claim finished, often
        interval: float = 0.02,  # a message lives ~50 ms in the hash: look often
    ):
        self.client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        self.queue_key = f"{namespace}:{queue}"
        self.messages_key = f"{self.queue_key}.msgs"
        self.rate, self.max_delay, self.interval = rate, max_delay, interval
        self.rng = random.Random(seed)
        self.seen: set[bytes] = set()
        self.later: list[tuple[float, bytes]] = []  # (when, encoded copy)
        self.duplicated = 0  # copies enqueued
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="duplicator", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self._once()
            except (redis.RedisError, OSError):  # Redis restarted empty, or busy
                time.sleep(0.2)

    def _once(self) -> None:
        for message_id in self.client.hkeys(self.messages_key):
            if message_id in self.seen:
                continue
            self.seen.add(message_id)
            if self.rng.random() >= self.rate:
                continue
            data = self.client.hget(self.messages_key, message_id)
            if data is None:  # acked meanwhile
                continue
            message = json.loads(data)
            copy_id = str(uuid.uuid4())
            message["message_id"] = str(uuid.uuid4())
            message["options"] = {**message.get("options", {}), "redis_message_id": copy_id}
            self.seen.add(copy_id.encode())
            delay = self.rng.choice((0.0, self.rng.uniform(0, self.max_delay)))
            self.later.append((time.monotonic() + delay, json.dumps(message).encode()))
        now, due = time.monotonic(), []
        for item in self.later:
            (due if item[0] <= now else []).append(item)
        for item in due:
            self.later.remove(item)
            self._push(item[1])

    def _push(self, encoded: bytes) -> None:
        copy_id = json.loads(encoded)["options"]["redis_message_id"]
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.messages_key, copy_id, encoded)
        pipe.rpush(self.queue_key, copy_id)
        pipe.execute()
        self.duplicated += 1
