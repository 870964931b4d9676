"""The Kafka wire codec: primitives, framing, and the body tables of every served API and version,
checked against Kafka's own message definitions and against aiokafka's protocol classes."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
import struct
from pathlib import Path

import pytest

from txbroker.remoting.kafka import schema
from txbroker.remoting.kafka.apis import ADVERTISED, SERVED, ApiKey, is_flexible
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import (
    FrameSplitter,
    FrameTooLarge,
    UnsupportedVersion,
    api_versions_unsupported,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from txbroker.remoting.kafka.primitives import (
    KafkaDecodeError,
    Reader,
    Writer,
    varint_bytes,
)
from txbroker.remoting.kafka.schema import F, _in, fields

SERVED_VERSIONS = [(key, v) for key, (lo, hi) in SERVED.items() for v in range(lo, hi + 1)]
#: Versions served below Kafka 4's minimum (docs/kafka.md, "Versions"): kafka-python's copies
#: of Kafka 4's definitions no longer hold them, so they are checked against aiokafka's classes
#: (Kafka 3.9's layouts) instead.
BEYOND_KAFKA_4 = frozenset({(ApiKey.OFFSET_COMMIT, 0), (ApiKey.OFFSET_COMMIT, 1),
                            (ApiKey.DESCRIBE_CONFIGS, 0), (ApiKey.DESCRIBE_ACLS, 0),
                            (ApiKey.CREATE_ACLS, 0), (ApiKey.DELETE_ACLS, 0)})
KAFKA_4_VERSIONS = [kv for kv in SERVED_VERSIONS if kv not in BEYOND_KAFKA_4]


def _id(kv: tuple[ApiKey, int]) -> str:
    return f"{kv[0].name}-v{kv[1]}"


# --- primitives ------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, -1, 63, -64, 64, -65, 300, -300, 2**31 - 1, -2**31,
                               2**63 - 1, -2**63])
def test_zigzag_varints_round_trip(n: int) -> None:
    data = varint_bytes(n)
    r = Reader(data)
    assert r.varlong() == n
    assert r.remaining() == 0


def test_varint_encodings_are_kafkas() -> None:
    # zig-zag: 0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3; 7 bits a byte, low group first
    assert [varint_bytes(n) for n in (0, -1, 1, -2)] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    assert varint_bytes(64) == b"\x80\x01"
    assert varint_bytes(-65) == b"\x81\x01"
    w = Writer()
    w.uvarint(300)
    assert w.getvalue() == b"\xac\x02"


def test_compact_and_classic_types() -> None:
    w = Writer()
    w.string("ab")
    w.nullable_string(None)
    w.compact_string("ab")
    w.compact_nullable_string(None)
    w.bytes(b"x")
    w.nullable_bytes(None)
    w.compact_bytes(b"xy")
    w.compact_nullable_bytes(None)
    w.array([1, 2], Writer.int32)
    w.compact_array([7], Writer.int64)
    w.compact_array(None, Writer.int64)
    w.tagged_fields({5: b"zz", 1: b""})
    w.bool(True)
    data = w.getvalue()
    assert data[:4] == b"\x00\x02ab" and data[4:6] == b"\xff\xff" and data[6:9] == b"\x03ab"
    r = Reader(data)
    assert r.string() == "ab"
    assert r.nullable_string() is None
    assert r.compact_string() == "ab"
    assert r.compact_nullable_string() is None
    assert r.bytes() == b"x"
    assert r.nullable_bytes() is None
    assert r.compact_bytes() == b"xy"
    assert r.compact_nullable_bytes() is None
    assert r.array(Reader.int32) == [1, 2]
    assert r.compact_array(Reader.int64) == [7]
    assert r.compact_array(Reader.int64) is None
    assert r.tagged_fields() == {1: b"", 5: b"zz"}
    assert r.bool() is True
    assert r.remaining() == 0


def test_decode_errors_name_the_field_and_offset() -> None:
    with pytest.raises(KafkaDecodeError, match=r"client_id at offset 8"):
        decode_request(b"\x00\x03\x00\x01\x00\x00\x00\x05\x00")
    with pytest.raises(KafkaDecodeError, match="array count"):
        Reader(b"\x7f\xff\xff\xff").array(Reader.int32)
    with pytest.raises(KafkaDecodeError, match="invalid UTF-8"):
        Reader(b"\x00\x01\xff").string()
    with pytest.raises(KafkaDecodeError, match="longer than 5 bytes"):
        Reader(b"\xff\xff\xff\xff\xff\x01").uvarint()


# --- framing ---------------------------------------------------------------------------------

def test_api_versions_unsupported_golden_bytes() -> None:
    # answer to ApiVersions v4 with correlation id 7: size 16, correlation id, error 35,
    # one entry: key 18, 0..3
    assert api_versions_unsupported(7) == bytes.fromhex("00000010 00000007 0023 00000001 0012 0000 0003")


def test_api_versions_request_beyond_served_is_unsupported_with_its_correlation_id() -> None:
    frame = encode_request(18, 3, 42, "c", {"client_software_name": "x", "client_software_version": "1"})
    frame = frame[4:6] + b"\x00\x04" + frame[8:]  # the same request claiming v4
    with pytest.raises(UnsupportedVersion) as e:
        decode_request(frame)
    assert (e.value.api_key, e.value.api_version, e.value.correlation_id) == (18, 4, 42)


@pytest.mark.parametrize("key,version", [(0, 2), (0, 8), (1, 3), (1, 12), (99, 0), (-1, 0), (18, -1)])
def test_unknown_keys_and_unserved_versions(key: int, version: int) -> None:
    frame = b"".join(x.to_bytes(n, "big", signed=True) for x, n in ((key, 2), (version, 2), (9, 4)))
    with pytest.raises(UnsupportedVersion) as e:
        decode_request(frame + b"\xff\xff")
    assert e.value.correlation_id == 9


def test_header_v2_keeps_an_int16_client_id_and_null_means_empty() -> None:
    frame = encode_request(ApiKey.INIT_PRODUCER_ID, 4, 5, None, {"transaction_timeout_ms": 100})
    # size, key 22, v4, correlation 5, client id null (int16 -1), header tags, then the body
    assert frame[4:15] == bytes.fromhex("0016 0004 00000005 ffff 00")
    req = decode_request(frame[4:])
    assert req.client_id == ""
    assert req.body == {"transactional_id": None, "transaction_timeout_ms": 100,
                        "producer_id": -1, "producer_epoch": -1}


def test_response_headers() -> None:
    # flexible InitProducerId: header v1 (tagged fields after the correlation id)
    frame = encode_response(ApiKey.INIT_PRODUCER_ID, 2, 3, {"producer_id": 9})
    assert frame[4:9] == bytes.fromhex("00000003 00")
    assert decode_response(ApiKey.INIT_PRODUCER_ID, 2, frame[4:]) == (
        3, {"throttle_time_ms": 0, "error_code": 0, "producer_id": 9, "producer_epoch": 0})
    # ApiVersions v3 is flexible but its response header stays v0
    frame = encode_response(ApiKey.API_VERSIONS, 3, 4, {"api_keys": [
        {"api_key": 0, "min_version": 0, "max_version": 7}]})
    assert frame == bytes.fromhex("00000013 00000004 0000 02 0000 0000 0007 00 00000000 00")
    # non-flexible: header v0
    frame = encode_response(ApiKey.HEARTBEAT, 1, 5, {"error_code": ErrorCode.REBALANCE_IN_PROGRESS})
    assert frame == bytes.fromhex("0000000a 00000005 00000000 001b")


def test_frame_splitter_reassembles_and_refuses_oversized_frames() -> None:
    frames = [encode_request(12, 0, i, "c", {"group_id": "g", "member_id": "m"}) for i in range(3)]
    stream = b"".join(frames)
    splitter = FrameSplitter(1024)
    got: list[bytes] = []
    for i in range(len(stream)):  # one byte at a time
        got += splitter.feed(stream[i : i + 1])
    assert got == [f[4:] for f in frames]
    assert splitter.buffered() == 0
    assert FrameSplitter(1024).feed(stream + b"\x00\x00") == [f[4:] for f in frames]
    with pytest.raises(FrameTooLarge) as e:
        FrameSplitter(100).feed(b"\x00\x00\x00\x65")
    assert (e.value.size, e.value.max_size) == (101, 100)
    with pytest.raises(FrameTooLarge):
        FrameSplitter(100).feed(b"\xff\xff\xff\xff")
    assert FrameSplitter(100).feed(b"\x00\x00\x00\x00") == [b""]


# --- the tables against Kafka's message definitions ------------------------------------------

def _spec_dir() -> Path:
    import kafka.protocol

    return Path(kafka.protocol.__file__).parent / "schemas" / "resources"


def _load_spec(name: str) -> dict:
    text = (_spec_dir() / f"{name}.json").read_text()
    return json.loads("\n".join(line for line in text.splitlines() if not line.strip().startswith("//")))


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


# Kafka's names for AddPartitionsToTxn's v0-3 layout carry a version suffix or prefix; the body
# dicts use the plain names (docs/kafka.md, "Wire codec").
_ALIASES = {"v3_and_below_transactional_id": "transactional_id",
            "v3_and_below_producer_id": "producer_id",
            "v3_and_below_producer_epoch": "producer_epoch",
            "v3_and_below_topics": "topics",
            "results_by_topic_v3_and_below": "results",
            "results_by_partition": "results"}


def _spec_fields(spec_fields: list[dict], version: int, common: dict[str, list]) -> list:
    out = []
    for f in spec_fields:
        if "tag" in f or not _in(f["versions"], version):
            continue
        name = _snake(f["name"])
        name = _ALIASES.get(name, name)
        nullable = _in(f.get("nullableVersions"), version)
        t = f["type"]
        if t.startswith("[]") and ("fields" in f or t[2:] in common):
            out.append((name, _spec_fields(f.get("fields") or common[t[2:]], version, common), nullable))
        else:
            out.append((name, t.replace("[]", "[") + ("]" if t.startswith("[]") else ""), nullable))
    return out


def _our_fields(table: list[F], version: int) -> list:
    out = []
    for f in table:
        if not _in(f.versions, version):
            continue
        t = _our_fields(f.type, version) if isinstance(f.type, list) else f.type
        out.append((f.name, t, _in(f.nullable, version)))
    return out


def _spec_name(key: ApiKey) -> str:
    return "".join(part.capitalize() for part in key.name.split("_"))


@pytest.mark.parametrize("kv", KAFKA_4_VERSIONS, ids=_id)
def test_tables_match_kafkas_message_definitions(kv: tuple[ApiKey, int]) -> None:
    key, version = kv
    for is_request, suffix in ((True, "Request"), (False, "Response")):
        spec = _load_spec(_spec_name(key) + suffix)
        assert spec["apiKey"] == key
        assert _in(spec["validVersions"], version)
        assert _in(spec["flexibleVersions"], version) == is_flexible(key, version)
        assert _our_fields(fields(key, is_request), version) == _spec_fields(spec["fields"], version, {
            c["name"]: c["fields"] for c in spec.get("commonStructs", [])})


def test_every_version_kafka_4_serves_is_served() -> None:
    """At least Kafka 4's range of each API implemented (KIP-896 kept JoinGroup 0-1 and
    SyncGroup 0 for sarama, librdkafka and kafka-python; docs/kafka.md, "Versions"): a
    minimum above Kafka's closes connections Kafka would serve.  Produce is the one exception
    the other way: advertised from 0, as Kafka 4 does, served from 3."""
    below = set()
    for key, (lo, _hi) in SERVED.items():
        spec_lo = int(_load_spec(_spec_name(key) + "Request")["validVersions"].split("-")[0])
        assert lo <= spec_lo, f"{key.name}: served from {lo}, Kafka 4 serves from {spec_lo}"
        below |= {(key, v) for v in range(lo, spec_lo)}
    assert ADVERTISED[ApiKey.JOIN_GROUP][0] == 0 and ADVERTISED[ApiKey.SYNC_GROUP][0] == 0
    # what is served below Kafka 4 is exactly what the aiokafka check stands in for
    assert below == BEYOND_KAFKA_4


def test_old_group_versions_byte_for_byte() -> None:
    """JoinGroup v0/v1, SyncGroup v0 and OffsetCommit v0/v1 against bytes packed by hand from
    Kafka's definitions (3.9's for OffsetCommit): v0 joins carry no rebalance timeout, v0-1
    answers no throttle time, OffsetCommit v1 a commit timestamp after the offset."""
    def s(text: str) -> bytes:
        return struct.pack(">h", len(text)) + text.encode()

    protocols = struct.pack(">i", 1) + s("range") + struct.pack(">i", 2) + b"md"
    join = {"group_id": "g", "session_timeout_ms": 10000, "rebalance_timeout_ms": 30000,
            "member_id": "", "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"md"}]}
    head = struct.pack(">hhi", 11, 0, 9) + s("c")
    assert encode_request(11, 0, 9, "c", join)[4:] == (
        head + s("g") + struct.pack(">i", 10000) + s("") + s("consumer") + protocols)
    v1 = encode_request(11, 1, 9, "c", join)[4:]
    assert v1[len(head):] == s("g") + struct.pack(">ii", 10000, 30000) + s("") + s("consumer") + protocols
    answer = {"throttle_time_ms": 5, "error_code": 0, "generation_id": 1, "protocol_name": "range",
              "leader": "m", "member_id": "m", "members": [{"member_id": "m", "metadata": b"md"}]}
    body = (struct.pack(">hi", 0, 1) + s("range") + s("m") + s("m") + struct.pack(">i", 1) + s("m")
            + struct.pack(">i", 2) + b"md")
    for version in (0, 1):
        assert encode_response(11, version, 4, answer)[8:] == body
    assert encode_response(11, 2, 4, answer)[8:] == struct.pack(">i", 5) + body
    assert encode_response(14, 0, 4, {"throttle_time_ms": 5, "error_code": 0,
                                      "assignment": b"as"})[8:] == struct.pack(">hi", 0, 2) + b"as"
    sync = struct.pack(">hhi", 14, 0, 3) + s("c") + s("g") + struct.pack(">i", 1) + s("m") \
        + struct.pack(">i", 1) + s("m") + struct.pack(">i", 2) + b"as"
    assert decode_request(sync).body == {"group_id": "g", "generation_id": 1, "member_id": "m",
                                         "assignments": [{"member_id": "m", "assignment": b"as"}]}
    part = {"partition_index": 2, "committed_offset": 7, "commit_timestamp": 99,
            "committed_metadata": "x"}
    commit = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": "m",
              "topics": [{"name": "T", "partitions": [part]}]}
    topics = struct.pack(">i", 1) + s("T") + struct.pack(">i", 1) + struct.pack(">iq", 2, 7)
    assert encode_request(8, 0, 1, "c", commit)[4 + 8 + 3:] == s("g") + topics + s("x")
    assert encode_request(8, 1, 1, "c", commit)[4 + 8 + 3:] == (
        s("g") + struct.pack(">i", 1) + s("m") + topics + struct.pack(">q", 99) + s("x"))
    assert encode_request(8, 2, 1, "c", {**commit, "retention_time_ms": -1})[4 + 8 + 3:] == (
        s("g") + struct.pack(">i", 1) + s("m") + struct.pack(">q", -1) + topics + s("x"))


def test_advertised_ranges_have_tables_where_served() -> None:
    for key, (lo, hi) in ADVERTISED.items():
        slo, shi = SERVED[key]
        assert lo <= slo and shi == hi


# --- round trips of every API and version ----------------------------------------------------

_SAMPLES = {"int8": 1, "int16": -2, "int32": 70000, "int64": -(2**40), "bool": True, "string": "é-x",
            "bytes": b"\x00\x01b", "records": b"\x09" * 70}


def _sample(table: list[F], version: int, salt: int = 0) -> dict:
    body: dict = {}
    for i, f in enumerate(table):
        if not _in(f.versions, version):
            continue
        if isinstance(f.type, list):
            body[f.name] = [_sample(f.type, version, salt + i + j) for j in range(2)]
        elif f.type.startswith("["):
            inner = _SAMPLES[f.type[1:-1]]
            body[f.name] = [inner, inner] if isinstance(inner, str) else [inner, salt + i]
        elif isinstance(_SAMPLES[f.type], int) and not isinstance(_SAMPLES[f.type], bool):
            body[f.name] = _SAMPLES[f.type] + salt + i
        else:
            body[f.name] = _SAMPLES[f.type]
    return body


@pytest.mark.parametrize("kv", SERVED_VERSIONS, ids=_id)
def test_every_request_and_response_round_trips(kv: tuple[ApiKey, int]) -> None:
    key, version = kv
    body = _sample(fields(key, True), version)
    req = decode_request(encode_request(key, version, 77, "client-1", body)[4:])
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (key, version, 77, "client-1")
    assert req.body == body
    body = _sample(fields(key, False), version)
    assert decode_response(key, version, encode_response(key, version, 78, body)[4:]) == (78, body)


@pytest.mark.parametrize("kv", SERVED_VERSIONS, ids=_id)
def test_omitted_fields_take_their_defaults_and_truncation_is_a_decode_error(kv) -> None:
    key, version = kv
    frame = encode_response(key, version, 1, {})
    _, body = decode_response(key, version, frame[4:])
    for f in fields(key, False):
        if _in(f.versions, version) and f.default is not schema._MISSING:
            assert body[f.name] == f.default
    full = encode_request(key, version, 3, "c", _sample(fields(key, True), version))[4:]
    for cut in range(8, len(full), max(1, len(full) // 25)):
        try:
            decode_request(full[:cut])
        except KafkaDecodeError:
            continue
        # a prefix may parse only when what was cut off is all empty tails: never the case
        # for our samples, every field is non-empty
        pytest.fail(f"prefix of {cut} bytes decoded")


def test_response_defaults_follow_kafkas_spec() -> None:
    _, meta = decode_response(3, 8, encode_response(3, 8, 1, {"topics": [{"name": "t", "partitions": [{}]}]})[4:])
    assert meta["cluster_authorized_operations"] == -2147483648
    assert meta["controller_id"] == -1 and meta["cluster_id"] is None
    assert meta["topics"][0]["topic_authorized_operations"] == -2147483648
    assert meta["topics"][0]["partitions"][0]["leader_epoch"] == -1
    _, fetch = decode_response(1, 11, encode_response(1, 11, 1, {"responses": [{"topic": "t", "partitions": [{}]}]})[4:])
    part = fetch["responses"][0]["partitions"][0]
    assert (part["last_stable_offset"], part["log_start_offset"], part["preferred_read_replica"]) == (-1, -1, -1)
    assert part["aborted_transactions"] is None and part["records"] is None
    _, produce = decode_response(0, 7, encode_response(0, 7, 1, {"responses": [{"name": "t", "partition_responses": [{"base_offset": 5}]}]})[4:])
    assert produce["responses"][0]["partition_responses"][0] == {
        "index": 0, "error_code": 0, "base_offset": 5, "log_append_time_ms": -1, "log_start_offset": -1}


def test_wrong_types_are_a_clear_encode_error() -> None:
    with pytest.raises(ValueError, match="HEARTBEAT v1 response"):
        encode_response(12, 1, 1, {"error_code": "x"})
    with pytest.raises(ValueError, match="FIND_COORDINATOR v1 response"):
        encode_response(10, 1, 1, {"host": None})


# --- against aiokafka's protocol classes -----------------------------------------------------

#: aiokafka classes that do not match Kafka's definition: DescribeAcls v2 is flexible in Kafka
#: (and in the table test above) but aiokafka declares it with v1's non-flexible schema.
_AIOKAFKA_MISDECLARED = frozenset({"DescribeAclsRequest_v2", "DescribeAclsResponse_v2"})


def _aiokafka_structs() -> list[type]:
    import aiokafka.protocol as proto
    from aiokafka.protocol.api import RequestStruct, Response

    out = []
    for mod in pkgutil.iter_modules(proto.__path__):
        module = importlib.import_module(f"aiokafka.protocol.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, (RequestStruct, Response)) or cls in (RequestStruct, Response):
                continue
            key, version = getattr(cls, "API_KEY", None), getattr(cls, "API_VERSION", None)
            if cls.__name__ in _AIOKAFKA_MISDECLARED:
                continue
            if isinstance(key, int) and isinstance(version, int) and key in SERVED \
                    and SERVED[ApiKey(key)][0] <= version <= SERVED[ApiKey(key)][1]:
                out.append(cls)
    return sorted(set(out), key=lambda c: c.__name__)


def _leaves(value, out: list) -> list:
    """Values in wire order, with array lengths: our dicts and aiokafka's structs compare."""
    from aiokafka.protocol.struct import Struct

    if isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, Struct):
        for name in value.SCHEMA.names:
            _leaves(value.__dict__[name], out)
    elif isinstance(value, list):
        out.append(("len", len(value)))
        for v in value:
            _leaves(v, out)
    elif isinstance(value, tuple):
        for v in value:
            _leaves(v, out)
    else:
        out.append(bytes(value) if isinstance(value, (bytearray, memoryview)) else value)
    return out


