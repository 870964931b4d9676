"""Fuzzing the Kafka codec: arbitrary and mutated bytes only ever raise the codec's own errors, and
records round-trip through every compression codec."""

from __future__ import annotations

import struct

from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txbroker.remoting.kafka.apis import SERVED
from txbroker.remoting.kafka.framing import (
    FrameSplitter,
    FrameTooLarge,
    UnsupportedVersion,
    decode_request,
    decode_response,
    encode_request,
)
from txbroker.remoting.kafka.primitives import KafkaDecodeError
from txbroker.remoting.kafka.records import (
    Record,
    RecordsError,
    crc32c,
    encode_batch,
    read_batches,
)
from txbroker.remoting.kafka.schema import _in, fields

SERVED_VERSIONS = sorted((int(k), v) for k, (lo, hi) in SERVED.items() for v in range(lo, hi + 1))
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _body(table, version: int, draw) -> dict:
    """A random body of one table at one version."""
    body: dict = {}
    for f in table:
        if not _in(f.versions, version):
            continue
        nullable = _in(f.nullable, version)
        if isinstance(f.type, list):
            body[f.name] = [_body(f.type, version, draw) for _ in range(draw(st.integers(0, 2)))]
        elif f.type.startswith("["):
            body[f.name] = draw(st.lists(_scalar(f.type[1:-1], False), max_size=3))
        else:
            body[f.name] = draw(_scalar(f.type, nullable))
    return body


def _scalar(kind: str, nullable: bool):
    base = {"int8": st.integers(-128, 127), "int16": st.integers(-2**15, 2**15 - 1),
            "int32": st.integers(-2**31, 2**31 - 1), "int64": st.integers(-2**63, 2**63 - 1),
            "bool": st.booleans(), "string": st.text(max_size=20), "bytes": st.binary(max_size=40),
            "records": st.binary(max_size=80)}[kind]
    return st.one_of(st.none(), base) if nullable and kind not in ("int8", "int16", "int32", "int64", "bool") else base


@st.composite
def requests(draw) -> tuple[int, int, dict, bytes]:
    key, version = draw(st.sampled_from(SERVED_VERSIONS))
    body = _body(fields(key, True), version, draw)
    client = draw(st.one_of(st.none(), st.text(max_size=10)))
    return key, version, body, encode_request(key, version, draw(st.integers(-2**31, 2**31 - 1)), client, body)


@st.composite
def mutated(draw, frames) -> bytes:
    data = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "cut", "insert", "ff"]))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            data[i] = 0xFF
    return bytes(data)


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_into_decode_request(data: bytes) -> None:
    try:
        decode_request(data)
    except (KafkaDecodeError, UnsupportedVersion):
        pass


@FUZZ
@given(mutated(requests().map(lambda r: r[3][4:])))
def test_mutated_requests_into_decode_request(data: bytes) -> None:
    try:
        decode_request(data)
    except (KafkaDecodeError, UnsupportedVersion):
        pass


@FUZZ
@given(requests())
def test_random_requests_round_trip(req) -> None:
    key, version, body, frame = req
    decoded = decode_request(frame[4:])
    assert (decoded.api_key, decoded.api_version) == (key, version)
    assert decoded.body == body


@FUZZ
@given(st.sampled_from(SERVED_VERSIONS), st.binary(max_size=200))
def test_arbitrary_bytes_into_decode_response(kv, data: bytes) -> None:
    try:
        decode_response(kv[0], kv[1], data)
    except KafkaDecodeError:
        pass


_records = st.lists(st.builds(
    Record,
    offset_delta=st.just(0),
    timestamp=st.integers(0, 2**42),
    key=st.one_of(st.none(), st.binary(max_size=30)),
    value=st.one_of(st.none(), st.binary(max_size=300)),
    headers=st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
), min_size=1, max_size=8)


@FUZZ
@given(_records, st.sampled_from([0, 1, 2, 3, 4]), st.integers(-1, 2**31 - 1), st.booleans())
def test_records_round_trip_every_codec(records: list[Record], codec: int, sequence: int, transactional: bool) -> None:
    data = encode_batch(17, records, producer_id=3 if sequence >= 0 else -1,
                        producer_epoch=0 if sequence >= 0 else -1, base_sequence=sequence,
                        transactional=transactional, compression=codec)
    [batch] = read_batches(data)
    expected = [Record(i, r.timestamp, r.key, r.value, r.headers) for i, r in enumerate(records)]
    assert batch.records() == expected
    assert (batch.compression, batch.is_transactional, batch.base_sequence) == (codec, transactional, sequence)
    theirs = AioBatch(bytearray(data))
    assert theirs.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in theirs] == [
        (17 + r.offset_delta, r.timestamp, r.key, r.value, r.headers) for r in expected]


def _fix_crc(data: bytes) -> bytes:
    if len(data) < 21:
        return data
    return data[:17] + struct.pack(">I", crc32c(data[21:])) + data[21:]


@st.composite
def batches(draw) -> bytes:
    return encode_batch(0, draw(_records), compression=draw(st.sampled_from([0, 1, 2, 3, 4])))


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated(batches()), mutated(batches()).map(_fix_crc)),
       st.booleans())
def test_bad_batches_only_raise_records_errors(data: bytes, check_crc: bool) -> None:
    try:
        for batch in read_batches(data, check_crc=check_crc):
            batch.records()
    except RecordsError:
        pass


@FUZZ
@given(st.lists(st.binary(max_size=50), max_size=6), st.lists(st.integers(0, 400), max_size=8))
def test_frame_splitter_round_trips_any_chunking(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    splitter = FrameSplitter(64)
    got: list[bytes] = []
    prev = 0
    for cut in sorted({c for c in cuts if c <= len(stream)}) + [len(stream)]:
        got += splitter.feed(stream[prev:cut])
        prev = cut
    assert got == frames and splitter.buffered() == 0


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_frame_splitter_on_arbitrary_bytes(chunks: list[bytes]) -> None:
    splitter = FrameSplitter(1000)
    try:
        for chunk in chunks:
            for frame in splitter.feed(chunk):
                assert len(frame) <= 1000
    except FrameTooLarge as e:
        assert e.size < 0 or e.size > 1000
