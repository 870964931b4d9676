"""Whom an HA master serves and whom an HA slave follows: the cluster-secret challenge-response,
stale masters, logs without epoch history, a slave behind the master's first offset, and
corrupt replicated bytes — on real stores and real loopback sockets (fake peers are real TCP
peers speaking the wire format by hand)."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path

import pytest
from support.store import opened
from support.store import store_config as cfg
from support.waiting import eventually

from txbroker.store.ha_codec import (
    AuthChallenge,
    AuthHello,
    AuthProof,
    MasterHandshake,
    MasterStreamDecoder,
    SlaveHandshake,
    Transfer,
    encode_ack,
    encode_auth_challenge,
    encode_auth_hello,
    encode_auth_proof,
    encode_master_handshake,
    encode_slave_handshake,
    encode_transfer,
    slave_proof,
)
from txbroker.store.ha_master import HAMaster
from txbroker.store.ha_slave import HASlave
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message
from txbroker.store.reput import CorruptRecord

SECRET = "s3cret-of-the-cluster"


def msg(i: int, size: int = 300) -> Message:
    return Message(topic="T", queue_id=i % 3, body=bytes([i % 251]) * size,
                   properties={"TAGS": f"t{i % 2}", "KEYS": f"k{i}"})


def log_bytes(store: MessageStore) -> bytes:
    assert store.commitlog is not None
    return b"".join(seg.read(0, seg.wrote) for seg in store.commitlog.segments)


def slave_of(store: MessageStore, ha: HAMaster | tuple[str, int], **kw) -> HASlave:
    addr = (ha.host, ha.port) if isinstance(ha, HAMaster) else ha
    kw.setdefault("stalled_backoff", 0.05)
    follower = HASlave(store, lambda: addr, heartbeat=0.05, backoff=0.02, max_backoff=0.1, **kw)
    follower.start()
    return follower


async def shut(*things) -> None:
    for t in things:
        await t.close()


def lines(caplog, text: str, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and text in r.getMessage()]


async def read_all(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    """Everything the peer sends until it closes (bounded)."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
        if not chunk:
            return out
        out += chunk
    raise AssertionError(f"the peer did not close within {timeout}s (got {len(out)} bytes)")


# --- authentication ------------------------------------------------------------------------


async def test_pair_with_the_same_secret_replicates(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01, secret=SECRET)
    await ha.start()
    ha.become(1)
    follower = slave_of(slave, ha, secret=SECRET, slave_id=2)
    try:
        for i in range(50):
            await master.put(msg(i))
        await eventually(lambda: slave.max_physical_offset == master.max_physical_offset)
        assert log_bytes(slave) == log_bytes(master)
        assert [i.slave_id for i in ha.slaves()] == [2] and follower.problem is None
    finally:
        await shut(follower, ha, master, slave)


