"""The crash soak's message-path faults (bench/soak_faults.py) do what the
soak's report says they did, against the real Redis and Dramatiq's broker:
a lost reply's message is queued all the same, and a duplicated message is
queued twice under two ids."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis as redis_lib
from dramatiq.brokers.redis import RedisBroker

from bench.soak_faults import LossyRedisRelay, MessageDuplicator, is_enqueue, parse_command
from paycron.engine.messages import execute_message
from tests.conftest import RUN_ID


@pytest.fixture
def namespace(redis_url) -> str:
    """A Dramatiq namespace of this run's (its keys go with the run)."""
    return f"paycron-test-{RUN_ID}-{uuid.uuid4().hex[:8]}-dramatiq"


def test_a_request_is_parsed_only_once_whole_and_enqueues_are_recognised():
    wire = b"*3\r\n$7\r\nEVALSHA\r\n$1\r\n1\r\n$2\r\nns\r\n"
    assert parse_command(wire[:-3]) is None
    args, end = parse_command(wire + b"*1\r\n$4\r\nPING\r\n")
    assert args == [b"EVALSHA", b"1", b"ns"] and end == len(wire)
    assert is_enqueue([b"EVALSHA", b"abc", b"1", b"ns", b"enqueue", b"123"])
    assert not is_enqueue([b"EVALSHA", b"abc", b"1", b"ns", b"fetch", b"123"])
    assert not is_enqueue([b"HSET", b"k", b"enqueue", b"v"])


def _broker(url: str, namespace: str) -> RedisBroker:
    return RedisBroker(url=url, namespace=namespace)


def _queued(client: redis_lib.Redis, namespace: str) -> list[dict]:
    return [json.loads(v) for v in client.hvals(f"{namespace}:payments.msgs")]


def test_a_lost_reply_raises_at_the_sender_but_the_message_is_queued(namespace, redis_url):
    relay = LossyRedisRelay(redis_url, rate=1.0, seed=1, hold=(0, 0))
    relay.start()
    try:
        with pytest.raises(redis_lib.ConnectionError):
            _broker(relay.url, namespace).enqueue(
                execute_message([], probe=False, queue_name="payments")
            )
    finally:
        relay.close()
    assert (relay.enqueues, relay.lost) == (1, 1)
    assert len(_queued(redis_lib.Redis.from_url(redis_url), namespace)) == 1


def test_a_duplicated_message_is_queued_again_under_new_ids(namespace, redis_url):
    client = redis_lib.Redis.from_url(redis_url)
    _broker(redis_url, namespace).enqueue(execute_message([], probe=False, queue_name="payments"))
    duplicator = MessageDuplicator(
        redis_url, namespace=namespace, queue="payments", rate=1.0, seed=1, max_delay=0
    )
    duplicator.start()
    deadline = time.monotonic() + 5
    while duplicator.duplicated < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    duplicator.stop()
    messages = _queued(client, namespace)
    assert duplicator.duplicated == 1 and len(messages) == 2
    assert client.llen(f"{namespace}:payments") == 2
    first, copy = messages
    assert first["args"] == copy["args"]
    assert first["message_id"] != copy["message_id"]
    assert first["options"]["redis_message_id"] != copy["options"]["redis_message_id"]
