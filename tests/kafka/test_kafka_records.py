"""RecordBatch v2 and its codecs, checked against the record-batch readers and builders of aiokafka
(its C and pure-Python implementations) and kafka-python."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record import default_records as aio_records

from txbroker.remoting.kafka.compression import compress, decompress
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import (
    Record,
    RecordBatch,
    RecordsError,
    crc32c,
    encode_batch,
    read_batches,
)

CODECS = [0, 1, 2, 3, 4]
AIO_BATCHES = [aio_records.DefaultRecordBatch, aio_records._DefaultRecordBatchPy]
AIO_BUILDERS = [aio_records.DefaultRecordBatchBuilder, aio_records._DefaultRecordBatchBuilderPy]


def _kafka_python_codecs() -> list[int]:
    from kafka import codec

    return [0] + [c for c, ok in ((1, codec.has_gzip()), (2, codec.has_snappy()), (3, codec.has_lz4()),
                                  (4, codec.has_zstd())) if ok]


def _records(n: int = 5) -> list[Record]:
    out = []
    for i in range(n):
        out.append(Record(i, 1_700_000_000_000 + i * 7 - (300 if i == 2 else 0),
                          None if i == 1 else f"k{i}".encode(),
                          None if i == 3 else bytes([i]) * (i * 100),
                          [] if i % 2 else [("h", b"v"), ("é", None), ("", b"")]))
    return out


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(memoryview(b"123456789")) == 0xE3069283


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("reader", AIO_BATCHES, ids=["aiokafka-c", "aiokafka-py"])
def test_aiokafka_reads_our_batches(codec: int, reader) -> None:
    records = _records()
    data = encode_batch(100, records, producer_id=7, producer_epoch=2, base_sequence=40,
                        transactional=True, compression=codec)
    batch = reader(bytearray(data))
    assert batch.validate_crc()
    assert (batch.base_offset, batch.compression_type, batch.is_transactional, batch.is_control_batch) == (
        100, codec, True, False)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 2, 40)
    assert batch.max_timestamp == max(r.timestamp for r in records)
    got = list(batch)
    assert [r.offset for r in got] == [100 + i for i in range(len(records))]
    assert [(r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in got] == [
        (r.timestamp, r.key, r.value, r.headers) for r in records]


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_reads_our_batches(codec: int) -> None:
    from kafka.record.default_records import DefaultRecordBatch

    if codec not in _kafka_python_codecs():
        pytest.skip("kafka-python has no library for this codec here")
    records = _records()
    batch = DefaultRecordBatch(bytearray(encode_batch(5, records, compression=codec)))
    assert batch.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch] == [
        (5 + i, r.timestamp, r.key, r.value, r.headers) for i, r in enumerate(records)]


def _aiokafka_batch(builder_cls, codec: int, records: list[Record], **kw) -> bytes:
    builder = builder_cls(magic=2, compression_type=codec, is_transactional=kw.get("transactional", 0),
                          producer_id=kw.get("producer_id", -1), producer_epoch=kw.get("producer_epoch", -1),
                          base_sequence=kw.get("base_sequence", -1), batch_size=1 << 20)
    for i, r in enumerate(records):
        builder.append(i, timestamp=r.timestamp, key=r.key, value=r.value, headers=r.headers)
    return bytes(builder.build())


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("builder", AIO_BUILDERS, ids=["aiokafka-c", "aiokafka-py"])
def test_we_read_aiokafka_batches(codec: int, builder) -> None:
    records = _records()
    data = _aiokafka_batch(builder, codec, records, transactional=1, producer_id=9, producer_epoch=0,
                           base_sequence=2**31 - 2)
    [batch] = read_batches(data)
    assert (batch.compression, batch.is_transactional, batch.is_control, batch.magic) == (codec, True, False, 2)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 0, 2**31 - 2)
    assert batch.records_count == len(records) and batch.last_offset_delta == len(records) - 1
    assert batch.last_sequence == 2  # 2**31-2 + 4 wraps after INT32_MAX
    assert batch.data == data
    assert batch.records() == records


@pytest.mark.parametrize("codec", CODECS)
def test_we_read_kafka_python_batches(codec: int) -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    if codec not in _kafka_python_codecs():
        pytest.skip("kafka-python has no library for this codec here")
    records = _records()
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
    for i, r in enumerate(records):
        builder.append(i, timestamp=r.timestamp, key=r.key, value=r.value, headers=r.headers)
    [batch] = read_batches(bytes(builder.build()))
    assert batch.records() == records


def test_control_batch_is_a_transaction_marker_for_aiokafka() -> None:
    commit = Record(0, 1_000, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 3), [])
    data = encode_batch(50, [commit], producer_id=4, producer_epoch=1, transactional=True, control=True)
    batch = aio_records._DefaultRecordBatchPy(bytearray(data))
    assert batch.is_control_batch and batch.is_transactional
    [rec] = read_batches(data)[0].records()
    assert rec.key == b"\x00\x00\x00\x01"


def test_several_batches_back_to_back_and_empty_input() -> None:
    a = encode_batch(0, _records(2))
    b = encode_batch(2, _records(3), compression=1)
    batches = read_batches(a + b)
    assert [x.base_offset for x in batches] == [0, 2]
    assert [x.data for x in batches] == [a, b]
    assert [len(x.records()) for x in batches] == [2, 3]
    assert read_batches(b"") == []
    assert read_batches(memoryview(a))[0].data == a


def _refused(data: bytes, code: ErrorCode, **kw) -> None:
    with pytest.raises(RecordsError) as e:
        batches = read_batches(data, **kw)
        for b in batches:
            b.records()
    assert e.value.error_code == code, e.value


def _recrc(data: bytearray) -> bytes:
    data[17:21] = struct.pack(">I", crc32c(bytes(data[21:])))
    return bytes(data)


def test_bad_batches_get_kafkas_error_codes() -> None:
    good = encode_batch(0, _records(3))
    _refused(good[:-1], ErrorCode.CORRUPT_MESSAGE)  # truncated
    _refused(good + good[:30], ErrorCode.CORRUPT_MESSAGE)  # truncated trailing batch
    flipped = bytearray(good)
    flipped[-1] ^= 1
    _refused(bytes(flipped), ErrorCode.CORRUPT_MESSAGE)  # CRC
    assert read_batches(bytes(flipped), check_crc=False)[0].crc != crc32c(bytes(flipped[21:]))
    magic1 = bytearray(good)
    magic1[16] = 1
    _refused(bytes(magic1), ErrorCode.INVALID_RECORD)
    more = bytearray(good)
    more[57:61] = struct.pack(">i", 4)  # count says 4, 3 are there
    _refused(_recrc(more), ErrorCode.INVALID_RECORD)
    fewer = bytearray(good)
    fewer[57:61] = struct.pack(">i", 2)
    _refused(_recrc(fewer), ErrorCode.INVALID_RECORD)
    codec5 = bytearray(good)
    codec5[22] = 5
    _refused(_recrc(codec5), ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
    garbage = bytearray(encode_batch(0, _records(3), compression=4))
    garbage[70:80] = b"\x00" * 10
    _refused(_recrc(garbage), ErrorCode.CORRUPT_MESSAGE)
    short = bytearray(good)
    short[8:12] = struct.pack(">i", 10)  # batch length below the header's
    _refused(bytes(short), ErrorCode.CORRUPT_MESSAGE)


def test_base_offset_is_outside_the_crc() -> None:
    data = bytearray(encode_batch(0, _records(2)))
    data[0:8] = struct.pack(">q", 12345)
    data[12:16] = struct.pack(">i", 9)  # partition leader epoch: also outside
    [batch] = read_batches(bytes(data))
    assert (batch.base_offset, batch.partition_leader_epoch) == (12345, 9)


def test_snappy_raw_and_xerial_framings_both_decode() -> None:
    import cramjam

    data = bytes(range(256)) * 500  # more than one 32 KiB xerial block
    xerial = compress(2, data)
    assert xerial[:8] == b"\x82SNAPPY\x00"
    assert decompress(2, xerial) == data
    assert decompress(2, bytes(cramjam.snappy.compress_raw(data))) == data
    from aiokafka.codec import snappy_decode, snappy_encode

    assert snappy_decode(xerial) == data
    assert decompress(2, snappy_encode(data)) == data
    # a librdkafka-style batch: raw snappy records
    records = _records()
    plain = encode_batch(0, records)
    raw = bytes(cramjam.snappy.compress_raw(plain[61:]))
    batch = bytearray(plain[:61] + raw)
    batch[8:12] = struct.pack(">i", len(batch) - 12)
    batch[22] = 2
    assert read_batches(_recrc(batch))[0].records() == records


def test_unknown_codec() -> None:
    for fn in (compress, decompress):
        with pytest.raises(RecordsError) as e:
            fn(6, b"x")
        assert e.value.error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_sequence_properties() -> None:
    def batch(base_sequence: int, last_delta: int, attributes: int = 0) -> RecordBatch:
        return RecordBatch(0, -1, 2, 0, attributes, last_delta, 0, 0, 1, 0, base_sequence, last_delta + 1, b"")

    assert batch(10, 4).last_sequence == 14
    assert batch(2**31 - 1, 1).last_sequence == 0
    assert batch(-1, 3).last_sequence == -1
    b = batch(0, 0, attributes=0x3B)
    assert (b.compression, b.timestamp_type, b.is_transactional, b.is_control) == (3, 1, True, True)
