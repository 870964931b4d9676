"""An idempotent Produce that stops at any point, then is retried: stored once, or answered as
the duplicate of a batch that is stored (docs/kafka.md, "Produce and fetch").

A real broker with sync flush (every put waits for its group commit, so the produce path has
real waiting points).  The handler is the broker's own Produce handler, driven as a task that
is cancelled after its k-th loop step for every k until one run completes; a retry that
overtakes a put still under way; and a raw client whose connection closes right after its
request, then retries on a new connection.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from support.waiting import eventually

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.remoting.kafka.records import Record, encode_batch
from txbroker.service.kafka.context import KafkaRequestContext

T = 10.0
RECORDS = 3
#: Loop steps tried at most: a produce under sync flush completes in far fewer.
MAX_STEPS = 300


@pytest.fixture
def kafka_config(kafka_config):
    return kafka_config.replace(flush_mode="sync")


def batch(producer_id: int, tag: str) -> bytes:
    records = [Record(offset_delta=i, timestamp=1_700_000_000_000 + i, key=None,
                      value=f"{tag}-{i}".encode(), headers=[]) for i in range(RECORDS)]
    return encode_batch(0, records, producer_id=producer_id, producer_epoch=0, base_sequence=0)


def produce_body(topic: str, batches: dict[int, bytes]) -> dict:
    return {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": p, "records": b} for p, b in batches.items()]}]}


def context(corr: int) -> KafkaRequestContext:
    return KafkaRequestContext(ApiKey.PRODUCE, 7, corr, "retry-test", "127.0.0.1:1", 0)


def partitions(answer: dict) -> dict[int, tuple[int, int]]:
    """{partition: (error code, base offset)} of a Produce answer."""
    return {p["index"]: (p["error_code"], p["base_offset"])
            for t in answer["responses"] for p in t["partition_responses"]}


async def test_a_produce_cancelled_at_any_step_then_retried_is_stored_once(kafka_broker) -> None:
    handler = kafka_broker.kafka.handlers[ApiKey.PRODUCE]
    store = kafka_broker.store
    topic = "CancelAtEveryStep"
    await handler(context(0), produce_body(topic, {0: batch(9_999, "warm-up")}))  # creates it
    completed_at = None
    for k in range(1, MAX_STEPS):
        before = store.max_offset(topic, 0)
        body = produce_body(topic, {0: batch(10_000 + k, f"step{k}")})  # a new producer each
        first = asyncio.ensure_future(handler(context(1), body))
        for _ in range(k):
            await asyncio.sleep(0)
        done = first.done()
        first.cancel()
        await asyncio.wait([first], timeout=T)
        retry = partitions(await asyncio.wait_for(handler(context(2), body), T))
        assert retry == {0: (0, before)}, f"cancelled after {k} steps: {retry}"
        assert store.max_offset(topic, 0) == before + RECORDS, f"cancelled after {k} steps"
        if done:
            completed_at = k
            break
    assert completed_at is not None, f"the produce did not complete within {MAX_STEPS} steps"
    assert completed_at > 1  # so at least one run was cancelled while it waited


async def test_a_retry_overtaking_the_first_put_waits_and_is_its_duplicate(kafka_broker) -> None:
    handler = kafka_broker.kafka.handlers[ApiKey.PRODUCE]
    body = produce_body("Overtaken", {0: batch(20_000, "overtaken")})
    first = asyncio.ensure_future(handler(context(1), body))
    await asyncio.sleep(0)  # the first is in its put (the flush wait) ...
    second = asyncio.ensure_future(handler(context(2), body))  # ... when the retry arrives
    answers = await asyncio.wait_for(asyncio.gather(first, second), T)
    assert [partitions(a) for a in answers] == [{0: (0, 0)}, {0: (0, 0)}]
    assert kafka_broker.store.max_offset("Overtaken", 0) == RECORDS
    assert kafka_broker.metrics.kafka_duplicate_batches.value == 1


async def _call(port: int, frame: bytes) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(frame)
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), T), "big")
        _corr, answer = decode_response(ApiKey.PRODUCE, 7,
                                       await asyncio.wait_for(reader.readexactly(size), T))
        return answer
    finally:
        writer.close()


async def test_a_connection_dropped_mid_produce_then_the_retry_stores_every_batch_once(
        kafka_broker) -> None:
    port = kafka_broker.kafka_port
    topic = "ResetMidProduce"
    queues = kafka_broker.config.default_queue_nums
    body = produce_body(topic, {p: batch(30_000 + p, f"{topic}{p}") for p in range(queues)})
    # Create the topic first, so the drop lands while the puts wait for their flushes.
    await _call(port, encode_request(ApiKey.PRODUCE, 7, 1, "retry-test",
                                     produce_body(topic, {0: batch(29_999, "warm-up")})))
    sent = [kafka_broker.store.max_offset(topic, p) for p in range(queues)]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode_request(ApiKey.PRODUCE, 7, 2, "retry-test", body))
    sock.close()  # the request, then FIN: the broker loses the connection while handling it
    await eventually(lambda: not kafka_broker.kafka.connections and not kafka_broker.kafka.lingering,
                     T, "the dropped connection's request finished")
    retry = partitions(await _call(port, encode_request(ApiKey.PRODUCE, 7, 3, "retry-test", body)))
    assert retry == {p: (0, sent[p]) for p in range(queues)}
    for p in range(queues):
        assert kafka_broker.store.max_offset(topic, p) == sent[p] + RECORDS, f"partition {p}"


async def test_a_fenced_master_answers_not_leader_so_clients_refresh_their_metadata(kafka_broker) -> None:
    # A master whose lease lapsed (or that is demoted or stopping) is not where the partition
    # can be written: Kafka's answer for that is NOT_LEADER_OR_FOLLOWER (6), which makes
    # clients refresh metadata and find the new master.  KAFKA_STORAGE_ERROR (56) made
    # aiokafka retry the fenced broker for as long as the fence stood (20-27 s after a heal
    # in the partition harness).
    from txbroker.store.results import Fence

    handler = kafka_broker.kafka.handlers[ApiKey.PRODUCE]
    await handler(context(0), produce_body("Fenced", {0: batch(30_000, "before")}))
    kafka_broker.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
    try:
        for producer_id in (-1, 30_001):  # a plain and an idempotent batch
            answer = partitions(await asyncio.wait_for(
                handler(context(1), produce_body("Fenced", {0: batch(producer_id, "fenced")})), T))
            assert answer == {0: (6, -1)}, producer_id
    finally:
        kafka_broker.store.set_write_gate(None)