def test_aiokafka_reads_what_we_write() -> None:
    from aiokafka.protocol.api import RequestStruct

    checked = set()
    for cls in _aiokafka_structs():
        key, version = cls.API_KEY, cls.API_VERSION
        is_request = issubclass(cls, RequestStruct)
        body = _sample(fields(key, is_request), version)
        if is_request:
            frame = encode_request(key, version, 1, "c", body)
            payload = decode_request_payload(frame)
        else:
            frame = encode_response(key, version, 1, body)
            payload = frame[8 + (1 if is_flexible(key, version) and key != 18 else 0):]
        theirs = cls.decode(payload)
        assert _leaves(theirs, []) == _leaves(body, []), cls.__name__
        assert theirs.encode() == payload, cls.__name__
        checked.add((key, version, is_request))
    # every API aiokafka speaks, at the versions it sends (docs/kafka.md "Versions")
    assert {(k, v) for k, v, _ in checked} >= {(3, 5), (0, 7), (1, 11), (2, 3), (10, 1), (11, 5),
                                               (14, 3), (12, 1), (13, 1), (8, 3), (9, 3), (19, 3),
                                               (11, 0), (11, 1), (14, 0), (8, 0), (8, 1),
                                               (32, 0), (29, 0), (30, 0), (31, 0),
                                               (22, 0), (24, 0), (25, 0), (26, 0), (28, 0), (18, 0)}


