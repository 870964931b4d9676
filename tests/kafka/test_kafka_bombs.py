"""Compression bombs: a few bytes from a peer that inflate to 16 MiB are refused at the
configured limit, for every codec and every place the broker inflates a peer's bytes (Kafka
batches at Produce, transactional ones too, RocketMQ zlib bodies, the name server's
compressed REGISTER_BROKER body), while the connection and the broker stay up and memory
stays bounded (docs/kafka.md, "Compression limits")."""

from __future__ import annotations

import gzip
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from support.cluster import start_namesrv
from test_kafka_listener import Wire

from txbroker.remoting.bodies import RegisterBrokerBody, body_crc32
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import RegisterBrokerRequestHeader
from txbroker.remoting.kafka import compression
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.compression import GZIP, LZ4, SNAPPY, ZSTD, RecordsError
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, crc32c, encode_batch, read_batches
from txbroker.store.record import RecordError, inflate_body

BOMB = 16 * 1024 * 1024  # what every bomb inflates to
LIMIT = 1024 * 1024  # the broker's max_message_size in these tests
#: Peak memory a refused bomb may cost in-process (tracemalloc): the limit a few times over
#: (the output buffer, its copy), never the bomb's 16 MiB.
TRACED_BOUND = 4 * LIMIT
#: Growth of a broker subprocess's peak RSS (VmHWM) over every bomb below: well under one
#: bomb, which inflated whole would add 16 MiB at least (32 MiB with its copy).
RSS_BOUND = 8 * 1024 * 1024
CODECS = {"gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
_TAIL = struct.Struct(">hiqqqhii")  # a batch's attributes .. record count (records.py)


def _bomb_records() -> bytes:
    """The records section of a batch holding one record whose value is 16 MiB of zeros."""
    return encode_batch(0, [Record(0, int(time.time() * 1000), None, bytes(BOMB), [])])[61:]


def _batch_with_payload(codec: int, payload: bytes, **kw) -> bytes:
    """A valid batch header (CRC included) in front of any compressed payload."""
    now = int(time.time() * 1000)
    tail = _TAIL.pack(codec | (0x10 if kw.get("transactional") else 0), 0, now, now,
                      kw.get("producer_id", -1), kw.get("producer_epoch", -1),
                      kw.get("base_sequence", -1), 1) + payload
    return struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c(tail)) + tail


def _snappy_length_lie() -> bytes:
    """A raw snappy block that declares 16 MiB and holds one literal byte: tiny input whose
    declared length alone would make a naive decoder allocate the 16 MiB."""
    return b"\x80\x80\x80\x08" + b"\x00x"


def _bombs() -> dict[str, bytes]:
    records = _bomb_records()
    out = {name: compression.compress(codec, records) for name, codec in CODECS.items()}
    out["snappy-raw-length"] = _snappy_length_lie()
    return out


_CODEC_OF = {**CODECS, "snappy-raw-length": SNAPPY}


def _traced_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- the codec, no I/O --------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*CODECS, "snappy-raw-length"])
def test_each_codec_refuses_a_bomb_past_the_limit_with_bounded_memory(name: str) -> None:
    payload = _bombs()[name]
    assert len(payload) < LIMIT  # the input is small; only its output is large

    def refuse() -> None:
        with pytest.raises(RecordsError) as err:
            compression.decompress(_CODEC_OF[name], payload, LIMIT)
        assert err.value.error_code == ErrorCode.MESSAGE_TOO_LARGE

    assert _traced_peak(refuse) < TRACED_BOUND


@pytest.mark.parametrize("codec", list(CODECS.values()))
def test_output_at_the_limit_is_accepted_one_byte_more_is_not(codec: int) -> None:
    data = bytes(range(256)) * (LIMIT // 256)
    packed = compression.compress(codec, data)
    assert compression.decompress(codec, packed, LIMIT) == data
    with pytest.raises(RecordsError) as err:
        compression.decompress(codec, packed, LIMIT - 1)
    assert err.value.error_code == ErrorCode.MESSAGE_TOO_LARGE


def test_gzip_members_in_a_row_are_read_and_count_together() -> None:
    two = gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 1000)
    assert compression.decompress(GZIP, two, 2000) == b"a" * 1000 + b"b" * 1000
    with pytest.raises(RecordsError, match="MESSAGE_TOO_LARGE"):
        compression.decompress(GZIP, two, 1999)
    with pytest.raises(RecordsError, match="CORRUPT_MESSAGE"):
        compression.decompress(GZIP, two[:-3], 2000)


def test_rocketmq_zlib_body_bomb_is_refused_with_bounded_memory() -> None:
    bomb = zlib.compress(bytes(BOMB), 9)
    assert len(bomb) < 64 * 1024

    def refuse() -> None:
        with pytest.raises(RecordError, match="inflates past"):
            inflate_body(bomb, LIMIT)

    assert _traced_peak(refuse) < TRACED_BOUND
    assert inflate_body(zlib.compress(b"x" * LIMIT), LIMIT) == b"x" * LIMIT
    with pytest.raises(RecordError, match="does not inflate"):
        inflate_body(zlib.compress(b"x" * 100)[:-4], LIMIT)


