"""The HA messages (round trips, need-more, garbage) and the epoch file (RocketMQ's text
format, .bak fallback, truncation, the consistent point as EpochFileCacheTest checks it)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txbroker.store.epochs import (
    EpochFile,
    EpochFileError,
    decode,
    encode,
    find_consistent_point,
)
from txbroker.store.ha_codec import (
    MasterHandshake,
    MasterStreamDecoder,
    ProtocolError,
    SlaveAck,
    SlaveHandshake,
    SlaveStreamDecoder,
    Transfer,
    encode_ack,
    encode_master_handshake,
    encode_slave_handshake,
    encode_transfer,
)


def test_layouts_are_rocketmqs():
    assert encode_slave_handshake(SlaveHandshake(3, True, False)) == bytes.fromhex(
        "00000001" "0001" "0000" "0000000000000003")
    assert encode_ack(258) == bytes.fromhex("00000002" "0000000000000102")
    hs = encode_master_handshake(MasterHandshake(100, 2, [(1, 0), (2, 50)]))
    assert len(hs) == 20 + 24 and hs[:8] == bytes.fromhex("00000001" "00000018")
    t = encode_transfer(Transfer(64, 2, 50, 60, b"abc"))
    assert len(t) == 36 + 3 and t[:8] == bytes.fromhex("00000002" "00000003")


def test_round_trips_fed_a_byte_at_a_time():
    down = [MasterHandshake(100, 2, [(1, 0), (2, 50)]), Transfer(50, 2, 50, 40, b"x" * 50),
            Transfer(100, 2, 50, 100, b"")]
    d = MasterStreamDecoder()
    got = []
    for byte in b"".join(encode_master_handshake(m) if isinstance(m, MasterHandshake) else encode_transfer(m)
                         for m in down):
        d.feed(bytes([byte]))
        m = d.next()
        if m is not None:
            got.append(m)
    assert got == down
    u = SlaveStreamDecoder()
    u.feed(encode_slave_handshake(SlaveHandshake(9)) + encode_ack(7) + encode_ack(9)[:5])
    assert [u.next(), u.next(), u.next()] == [SlaveHandshake(9), SlaveAck(7), None]


def test_garbage_is_a_protocol_error():
    d = MasterStreamDecoder(max_body=1024)
    d.feed(encode_transfer(Transfer(0, 1, 0, 0, b""))[:4] + (2048).to_bytes(4, "big") + bytes(28))
    with pytest.raises(ProtocolError, match="body size 2048"):
        d.next()
    d = MasterStreamDecoder()
    d.feed(bytes.fromhex("00000005") + bytes(40))
    with pytest.raises(ProtocolError, match="unknown HA state 5"):
        d.next()
    d = MasterStreamDecoder()
    d.feed(bytes.fromhex("00000001" "00000005") + bytes(12))
    with pytest.raises(ProtocolError, match="whole epoch entries"):
        d.next()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_arbitrary_bytes_give_messages_need_more_or_protocol_error(data, master_side):
    d = MasterStreamDecoder(max_body=64) if master_side else SlaveStreamDecoder()
    d.feed(data)
    try:
        for _ in range(100):
            m = d.next()
            if m is None:
                break
            assert isinstance(m, (MasterHandshake, Transfer, SlaveHandshake, SlaveAck))
    except ProtocolError:
        pass


def test_epoch_file_text_format_round_trip(tmp_path):
    f = EpochFile(tmp_path / "epochFileCheckpoint")
    assert f.entries == [] and f.last_epoch == 0
    f.append(1, 0)
    f.append(2, 300)
    f.append(3, 300)  # re-elected before writing: the epoch is kept
    text = (tmp_path / "epochFileCheckpoint").read_text()
    lines = text.splitlines()
    assert lines[0] == "3" and lines[2:] == ["1-0", "2-300", "3-300"]
    assert int(lines[1]) == zlib.crc32(b"1-0\n2-300\n3-300\n") & 0x7FFFFFFF
    assert EpochFile(tmp_path / "epochFileCheckpoint").entries == [(1, 0), (2, 300), (3, 300)]
    assert decode(encode([(5, 7)]), "x") == [(5, 7)]
    assert decode("1\n0\n5-7\n", "x") == [(5, 7)]  # CRC 0: not checked
    with pytest.raises(ValueError):
        f.append(3, 400)  # the epoch must grow
    with pytest.raises(ValueError):
        f.append(4, 200)  # the start may not go back


def test_epoch_file_falls_back_to_bak(tmp_path):
    path = tmp_path / "epochFileCheckpoint"
    f = EpochFile(path)
    f.append(1, 0)
    f.append(2, 100)  # the .bak holds [1-0]
    path.write_text(path.read_text().replace("2-100", "2-999"))  # CRC no longer matches
    assert EpochFile(path).entries == [(1, 0)]
    (tmp_path / "epochFileCheckpoint.bak").write_text("garbage\n")
    with pytest.raises(EpochFileError, match="epochFileCheckpoint"):
        EpochFile(path)


def test_truncate_from(tmp_path):
    f = EpochFile(tmp_path / "e")
    for e, s in [(1, 100), (2, 300), (3, 500)]:
        f.append(e, s)
    f.truncate_from(501)
    assert f.entries == [(1, 100), (2, 300), (3, 500)]
    f.truncate_from(500)
    assert f.entries == [(1, 100), (2, 300)]
    f.truncate_from(0)
    assert f.entries == [] and EpochFile(tmp_path / "e").entries == []
    assert f.entry_at(10) == (0, 0, None)


def test_entry_at_bounds_a_transfer_batch(tmp_path):
    f = EpochFile(tmp_path / "e")
    f.append(1, 100)
    f.append(2, 300)
    assert f.entry_at(50) == (0, 0, 100)
    assert f.entry_at(100) == (1, 100, 300)
    assert f.entry_at(299) == (1, 100, 300)
    assert f.entry_at(300) == (2, 300, None)


# Mirrors EpochFileCacheTest: local = 1-100, 2-300, 3-500.
LOCAL = [(1, 100), (2, 300), (3, 500)]


def test_consistent_point_same_history_is_the_shorter_end():
    assert find_consistent_point(LOCAL, 700, [(1, 100), (2, 300), (3, 500)], 600) == 600
    assert find_consistent_point(LOCAL, 700, [(1, 100), (2, 300), (3, 500), (4, 800)], 900) == 700


def test_consistent_point_epoch_started_elsewhere_falls_back():
    # The remote's epoch 3 began at 450: agreement ends where epoch 2 ends on the shorter side.
    assert find_consistent_point(LOCAL, 700, [(1, 100), (2, 300), (3, 450), (4, 800)], 900) == 450


def test_consistent_point_remote_lacks_the_newest_local_epoch():
    # The local store was master under epoch 3 alone; the remote moved from 2 to 4 at 400.
    assert find_consistent_point(LOCAL, 700, [(1, 100), (2, 300), (4, 400)], 900) == 400


def test_consistent_point_none_in_common():
    assert find_consistent_point(LOCAL, 700, [(5, 0)], 900) == -1
    assert find_consistent_point(LOCAL, 700, [], 900) == -1