def decode_request_payload(frame: bytes) -> bytes:
    """The body bytes of a non-flexible request frame (after the header v1)."""
    client_len = int.from_bytes(frame[12:14], "big", signed=True)
    return frame[14 + max(client_len, 0):]


def test_kafka_python_request_classes_read_what_we_write() -> None:
    """kafka-python builds its classes from the same JSON definitions, flexible versions included."""
    from kafka.protocol.metadata import ApiVersionsRequest

    frame = encode_request(18, 3, 5, "kp", {"client_software_name": "kafka-python", "client_software_version": "3.0"})
    body = frame[4 + 8 + 2 + 2 + 1:]  # size, key/version/correlation, client id "kp", header tags
    theirs = ApiVersionsRequest[3].decode(body)
    assert theirs.client_software_name == "kafka-python"
    assert theirs.client_software_version == "3.0"


# --- against kafka-python's message classes (generated from the same JSON, flexible ones too) --

def _kafka_python_classes() -> dict[tuple[int, bool], type]:
    import kafka.protocol as kp
    from kafka.protocol.api_message import ApiMessage

    for mod in pkgutil.walk_packages(kp.__path__, "kafka.protocol."):
        if ".old" not in mod.name and "generate" not in mod.name:
            importlib.import_module(mod.name)
    out: dict[tuple[int, bool], type] = {}
    todo = list(ApiMessage.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if isinstance(getattr(cls, "API_KEY", None), int) and cls.API_KEY in SERVED \
                and cls.__module__.startswith("kafka.protocol.") and "_v" not in cls.__name__:
            out[(cls.API_KEY, cls.__name__.endswith("Request"))] = cls
    return out


_TAGGED = {"supported_features", "finalized_features", "finalized_features_epoch", "zk_migration_ready"}


def _renamed(value):
    """kafka-python's dict with our names; bytes as text (its to_dict renders them so)."""
    if isinstance(value, dict):
        # kafka-python turns the authorized-operations bit fields into sets under its own
        # names, and shows ApiVersions v3's absent tagged fields with their defaults
        return {_ALIASES.get(k, k): _renamed(v) for k, v in value.items()
                if not k.endswith("authorized_operations") and k not in _TAGGED}
    if isinstance(value, list):
        return [_renamed(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("latin-1")
    return value


@pytest.mark.parametrize("kv", KAFKA_4_VERSIONS, ids=_id)
def test_kafka_python_reads_what_we_write(kv: tuple[ApiKey, int]) -> None:
    classes = _kafka_python_classes()
    key, version = kv
    for is_request in (True, False):
        body = _sample(fields(key, is_request), version)
        if key == ApiKey.API_VERSIONS and not is_request:
            body["error_code"] = 0  # kafka-python reads any ApiVersions error reply as v0
        if is_request:
            frame = encode_request(key, version, 5, "kp", body)
        else:
            frame = encode_response(key, version, 5, body)
        theirs = classes[(key, is_request)].decode(frame, version=version, header=True, framed=True)
        assert _renamed(theirs.to_dict()) == _renamed(body)