# --- the name server: REGISTER_BROKER is reachable by anyone ------------------------------------
async def test_register_broker_bomb_is_refused_and_the_name_server_goes_on() -> None:
    server = await start_namesrv()
    client = RemotingClient(server.addr)
    # One length-prefixed item of 16 MiB: the inflated form exceeds any frame.
    bomb = zlib.compress(struct.pack(">i", BOMB) + bytes(BOMB), 9)
    header = RegisterBrokerRequestHeader(
        broker_name="broker-a", broker_addr="127.0.0.1:10911", cluster_name="DefaultCluster",
        ha_server_addr="127.0.0.1:10912", broker_id=0, compressed=True,
        body_crc32=body_crc32(bomb))
    try:
        tracemalloc.start()
        try:
            bad = await client.invoke(RemotingCommand.request(
                RequestCode.REGISTER_BROKER, header.to_ext(), bomb), 10.0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert bad.code == ResponseCode.SYSTEM_ERROR
        assert "inflates past" in bad.remark
        assert peak < BOMB  # the name server's own frame limit (16 MiB) is the bound here
        good = RegisterBrokerBody().encode(compressed=True)
        header.body_crc32 = body_crc32(good)
        ok = await client.invoke(RemotingCommand.request(
            RequestCode.REGISTER_BROKER, header.to_ext(), good), 5.0)
        assert ok.code == ResponseCode.SUCCESS  # same connection, same server
    finally:
        await client.close()
        await server.stop()


# --- a broker subprocess: Produce, transactions, memory -------------------------------------------
def _produce(topic: str, records: bytes, txn_id: str | None = None) -> dict:
    return {"transactional_id": txn_id, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]}


def _error(answer: dict) -> int:
    return answer["responses"][0]["partition_responses"][0]["error_code"]


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


async def test_broker_refuses_every_bomb_stays_up_and_its_peak_memory_stays_bounded(
        broker_process) -> None:
    proc = broker_process(kafka_port=0, max_message_size=LIMIT, segment_size=4 * LIMIT)
    bombs = _bombs()
    wire = await Wire.open(proc.kafka_port)
    corr = iter(range(1, 1000))
    try:
        # Warm up: every codec's code path once with an honest batch.
        for codec in CODECS.values():
            honest = encode_batch(0, [Record(0, int(time.time() * 1000), None, b"ok" * 100, [])],
                                  compression=codec)
            assert _error(await wire.call(ApiKey.PRODUCE, 7, next(corr),
                                          _produce("Bombs", honest))) == ErrorCode.NONE
        before = _peak_rss(proc.proc.pid)
        for _ in range(2):
            for name, payload in bombs.items():
                batch = _batch_with_payload(_CODEC_OF[name], payload)
                answer = await wire.call(ApiKey.PRODUCE, 7, next(corr), _produce("Bombs", batch))
                assert _error(answer) == ErrorCode.MESSAGE_TOO_LARGE, name

        # A transactional bomb is refused at Produce (inflated up to the limit, not kept):
        # nothing is staged, and the transaction can still commit what it holds (nothing).
        init = await wire.call(ApiKey.INIT_PRODUCER_ID, 0, next(corr),
                               {"transactional_id": "bomb-tx", "transaction_timeout_ms": 60000})
        pid, epoch = init["producer_id"], init["producer_epoch"]
        ids = {"transactional_id": "bomb-tx", "producer_id": pid, "producer_epoch": epoch}
        added = await wire.call(ApiKey.ADD_PARTITIONS_TO_TXN, 0, next(corr),
                                {**ids, "topics": [{"name": "Bombs", "partitions": [0]}]})
        assert added["results"][0]["results"][0]["partition_error_code"] == ErrorCode.NONE
        staged = _batch_with_payload(ZSTD, bombs["zstd"], transactional=True, producer_id=pid,
                                     producer_epoch=epoch, base_sequence=0)
        assert _error(await wire.call(ApiKey.PRODUCE, 7, next(corr),
                                      _produce("Bombs", staged, "bomb-tx"))) == \
            ErrorCode.MESSAGE_TOO_LARGE
        corrupt = _batch_with_payload(GZIP, b"not gzip at all", transactional=True,
                                      producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert _error(await wire.call(ApiKey.PRODUCE, 7, next(corr),
                                      _produce("Bombs", corrupt, "bomb-tx"))) == \
            ErrorCode.CORRUPT_MESSAGE
        commit = await wire.call(ApiKey.END_TXN, 0, next(corr), {**ids, "committed": True})
        assert commit["error_code"] == ErrorCode.NONE

        grown = _peak_rss(proc.proc.pid) - before
        assert grown < RSS_BOUND, f"peak RSS grew by {grown} bytes"
        # The same connection still works and nothing of the bombs was stored.
        assert _error(await wire.call(ApiKey.PRODUCE, 7, next(corr),
                                      _produce("Bombs", encode_batch(0, [Record(
                                          0, int(time.time() * 1000), None, b"after", [])]))
                                      )) == ErrorCode.NONE
        fetched = await wire.call(ApiKey.FETCH, 11, next(corr), {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": LIMIT,
            "isolation_level": 1, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "Bombs", "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": LIMIT}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        [batch] = read_batches(fetched["responses"][0]["partitions"][0]["records"])
        assert [r.value for r in batch.records()] == [b"ok" * 100] * len(CODECS) + [b"after"]
    finally:
        wire.close()
    assert proc.alive()