async def test_fake_slave_that_skips_authentication_gets_nothing(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    master = await opened(cfg(tmp_path / "m"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01, secret=SECRET)
    await ha.start()
    ha.become(1)
    for i in range(20):
        await master.put(msg(i))
    try:
        for _ in range(3):  # RocketMQ's plain handshake and an ack of 0: the old way in
            reader, writer = await asyncio.open_connection(ha.host, ha.port)
            writer.write(encode_slave_handshake(SlaveHandshake(1)) + encode_ack(0))
            assert await read_all(reader) == b""  # no epochs, no bytes: closed
            writer.close()
        assert ha.slaves() == []
        said = lines(caplog, "did not authenticate")
        assert len(said) == 1 and "127.0.0.1:" in said[0], said
        assert len(lines(caplog, "did not authenticate", logging.DEBUG)) == 3
    finally:
        await shut(ha, master)


async def test_fake_slave_with_a_wrong_secret_gets_only_the_challenge(tmp_path, caplog):
    master = await opened(cfg(tmp_path / "m"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01, secret=SECRET)
    await ha.start()
    ha.become(1)
    await master.put(msg(1))
    try:
        reader, writer = await asyncio.open_connection(ha.host, ha.port)
        writer.write(encode_auth_hello(AuthHello(b"n" * 16)))
        decoder = MasterStreamDecoder()
        decoder.feed(await reader.readexactly(52))
        challenge = decoder.next()
        assert isinstance(challenge, AuthChallenge)
        forged = slave_proof(b"guessed", challenge.nonce, b"n" * 16, 1)
        writer.write(encode_auth_proof(AuthProof(1, forged)) + encode_slave_handshake(SlaveHandshake(1))
                     + encode_ack(0))
        assert await read_all(reader) == b""
        writer.close()
        assert ha.slaves() == []
        said = lines(caplog, "failed authentication")
        assert len(said) == 1 and "127.0.0.1:" in said[0]
    finally:
        await shut(ha, master)


async def test_slave_does_not_follow_a_master_that_cannot_prove_the_secret(tmp_path):
    """A fake master answers the hello with a made-up proof and then offers its log: the slave
    sends no handshake and appends nothing."""
    slave = await opened(cfg(tmp_path / "s"))
    received: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readexactly(20))
        writer.write(encode_auth_challenge(AuthChallenge(b"m" * 16, b"x" * 32)))
        writer.write(encode_master_handshake(MasterHandshake(300, 1, [(1, 0)])))
        writer.write(encode_transfer(Transfer(0, 1, 0, 0, b"\0" * 300)))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await asyncio.wait_for(reader.readexactly(1), 5)  # the slave just hangs up
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    follower = slave_of(slave, server.sockets[0].getsockname()[:2], secret=SECRET)
    try:
        await eventually(lambda: len(received) >= 2, msg="the slave retries")
        assert "failed authentication" in (follower.problem or "")
        assert slave.max_physical_offset == 0 and follower.sessions == 0
    finally:
        await shut(follower, slave)
        server.close()


async def test_master_with_another_secret_is_not_followed(tmp_path, caplog):
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01, secret="another-secret")
    await ha.start()
    ha.become(1)
    await master.put(msg(1))
    follower = slave_of(slave, ha, secret=SECRET)
    try:
        await eventually(lambda: follower.problem is not None)
        assert "failed authentication" in follower.problem
        await asyncio.sleep(0.3)  # several attempts
        assert slave.max_physical_offset == 0 and ha.slaves() == []
        assert len(lines(caplog, "failed authentication")) == 1  # the slave's; the master's
        # challenge was answered by nobody, so it only saw the connection close
    finally:
        await shut(follower, ha, master, slave)


@pytest.mark.parametrize("master_secret, slave_secret", [(SECRET, None), (None, SECRET)])
async def test_a_secret_on_one_end_only_is_one_clear_line_on_each_side(tmp_path, caplog,
                                                                       master_secret, slave_secret):
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01, secret=master_secret)
    await ha.start()
    ha.become(1)
    await master.put(msg(1))
    follower = slave_of(slave, ha, secret=slave_secret)
    try:
        await eventually(lambda: follower.problem is not None)
        await asyncio.sleep(0.4)  # the slave keeps trying, at its back-off
        assert slave.max_physical_offset == 0 and ha.slaves() == []
        master_lines = [r.getMessage() for r in caplog.records if r.name == "txbroker.store.ha_master"
                        and r.levelno >= logging.WARNING]
        slave_lines = [r.getMessage() for r in caplog.records if r.name == "txbroker.store.ha_slave"
                       and r.levelno >= logging.WARNING]
        assert len(master_lines) == 1 and "cluster_secret" in master_lines[0], master_lines
        assert len(slave_lines) == 1 and "cluster_secret" in slave_lines[0], slave_lines
        assert f"{ha.host}:{ha.port}" in slave_lines[0] and "127.0.0.1:" in master_lines[0]
    finally:
        await shut(follower, ha, master, slave)


