"""A Fetch cannot make the broker allocate what a client asks for (docs/kafka.md, "Produce and
fetch"): ``max_bytes`` and ``partition_max_bytes`` are capped by ``kafka_fetch_max_bytes``
(Kafka's ``fetch.max.bytes``), while a first batch larger than every limit still comes whole,
so a consumer is never stuck; and a broker process answering several concurrent Fetches that
ask for 2 GiB over a log far larger than the cap keeps its peak memory near the cap."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from test_kafka_listener import Wire

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response
from txbroker.remoting.kafka.records import Record, encode_batch, read_batches

#: What a greedy client asks for: Kafka's largest int32.
ASK = 2**31 - 1
#: Kafka's broker default of ``fetch.max.bytes``, the setting's default here too.
CAP = 57671680
#: The log the subprocess test writes: over three times the cap, in records of VALUE bytes.
VALUE = 512 * 1024
RECORDS = 384  # 192 MiB
PER_BATCH = 4
FETCHES = 4
#: Peak RSS (VmHWM) growth allowed over the FETCHES concurrent Fetches: one copy of the whole
#: log per fetch.  Capped, each fetch costs a few copies of the cap (the records read, the
#: batch built, the frame, the answer waiting in the socket buffer): about 430 MiB in all
#: here.  Answering the whole log instead costs each fetch the log twice over or more (about
#: 1.5 GiB in all here).
RSS_BOUND = FETCHES * RECORDS * VALUE
TIMEOUT = 120.0


def _produce(topic: str, records: bytes) -> dict:
    return {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]}


def _fetch(topic: str, offset: int, max_bytes: int, partition_max_bytes: int) -> dict:
    return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": max_bytes,
            "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset,
                 "partition_max_bytes": partition_max_bytes}]}]}


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


async def _write(port: int, topic: str, count: int, value_size: int, per_batch: int) -> None:
    wire = await Wire.open(port)
    try:
        value = os.urandom(value_size)  # incompressible, and the same bytes each time is fine
        now = int(time.time() * 1000)
        for corr, start in enumerate(range(0, count, per_batch), 1):
            n = min(per_batch, count - start)
            batch = encode_batch(0, [Record(i, now, str(start + i).encode(), value, [])
                                     for i in range(n)])
            answer = await wire.call(ApiKey.PRODUCE, 7, corr, _produce(topic, batch))
            part = answer["responses"][0]["partition_responses"][0]
            assert part["error_code"] == ErrorCode.NONE, part
    finally:
        wire.close()


async def _fetch_frame(port: int, topic: str, offset: int, max_bytes: int,
                       partition_max_bytes: int) -> bytes:
    """One Fetch v4's answer frame, undecoded (the caller measures it first)."""
    wire = await Wire.open(port)
    try:
        wire.send(ApiKey.FETCH, 4, 1, _fetch(topic, offset, max_bytes, partition_max_bytes))
        size = int.from_bytes(await asyncio.wait_for(wire.reader.readexactly(4), TIMEOUT), "big")
        return await asyncio.wait_for(wire.reader.readexactly(size), TIMEOUT)
    finally:
        wire.close()


def _records(frame: bytes) -> list[Record]:
    _, answer = decode_response(ApiKey.FETCH, 4, frame)
    part = answer["responses"][0]["partitions"][0]
    assert part["error_code"] == ErrorCode.NONE, part
    return [r for batch in read_batches(part["records"]) for r in batch.records(2**31 - 1)]


async def test_concurrent_greedy_fetches_are_capped_and_memory_stays_near_the_cap(
        broker_process) -> None:
    proc = broker_process(kafka_port=0, segment_size=32 * 1024 * 1024,
                          max_message_size=PER_BATCH * VALUE + 64 * 1024,
                          max_frame_size=16 * 1024 * 1024)
    topic = "FetchBounds"
    await asyncio.wait_for(_write(proc.kafka_port, topic, RECORDS, VALUE, PER_BATCH), TIMEOUT)
    # Warm up the fetch path with a small answer, then take the baseline.
    small = await _fetch_frame(proc.kafka_port, topic, 0, 1, 1)
    assert len(_records(small)) == 1
    before = _peak_rss(proc.pid)
    frames = await asyncio.wait_for(asyncio.gather(*(
        _fetch_frame(proc.kafka_port, topic, 0, ASK, ASK) for _ in range(FETCHES))), TIMEOUT)
    rise = _peak_rss(proc.pid) - before
    sizes = [len(f) for f in frames]
    assert rise < RSS_BOUND, (f"peak RSS rose {rise / 2**20:.0f} MiB over {FETCHES} fetches "
                              f"(bound {RSS_BOUND / 2**20:.0f} MiB); answers {sizes}")
    # Each answer: within the cap, give or take one record and the frame's own fields.
    assert all(size <= CAP + VALUE + 64 * 1024 for size in sizes), sizes
    for frame in frames:
        got = _records(frame)
        assert CAP - VALUE - 64 * 1024 < len(got) * VALUE <= CAP + VALUE, len(got)
        assert [r.key for r in got] == [str(i).encode() for i in range(len(got))]
    assert proc.alive()


async def test_the_cap_is_a_setting_and_a_larger_first_batch_still_comes_whole(
        kafka_config: BrokerConfig, tmp_path: Path) -> None:
    from txbroker.broker import Broker

    cap = 64 * 1024
    broker = Broker(kafka_config.replace(kafka_fetch_max_bytes=cap, max_message_size=512 * 1024,
                                         segment_size=4 * 1024 * 1024))
    await broker.start()
    try:
        port = broker.kafka_port
        await _write(port, "Capped", 40, 10 * 1024, 5)  # 400 KiB
        await _write(port, "Big", 1, 200 * 1024, 1)  # one record over three times the cap
        got = _records(await _fetch_frame(port, "Capped", 0, ASK, ASK))
        assert 0 < len(got) * 10 * 1024 <= cap, len(got)
        # The partition limit too is within the cap, whatever is asked.
        got = _records(await _fetch_frame(port, "Capped", 3, 1024, ASK))
        assert [r.key for r in got] == [b"3"]  # at least one record, from the offset asked
        big = _records(await _fetch_frame(port, "Big", 0, ASK, ASK))
        assert len(big) == 1 and len(big[0].value) == 200 * 1024
    finally:
        await broker.stop()
