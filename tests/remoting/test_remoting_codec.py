"""Frame codec: captured C++ client frames, round trips, strictness, and the fuzz rule."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txbroker.remoting.codec import (
    MAX_HEADER_SIZE,
    FrameDecoder,
    decode_frame,
    encode,
    frame_length,
)
from txbroker.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    RequestCode,
    SerializeType,
)
from txbroker.remoting.command import ProtocolError, RemotingCommand
from txbroker.remoting.headers import PullMessageRequestHeader, SendMessageRequestHeader

VECTORS = Path(__file__).resolve().parent.parent / "vectors"


def _vector_frames(name: str | None = None):
    """(file, line, frame bytes) for every captured client-to-server frame."""
    files = [VECTORS / name] if name else sorted(VECTORS.glob("*.jsonl"))
    for path in files:
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            if line.get("dir") != "in":
                continue
            header = line["header_raw"].encode()
            assert len(header) == line["header_len"]
            # Bodies are stored decoded (text, JSON, batch entries); their length is exact, and
            # the header is what these tests check, so a same-length placeholder stands in.
            frame = bytes.fromhex(line["prefix_hex"]) + header + b"\xab" * line["body_len"]
            yield path.name, line, frame


def _normalised(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def test_every_captured_frame_decodes_with_its_documented_fields() -> None:
    count = 0
    for name, line, frame in _vector_frames():
        assert frame_length(frame) == len(frame), name
        cmd = decode_frame(frame)
        hdr = line["header"]
        assert cmd.code == line["code"] == hdr["code"]
        assert cmd.opaque == hdr["opaque"] and cmd.flag == hdr["flag"] == 0
        assert cmd.language == "CPP" and cmd.version == 63 and cmd.remark == ""
        assert cmd.serialize_type == SerializeType.JSON
        assert cmd.ext_fields == {k: _normalised(v) for k, v in hdr["extFields"].items()}
        assert all(isinstance(v, str) for v in cmd.ext_fields.values())
        assert len(cmd.body) == line["body_len"]
        count += 1
    assert count > 400


def test_send_sync_header_fields_and_numeric_normalisation() -> None:
    sends = [(line, decode_frame(f)) for _, line, f in _vector_frames("send_sync.jsonl")
             if line["code"] == RequestCode.SEND_MESSAGE]
    assert len(sends) == 1
    line, cmd = sends[0]
    assert line["prefix_hex"].startswith("00000228")  # docs/protocol.md §1 worked example
    ext = cmd.ext_fields
    # JSON numbers on the wire, strings after decoding
    assert isinstance(line["header"]["extFields"]["queueId"], int)
    assert ext["queueId"] == "0" and ext["sysFlag"] == "0" and ext["flag"] == "0"
    assert ext["defaultTopicQueueNums"] == "4" and ext["batch"] == "0"
    header = SendMessageRequestHeader.from_command(cmd.code, ext)
    assert header.topic == "TopicTest" and header.producer_group == "PID_CAPTURE"
    assert header.queue_id == 0 and header.default_topic == "TBW102" and header.batch is False
    assert header.unit_mode is False and header.born_timestamp > 1_700_000_000_000
    assert "UNIQ_KEY\x01" in header.properties and header.properties.endswith("\x02")
    assert len(cmd.body) == 14


def test_batch_flag_one_means_batch() -> None:
    cmds = [decode_frame(f) for _, line, f in _vector_frames("send_batch.jsonl")
            if line["code"] == RequestCode.SEND_MESSAGE]
    assert len(cmds) == 1 and cmds[0].ext_fields["batch"] == "1"
    assert SendMessageRequestHeader.from_command(cmds[0].code, cmds[0].ext_fields).batch is True


def test_push_consumer_pull_headers() -> None:
    pulls = [decode_frame(f) for _, line, f in _vector_frames("push_consumer.jsonl")
             if line["code"] == RequestCode.PULL_MESSAGE]
    assert pulls
    for cmd in pulls:
        h = PullMessageRequestHeader.from_ext(cmd.ext_fields)
        assert h.max_msg_nums == 32 and h.suspend and h.has_subscription
        assert h.suspend_timeout_millis == 15000


def test_trailing_newline_and_numeric_booleans_in_ext() -> None:
    header = b'{"code":10,"extFields":{"a":1,"b":true,"c":false,"d":2.0,"e":null,"f":"x"},' \
             b'"flag":0,"opaque":7}\n'
    cmd = decode_frame(struct.pack(">ii", 4 + len(header), len(header)) + header)
    assert cmd.ext_fields == {"a": "1", "b": "true", "c": "false", "d": "2", "f": "x"}
    assert cmd.language == "JAVA" and cmd.opaque == 7


# --- round trips ----------------------------------------------------------------------------

_text = st.text(max_size=40)
_int32 = st.integers(-(1 << 31), (1 << 31) - 1)
_int16 = st.integers(-(1 << 15), (1 << 15) - 1)


@st.composite
def commands(draw, serialize_type: int):
    binary = serialize_type == SerializeType.ROCKETMQ
    remark = draw(st.none() | _text)
    if binary and remark == "":
        remark = None  # the binary form cannot tell "" from null
    ext = draw(st.dictionaries(st.text(min_size=1, max_size=12), _text, max_size=8))
    return RemotingCommand(
        code=draw(_int16 if binary else _int32),
        opaque=draw(_int32),
        flag=draw(st.integers(0, 3)),
        language=draw(st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"])),
        version=draw(_int16 if binary else _int32),
        remark=remark,
        ext_fields=ext,
        body=draw(st.binary(max_size=300)),
        serialize_type=serialize_type,
    )


@settings(max_examples=150, deadline=None)
@given(commands(SerializeType.JSON))
def test_json_round_trip(cmd: RemotingCommand) -> None:
    assert decode_frame(encode(cmd)) == cmd


@settings(max_examples=150, deadline=None)
@given(commands(SerializeType.ROCKETMQ))
def test_binary_round_trip(cmd: RemotingCommand) -> None:
    frame = encode(cmd)
    assert frame[4] == 1  # serialize type in the high byte
    assert decode_frame(frame) == cmd


@settings(max_examples=60, deadline=None)
@given(st.lists(commands(SerializeType.JSON) | commands(SerializeType.ROCKETMQ), min_size=1,
                max_size=6), st.data())
def test_decoder_reassembles_any_split(cmds, data) -> None:
    stream = b"".join(encode(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    dec = FrameDecoder()
    out = []
    prev = 0
    for cut in cuts + [len(stream)]:
        out += dec.feed(stream[prev:cut])
        prev = cut
    assert out == cmds and dec.buffered == 0


def test_response_always_has_string_ext_fields_and_response_flag() -> None:
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"})
    resp = req.response(0, ext={"queueId": 3, "queueOffset": 42, "ok": True, "none": None})
    doc = orjson.loads(encode(resp)[8:])
    assert doc["flag"] & FLAG_RESPONSE
    assert doc["extFields"] == {"queueId": "3", "queueOffset": "42", "ok": "true"}
    bare = orjson.loads(encode(req.response(0))[8:])
    assert bare["extFields"] == {}
    # a request without ext fields leaves the key out, as fastjson does for null
    assert "extFields" not in orjson.loads(encode(RemotingCommand.request(34))[8:])


def test_response_uses_request_serialize_type() -> None:
    req = RemotingCommand.request(11, {"a": "b"}, serialize_type=SerializeType.ROCKETMQ)
    resp = req.response(19, "nothing", {"x": "1"})
    frame = encode(resp)
    assert frame[4] == 1
    back = decode_frame(frame)
    assert back.is_response and back.remark == "nothing" and back.ext_fields == {"x": "1"}


def test_oneway_and_response_flags() -> None:
    req = RemotingCommand.request(37, oneway=True)
    assert req.is_oneway and not req.is_response and req.flag == FLAG_ONEWAY
    assert req.response().is_response


# --- strictness -----------------------------------------------------------------------------


def _frame(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (kind << 24) | len(header)) + header + body


@pytest.mark.parametrize("header, message", [
    (b"[1,2]", "must be an object"),
    (b'"x"', "must be an object"),
    (b"{not json", "not valid JSON"),
    (b'{"code":"10"}', "'code' must be an integer"),
    (b'{"code":1.5}', "'code' must be an integer"),
    (b'{"code":true}', "'code' must be an integer"),
    (b'{"flag":0}', "no 'code'"),
    (b'{"code":10,"opaque":"1"}', "'opaque' must be an integer"),
    (b'{"code":10,"opaque":4294967296}', "outside the int32 range"),
    (b'{"code":10,"extFields":[]}', "'extFields' must be an object"),
    (b'{"code":10,"extFields":{"a":{"b":1}}}', "extFields['a']"),
    (b'{"code":10,"extFields":{"a":[1]}}', "extFields['a']"),
    (b'{"code":10,"remark":5}', "'remark' must be a string"),
    (b'{"code":10,"language":[]}', "'language'"),
    (b'{"code":10,"remark":"\xff\xfe"}', "not UTF-8"),
])
def test_bad_json_headers_are_protocol_errors(header: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message.replace("[", r"\[").replace("(", r"\(")):
        decode_frame(_frame(header))


def test_length_errors() -> None:
    with pytest.raises(ProtocolError, match="below the minimum"):
        frame_length(struct.pack(">i", 3))
    with pytest.raises(ProtocolError, match="below the minimum"):
        frame_length(struct.pack(">i", -5))
    with pytest.raises(ProtocolError, match="header length 100 exceeds"):
        frame_length(struct.pack(">ii", 10, 100))
    with pytest.raises(ProtocolError, match="exceeds the maximum frame size 1024"):
        frame_length(struct.pack(">i", 2000), max_frame_size=1024)
    with pytest.raises(ProtocolError, match="unknown serialize type 7"):
        frame_length(struct.pack(">ii", 10, (7 << 24) | 2))
    big = MAX_HEADER_SIZE + 1
    with pytest.raises(ProtocolError, match="exceeds the maximum"):
        frame_length(struct.pack(">ii", big + 4, big), max_frame_size=1 << 24)
    assert frame_length(b"\x00\x00") is None
    assert frame_length(struct.pack(">ii", 100, 10)) is None  # need more
    with pytest.raises(ProtocolError, match="does not match"):
        decode_frame(_frame(b'{"code":1}') + b"extra")


def test_oversize_refused_before_buffering() -> None:
    dec = FrameDecoder(max_frame_size=4096)
    with pytest.raises(ProtocolError, match="maximum frame size"):
        dec.feed(struct.pack(">i", 1 << 20))
    assert dec.buffered == 0
    with pytest.raises(ProtocolError, match="already failed"):
        dec.feed(b"anything")


@pytest.mark.parametrize("header, message", [
    (b"\x00\x0a\x00", "shorter than"),
    (struct.pack(">hBhii", 10, 0, 1, 1, 0) + struct.pack(">i", 50) + struct.pack(">i", 0), "remark length 50"),
    (struct.pack(">hBhii", 10, 0, 1, 1, 0) + struct.pack(">i", -1) + struct.pack(">i", 0), "negative"),
    (struct.pack(">hBhii", 10, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 9), "extFields length 9"),
    (struct.pack(">hBhii", 10, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 1) + b"\x00", "truncated"),
    (struct.pack(">hBhii", 10, 0, 1, 1, 0) + struct.pack(">i", 2) + b"\xff\xfe" + struct.pack(">i", 0), "not UTF-8"),
    (struct.pack(">hBhii", 10, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 0) + b"zz", "trailing"),
])
def test_bad_binary_headers(header: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_frame(_frame(header, kind=1))


# --- fuzz: frames, need-more or ProtocolError, nothing else ------------------------------------

_valid = encode(RemotingCommand.request(10, {"topic": "T", "queueId": "1"}, b"body"))
_valid_bin = encode(RemotingCommand.request(11, {"k": "v"}, b"", serialize_type=SerializeType.ROCKETMQ))


@st.composite
def _mutated(draw):
    base = bytearray(draw(st.sampled_from([_valid, _valid_bin])))
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(base) - 1))
        base[i] = draw(st.integers(0, 255))
    return bytes(base)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=64) | _mutated(), max_size=6))
def test_fuzz_decoder_only_raises_protocol_error(chunks) -> None:
    dec = FrameDecoder(max_frame_size=4096)
    for chunk in chunks:
        try:
            for cmd in dec.feed(chunk):
                assert isinstance(cmd, RemotingCommand)
                assert all(isinstance(v, str) for v in cmd.ext_fields.values())
        except ProtocolError:
            break
        assert dec.buffered <= 4096


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_json_header_bytes(header: bytes) -> None:
    try:
        decode_frame(_frame(header))
    except ProtocolError:
        pass


def test_encode_accepts_any_bytes_like_body() -> None:
    data = bytearray(b"record bytes")
    for body in (data, memoryview(data)[2:8]):
        cmd = RemotingCommand.request(11).response(0, body=body)  # type: ignore[arg-type]
        assert decode_frame(encode(cmd)).body == bytes(body)


def test_encode_refuses_what_cannot_be_a_frame() -> None:
    with pytest.raises(struct.error):  # our bug, not the peer's: an ordinary exception
        encode(RemotingCommand(code=70000, serialize_type=SerializeType.ROCKETMQ))