async def test_a_second_connection_with_the_same_id_replaces_the_first(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    await ha.start()
    try:
        r1, w1 = await asyncio.open_connection(ha.host, ha.port)
        w1.write(encode_slave_handshake(SlaveHandshake(4)) + encode_ack(0))
        await eventually(lambda: ha.slaves() and ha.slaves()[0].connected)
        first = ha.slaves()[0].address
        _r2, w2 = await asyncio.open_connection(ha.host, ha.port)
        w2.write(encode_slave_handshake(SlaveHandshake(4)) + encode_ack(0))
        await eventually(lambda: ha.slaves()[0].address != first)
        await asyncio.wait_for(read_all(r1), 5)  # the older connection is closed
        assert [(i.slave_id, i.connected) for i in ha.slaves()] == [(4, True)]
        w1.close()
        w2.close()
    finally:
        await shut(ha, master)


# --- what a slave refuses to follow ----------------------------------------------------------


async def test_slave_refuses_a_master_with_an_older_last_epoch(tmp_path, caplog):
    """B holds epochs 1 and 3; A (stale: it never heard of epoch 3) offers epochs 1 and 2.  B
    must not cut its epoch-3 records to follow A."""
    a = await opened(cfg(tmp_path / "a"))
    b = await opened(cfg(tmp_path / "b"))
    a.epochs.append(1, 0)
    b.epochs.append(1, 0)
    for i in range(10):
        await a.put(msg(i))
        await b.put(msg(i))
    a.epochs.append(2, a.max_physical_offset)
    b.epochs.append(3, b.max_physical_offset)
    for i in range(10, 20):
        await a.put(msg(i))
        await b.put(msg(i, size=500))
    before, epochs = log_bytes(b), list(b.epochs.entries)
    ha = HAMaster(a, heartbeat=0.05, poll=0.01)
    await ha.start()
    follower = slave_of(b, ha)
    try:
        await eventually(lambda: follower.problem is not None)
        await asyncio.sleep(0.2)
        assert "stale" in follower.problem and "last epoch 2" in follower.problem
        assert log_bytes(b) == before and b.epochs.entries == epochs
        assert len(lines(caplog, "is stale")) == 1
    finally:
        await shut(follower, ha, a, b)


async def test_slave_with_bytes_but_no_epochs_does_not_append_after_them(tmp_path):
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    for i in range(10):
        await slave.put(msg(i, size=123))  # a stand-alone broker's log, no epoch history
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    await ha.start()
    ha.become(1)
    for i in range(30):
        await master.put(msg(i))
    before = log_bytes(slave)
    follower = slave_of(slave, ha)
    try:
        await eventually(lambda: follower.problem is not None)
        await asyncio.sleep(0.2)
        assert "no epoch entries" in follower.problem and str(slave.config.data_dir) in follower.problem
        assert log_bytes(slave) == before and slave.epochs.entries == []
    finally:
        await shut(follower, ha, master, slave)


async def test_slave_behind_the_masters_first_offset_is_told_why_and_waits(tmp_path, caplog):
    master = await opened(cfg(tmp_path / "m", file_reserved_time=60))
    slave = await opened(cfg(tmp_path / "s", file_reserved_time=60))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    await ha.start()
    ha.become(1)
    follower = slave_of(slave, ha)
    for i in range(20):
        await master.put(msg(i))
    await eventually(lambda: slave.max_physical_offset == master.max_physical_offset)
    await follower.close()
    held = slave.max_physical_offset
    for i in range(20, 700):
        await master.put(msg(i))
    assert await master.delete_expired(now=time.time() + 120) >= 1
    assert master.min_physical_offset > held
    caplog.clear()
    follower = slave_of(slave, ha, stalled_backoff=60.0)
    try:
        await eventually(lambda: follower.problem is not None)
        assert f"no longer holds offset {held}" in follower.problem
        assert f"starts at {master.min_physical_offset}" in follower.problem
        await asyncio.sleep(0.5)  # a normal back-off would have retried several times by now
        master_lines = lines(caplog, f"needs offset {held}", logging.DEBUG)
        assert len(master_lines) == 1 and "retention" in master_lines[0], master_lines
        assert slave.max_physical_offset == held and not follower.connected
    finally:
        await shut(follower, ha, master, slave)


# --- corrupt replicated bytes ----------------------------------------------------------------


async def record_bytes(tmp_path: Path) -> bytes:
    store = await opened(cfg(tmp_path / "src"))
    try:
        await store.put(msg(7))
        return log_bytes(store)
    finally:
        await store.close()


def corrupt(raw: bytes, at: int, fmt: str, value) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


async def test_reput_names_every_kind_of_corrupt_record(tmp_path):
    raw = await record_bytes(tmp_path)
    body_len = struct.unpack_from(">i", raw, 84)[0]
    topic_at = 88 + body_len
    cases = {
        "body length": corrupt(raw, 84, ">i", 10 ** 6),
        "negative body": corrupt(raw, 84, ">i", -5),
        "topic length": corrupt(raw, topic_at, ">B", 250),
        "properties length": corrupt(raw, topic_at + 2, ">h", 30000),
        "magic": corrupt(raw, 4, ">I", 0x12345678),
        "queue id": corrupt(raw, 12, ">i", -1),
        "topic name": raw[:topic_at + 1] + b"." + raw[topic_at + 2:],
    }
    for i, (what, data) in enumerate(cases.items()):
        store = await opened(cfg(tmp_path / f"s{i}"))
        try:
            with pytest.raises(CorruptRecord) as info:
                store.append_replicated(0, data)
            assert info.value.offset == 0 and "offset 0" in str(info.value), what
        finally:
            await store.close()


async def test_corrupt_transfer_is_refused_and_the_follower_keeps_trying(tmp_path, caplog):
    raw = await record_bytes(tmp_path)
    bad = corrupt(raw, 84, ">i", 10 ** 6)
    slave = await opened(cfg(tmp_path / "s"))
    connections = []

    async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readexactly(16)
        writer.write(encode_master_handshake(MasterHandshake(len(bad), 0, [])))
        await reader.readexactly(12)
        writer.write(encode_transfer(Transfer(0, 0, 0, 0, bad)))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await asyncio.wait_for(reader.readexactly(10 ** 6), 5)
        writer.close()

    server = await asyncio.start_server(master, "127.0.0.1", 0)
    follower = slave_of(slave, server.sockets[0].getsockname()[:2])
    try:
        await eventually(lambda: len(connections) >= 3, msg="the follower reconnects")
        assert follower._task is not None and not follower._task.done()
        assert "corrupt" in (follower.problem or "") and "body length 1000000" in follower.problem
        assert slave.max_physical_offset == 0  # the bad bytes were cut again
        assert len(lines(caplog, "is corrupt")) == 1
    finally:
        await shut(follower, slave)
        server.close()


async def test_follower_that_fails_unexpectedly_is_logged_and_restarted(tmp_path, caplog):
    master = await opened(cfg(tmp_path / "m"))
    slave = await opened(cfg(tmp_path / "s"))
    ha = HAMaster(master, heartbeat=0.05, poll=0.01)
    await ha.start()
    calls = []

    def address():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("address book not ready")
        return ha.host, ha.port

    follower = HASlave(slave, address, heartbeat=0.05, backoff=0.02)
    follower.start()
    try:
        await master.put(msg(1))
        await eventually(lambda: slave.max_physical_offset == master.max_physical_offset)
        assert lines(caplog, "HA follower failed unexpectedly", logging.ERROR)
    finally:
        await shut(follower, ha, master, slave)
