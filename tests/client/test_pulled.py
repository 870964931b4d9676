"""Pulled records decoded field by field: the same message as a full decode, the same refusals."""

from __future__ import annotations

import dataclasses

import pytest

from txbroker.client.message import MessageExt, wire_body
from txbroker.client.pulled import PulledMessage, decode_pulled
from txbroker.store import record as rec


def _record(body: bytes, props: dict[str, str], *, phys: int, qoff: int, topic: str = "T",
            sys_flag: int = 0, prepared: int = 0) -> bytes:
    msg = rec.Message(topic=topic, queue_id=3, body=body, sys_flag=sys_flag, flag=7,
                      properties=props, born_timestamp=5, born_host=("10.0.0.2", 4321),
                      reconsume_times=1, prepared_transaction_offset=prepared)
    return rec.encode_record(msg, physical_offset=phys, queue_offset=qoff, store_timestamp=6,
                             store_host=("127.0.0.1", 10911))


def _records() -> bytes:
    packed, flag = wire_body(b"hello " * 2000, 4096, 1 << 20)
    return b"".join([
        _record(b"plain", {"UNIQ_KEY": "AB" * 16, "TAGS": "t", "KEYS": "k1 k2", "a": "b"},
                phys=100, qoff=0),
        _record(packed, {"TAGS": "z"}, phys=300, qoff=1, sys_flag=flag),
        _record(b"tx", {"UNIQ_KEY": "CD" * 16, "TRAN_MSG": "true", "PGROUP": "PG"},
                phys=9000, qoff=2, topic="Other", prepared=77),
    ])


def test_pulled_messages_equal_a_full_decode() -> None:
    raw = _records()
    pulled = decode_pulled(raw, "broker-a")
    full = [MessageExt.from_stored(s, "broker-a") for s in rec.decode_records(raw)]
    assert len(pulled) == 3
    for p, f in zip(pulled, full, strict=True):
        assert isinstance(p, PulledMessage) and isinstance(p, MessageExt)
        for fld in dataclasses.fields(MessageExt):
            assert getattr(p, fld.name) == getattr(f, fld.name), fld.name
    assert pulled[1].body == b"hello " * 2000
    assert pulled[2].transaction_id == "CD" * 16 and pulled[0].key_list == ["k1", "k2"]


def test_pulled_fields_are_assignable_and_decoded_once() -> None:
    msg = decode_pulled(_records(), "b")[0]
    assert msg.properties is msg.properties
    msg.transaction_id = "X"
    msg.msg_id = "Y"
    assert (msg.transaction_id, msg.msg_id) == ("X", "Y")


@pytest.mark.parametrize("damage, message", [
    (lambda r: r[:-1], "record size"),
    (lambda r: r[:40], "truncated record"),
    (lambda r: r[:4] + b"\0\0\0\0" + r[8:], "bad magic"),
    (lambda r: r[:-5] + b"\xff\xfe" + r[-3:], "not UTF-8"),
])
def test_malformed_pull_bodies_are_refused(damage, message: str) -> None:
    raw = _record(b"body", {"TAGS": "t", "UNIQ_KEY": "AB" * 16}, phys=1, qoff=0)
    with pytest.raises(rec.RecordError, match=message):
        decode_pulled(damage(raw), "b")
    with pytest.raises(rec.RecordError):
        rec.decode_records(damage(raw))


def test_a_compressed_body_that_does_not_inflate_is_refused_at_pull_time() -> None:
    raw = _record(b"not zlib at all", {}, phys=1, qoff=0, sys_flag=rec.COMPRESSED_FLAG)
    with pytest.raises(rec.RecordError, match="inflate"):
        decode_pulled(raw, "b")


def test_a_compressed_body_that_inflates_past_the_limit_is_refused_at_pull_time() -> None:
    # A few KiB from a broker (or anything that answers a pull) that claim more than the SDK
    # ever sends: refused before it is held in memory, not inflated whole.
    import zlib

    bomb = zlib.compress(b"\0" * (rec.MAX_SDK_BODY + 1), 9)
    raw = _record(bomb, {}, phys=1, qoff=0, sys_flag=rec.COMPRESSED_FLAG)
    with pytest.raises(rec.RecordError, match="inflates past"):
        decode_pulled(raw, "b")


def test_a_body_the_sdk_could_not_inflate_again_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="over the 67,108,864-byte limit of a body before compression"):
        wire_body(b"\0" * (rec.MAX_SDK_BODY + 1), 4096, 1 << 22)
