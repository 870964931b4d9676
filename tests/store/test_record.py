"""Record codec: RocketMQ commitlog layout, properties encoding, batch bodies, message ids."""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txbroker.store import record as r

names = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="\x01\x02"), min_size=1, max_size=20)
values = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=30)


@given(
    topic=st.text(alphabet="abcXYZ_-%|0123", min_size=1, max_size=127),
    body=st.binary(max_size=2000),
    props=st.dictionaries(names, values, max_size=6),
    queue_id=st.integers(0, 1023),
    flag=st.integers(-(2**31), 2**31 - 1),
    qoff=st.integers(0, 2**62),
    poff=st.integers(0, 2**62),
    sys_flag=st.sampled_from([0, 1, 4, 8, 12]),
    ts=st.integers(0, 2**50),
)
@settings(max_examples=150, deadline=None)
def test_record_round_trip(topic, body, props, queue_id, flag, qoff, poff, sys_flag, ts):
    msg = r.Message(topic=topic, queue_id=queue_id, body=body, flag=flag, properties=props,
                    sys_flag=sys_flag, born_timestamp=ts, born_host=("10.1.2.3", 5555),
                    reconsume_times=3, prepared_transaction_offset=poff // 2)
    raw = r.encode_record(msg, physical_offset=poff, queue_offset=qoff, store_timestamp=ts + 1,
                          store_host=("127.0.0.1", 10911))
    out = r.decode_record(raw, check_crc=True)
    assert out.store_size == len(raw)
    assert (out.topic, out.queue_id, out.body, out.flag, out.properties) == (topic, queue_id, body, flag, props)
    assert (out.queue_offset, out.physical_offset, out.sys_flag) == (qoff, poff, sys_flag)
    assert out.born_host == ("10.1.2.3", 5555) and out.store_host == ("127.0.0.1", 10911)
    assert out.store_timestamp == ts + 1 and out.prepared_transaction_offset == poff // 2
    assert out.body_crc == zlib.crc32(body) & 0x7FFFFFFF


def test_layout_matches_rocketmq_fixed_offsets():
    msg = r.Message(topic="T", queue_id=2, body=b"hello", properties={"TAGS": "A"})
    raw = r.encode_record(msg, physical_offset=1000, queue_offset=7, store_timestamp=5,
                          store_host=("127.0.0.1", 20911))
    size, magic = struct.unpack_from(">iI", raw)
    assert size == len(raw) == 84 + 4 + 5 + 1 + 1 + 2 + len("TAGS\x01A")
    assert magic == 0xDAA320A7
    assert struct.unpack_from(">q", raw, 20)[0] == 7  # QUEUEOFFSET
    assert struct.unpack_from(">q", raw, 28)[0] == 1000  # PHYSICALOFFSET
    assert raw[84:88] == b"\x00\x00\x00\x05" and raw[88:93] == b"hello"


def test_decode_records_concatenation_and_damage():
    msgs = [r.Message(topic="T", queue_id=0, body=bytes([i]) * i) for i in range(1, 5)]
    raws = [r.encode_record(m, physical_offset=i, queue_offset=i, store_timestamp=1, store_host=("127.0.0.1", 1))
            for i, m in enumerate(msgs)]
    assert [m.body for m in r.decode_records(b"".join(raws))] == [m.body for m in msgs]
    with pytest.raises(r.RecordError):
        r.decode_records(b"".join(raws)[:-1])
    flipped = bytearray(raws[0])
    flipped[88] ^= 0xFF
    r.decode_record(bytes(flipped))  # clients do not check the CRC
    with pytest.raises(r.RecordError, match="CRC"):
        r.decode_record(bytes(flipped), check_crc=True)
    with pytest.raises(r.RecordError, match="magic"):
        r.decode_record(b"\x00\x00\x00\x60" + b"\x00" * 92)


def test_properties_tolerate_cpp_trailing_separator():
    text = "KEYS\x01KEY1 KEY2\x02TAGS\x01TagA\x02UNIQ_KEY\x010100007F\x02WAIT\x01true\x02color\x01red\x02"
    props = r.string_to_properties(text)
    assert props == {"KEYS": "KEY1 KEY2", "TAGS": "TagA", "UNIQ_KEY": "0100007F", "WAIT": "true", "color": "red"}
    assert r.string_to_properties(r.properties_to_string(props)) == props
    assert r.string_to_properties("a\x02\x01b\x02k\x01\x02ok\x01v") == {"ok": "v"}


@given(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=300),
                          st.dictionaries(names, values, max_size=3)), max_size=5))
