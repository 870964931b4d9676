"""The record mapping (docs/kafka.md, "Record mapping"): Kafka record -> stored RocketMQ record
-> Kafka record gives the record back, whatever its key, value and headers hold."""

from __future__ import annotations

import pytest

from txbroker.remoting.kafka.records import Record
from txbroker.service.kafka.mapping import (
    PROPERTY_HEADERS_B64,
    PROPERTY_KEY_B64,
    PROPERTY_NULL_VALUE,
    message_to_record,
    record_to_message,
)
from txbroker.store.record import Message, StoredMessage, decode_record, encode_record

HOST = ("10.1.2.3", 4567)


def _store(msg: Message, queue_offset: int = 7) -> StoredMessage:
    """Through the real commitlog record layout (properties serialised as text)."""
    raw = encode_record(msg, physical_offset=100, queue_offset=queue_offset,
                        store_timestamp=1_700_000_000_999, store_host=("127.0.0.1", 10911))
    return decode_record(raw)


def _round_trip(record: Record) -> tuple[Message, Record]:
    msg = record_to_message("T", 2, record, born_host=HOST)
    back = message_to_record(_store(msg), 3)
    return msg, back


def test_plain_record_maps_to_body_keys_properties_and_born_time() -> None:
    rec = Record(0, 1_700_000_000_123, b"order-1", b"payload", [("trace", b"abc"), ("TAGS", b"t1")])
    msg, back = _round_trip(rec)
    assert msg.body == b"payload"
    assert msg.properties == {"KEYS": "order-1", "trace": "abc", "TAGS": "t1"}
    assert msg.born_timestamp == 1_700_000_000_123 and msg.born_host == HOST
    assert (msg.topic, msg.queue_id) == ("T", 2)
    assert back.key == b"order-1" and back.value == b"payload"
    assert back.timestamp == 1_700_000_000_123 and back.offset_delta == 3
    assert sorted(back.headers) == [("TAGS", b"t1"), ("trace", b"abc")]


def test_null_key_and_null_value_round_trip() -> None:
    msg, back = _round_trip(Record(0, 5, None, None, []))
    assert msg.body == b"" and msg.properties == {PROPERTY_NULL_VALUE: "1"}
    assert back.key is None and back.value is None and back.headers == []


def test_empty_value_is_not_null() -> None:
    _, back = _round_trip(Record(0, 5, None, b"", []))
    assert back.value == b""


@pytest.mark.parametrize("key", [b"\xff\xfe binary", b"a\x01b", b"a\x02b", b""])
def test_key_that_cannot_be_a_property_goes_base64(key: bytes) -> None:
    msg, back = _round_trip(Record(0, 5, key, b"v", []))
    assert "KEYS" not in msg.properties and PROPERTY_KEY_B64 in msg.properties
    assert back.key == key


def test_odd_headers_round_trip_in_order() -> None:
    headers = [("bin", b"\x00\xff"), ("sep", b"x\x02y"), ("empty", b""), ("null", None),
               ("dup", b"1"), ("dup", b"2"), ("DELAY", b"3"), ("KEYS", b"k"), ("a\x01b", b"v")]
    msg, back = _round_trip(Record(0, 5, None, b"v", headers))
    # Only the first "dup" is a plain property; system names never are (no header may delay).
    assert msg.properties["dup"] == "1"
    assert "DELAY" not in msg.properties and msg.properties.get("KEYS") is None
    assert PROPERTY_HEADERS_B64 in msg.properties
    assert sorted(back.headers, key=repr) == sorted(headers, key=repr)


def test_rocketmq_message_hides_system_properties_and_inflates_bodies() -> None:
    import zlib

    msg = Message("T", 0, zlib.compress(b"big body"), sys_flag=0x1,
                  properties={"KEYS": "k1 k2", "TAGS": "tagA", "UNIQ_KEY": "ABC", "WAIT": "true",
                              "PGROUP": "pg", "color": "red"},
                  born_timestamp=42)
    rec = message_to_record(_store(msg), 0)
    assert rec.value == b"big body" and rec.key == b"k1 k2" and rec.timestamp == 42
    assert sorted(rec.headers) == [("TAGS", b"tagA"), ("color", b"red")]


def test_born_time_unset_uses_store_time() -> None:
    rec = message_to_record(_store(Message("T", 0, b"x")), 0)
    assert rec.timestamp == 1_700_000_000_999