@settings(max_examples=80, deadline=None)
def test_batch_round_trip(items):
    assert r.decode_batch(r.encode_batch(items)) == items


def test_batch_rejects_lying_lengths():
    good = r.encode_batch([(0, b"abc", {"K": "v"})])
    bad = bytearray(good)
    bad[0:4] = struct.pack(">i", 999)
    with pytest.raises(r.RecordError):
        r.decode_batch(bytes(bad))
    with pytest.raises(r.RecordError):
        r.decode_batch(good[:-1])


def test_offset_msg_id_matches_capture():
    assert r.create_offset_msg_id("127.0.0.1", 20911, 0) == "7F000001000051AF0000000000000000"
    assert r.decode_offset_msg_id("7F000001000051AF00000000000003E8") == ("127.0.0.1", 20911, 1000)
    for bad in ("xyz", "7F000001000051AF00000000000003EZ", ""):
        with pytest.raises(ValueError):
            r.decode_offset_msg_id(bad)


def test_tag_hash_is_java_string_hashcode():
    assert r.tag_hash("TagA") == 2598919
    assert r.tag_hash("") == 0
    assert -(2**31) <= r.tag_hash("a much longer tag that overflows 32 bits") < 2**31


_SAMPLE = r.encode_record(r.Message(topic="T", queue_id=1, body=b"body", properties={"TAGS": "A"}),
                          physical_offset=5, queue_offset=6, store_timestamp=7, store_host=("127.0.0.1", 1))


@given(st.one_of(
    st.binary(max_size=300),
    st.tuples(st.integers(0, len(_SAMPLE) - 1), st.integers(0, 255)).map(
        lambda p: _SAMPLE[:p[0]] + bytes([p[1]]) + _SAMPLE[p[0] + 1:]),
    st.integers(0, len(_SAMPLE)).map(lambda n: _SAMPLE[:n]),
))
@settings(max_examples=400, deadline=None)
def test_decoders_raise_only_record_error_on_garbage(data):
    """Arbitrary or damaged bytes give records or RecordError: never any other exception."""
    for decode in (lambda b: r.decode_records(b, check_crc=True), r.decode_batch):
        try:
            decode(data)
        except r.RecordError:
            pass


def test_view_record_reads_what_decode_record_reads() -> None:
    msg = r.Message(topic="RMQ_SYS_TRANS_OP_HALF_TOPIC", queue_id=0, body=b"17",
                    properties={"TAGS": "d", "TXB_STATE": "committed", "note": "\u00fcber"},
                    born_timestamp=1_700_000_000_123)
    raw = r.encode_record(msg, physical_offset=4096, queue_offset=3,
                          store_timestamp=1_700_000_000_456, store_host=("127.0.0.1", 10911))
    full = r.decode_record(raw)
    assert r.view_record(raw) == r.RecordView(4096, 1_700_000_000_123, 1_700_000_000_456,
                                              full.topic, full.body, full.properties)


def test_view_record_refuses_what_is_not_a_record() -> None:
    raw = r.encode_record(r.Message(topic="T", queue_id=0, body=b"abc"), physical_offset=0,
                          queue_offset=0, store_timestamp=1, store_host=("127.0.0.1", 1))
    with pytest.raises(r.RecordError, match="not a message record"):
        r.view_record(raw[:20])
    with pytest.raises(r.RecordError, match="not a message record"):
        r.view_record(raw[:4] + b"\x00" * 4 + raw[8:])
    with pytest.raises(r.RecordError, match="body length"):
        r.view_record(raw[:84] + struct.pack(">i", 1 << 20) + raw[88:])
