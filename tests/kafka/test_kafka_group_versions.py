"""The oldest group versions Kafka 4 still serves, over a real socket with hand-built frames:
JoinGroup v0 and v1 and SyncGroup v0 (sarama 1.22 joins with JoinGroup v1 and SyncGroup v0;
docs/kafka.md, "Versions").  The frames are packed here byte by byte, not with the broker's
codec, so the layouts are checked against what the definitions say rather than against the
broker's own tables: v0-1 answers carry no throttle time, v0 requests no rebalance timeout."""

from __future__ import annotations

import asyncio
import struct

import pytest

from txbroker.remoting.kafka.errors import ErrorCode

WAIT = 10.0
SESSION_MS = 10_000


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _bytes(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


def _request(key: int, version: int, corr: int, body: bytes) -> bytes:
    payload = struct.pack(">hhi", key, version, corr) + _str("raw-test") + body
    return struct.pack(">i", len(payload)) + payload


def join_v0_v1(version: int, group: str, member: str, *, rebalance_ms: int = 30_000) -> bytes:
    body = _str(group) + struct.pack(">i", SESSION_MS)
    if version >= 1:
        body += struct.pack(">i", rebalance_ms)
    body += _str(member) + _str("consumer") + struct.pack(">i", 1) + _str("range") + _bytes(b"meta")
    return body


def sync_v0(group: str, generation: int, member: str, assignments: list[tuple[str, bytes]]) -> bytes:
    body = _str(group) + struct.pack(">i", generation) + _str(member) + struct.pack(">i", len(assignments))
    for m, a in assignments:
        body += _str(m) + _bytes(a)
    return body


class Reader:
    """Reads a classic (non-flexible) body field by field."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take(">h")
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def bytes(self) -> bytes:
        n = self.take(">i")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def done(self) -> bool:
        return self.pos == len(self.data)


class Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, key: int, version: int, corr: int, body: bytes) -> Reader:
        self.writer.write(_request(key, version, corr, body))
        head = await asyncio.wait_for(self.reader.read(4), WAIT)
        assert head, f"the broker closed the connection on api {key} v{version}"
        size = struct.unpack(">i", head + await asyncio.wait_for(
            self.reader.readexactly(4 - len(head)), WAIT))[0]
        frame = await asyncio.wait_for(self.reader.readexactly(size), WAIT)
        r = Reader(frame)
        assert r.take(">i") == corr
        return r

    def close(self) -> None:
        self.writer.close()


def read_join_v0_v1(r: Reader) -> dict:
    """JoinGroup v0/v1 answer: no throttle time (it comes with v2)."""
    out = {"error_code": r.take(">h"), "generation_id": r.take(">i"), "protocol_name": r.string(),
           "leader": r.string(), "member_id": r.string()}
    out["members"] = [(r.string(), r.bytes()) for _ in range(r.take(">i"))]
    assert r.done()
    return out


def read_sync_v0(r: Reader) -> dict:
    out = {"error_code": r.take(">h"), "assignment": r.bytes()}
    assert r.done()
    return out


@pytest.mark.parametrize("version", [0, 1])
async def test_join_v0_v1_sync_v0_and_heartbeat_v0_form_a_group(kafka_broker, version) -> None:
    raw = await Raw.open(kafka_broker.kafka_port)
    try:
        # v0-3 give a new member its id at once (MEMBER_ID_REQUIRED is v4+)
        joined = read_join_v0_v1(await raw.call(11, version, 1, join_v0_v1(version, "g", "")))
        assert joined["error_code"] == ErrorCode.NONE
        assert joined["generation_id"] == 1 and joined["protocol_name"] == "range"
        me = joined["member_id"]
        assert me.startswith("raw-test-") and joined["leader"] == me
        assert joined["members"] == [(me, b"meta")]
        synced = read_sync_v0(await raw.call(14, 0, 2, sync_v0("g", 1, me, [(me, b"mine")])))
        assert synced == {"error_code": ErrorCode.NONE, "assignment": b"mine"}
        beat = await raw.call(12, 0, 3, _str("g") + struct.pack(">i", 1) + _str(me))
        assert beat.take(">h") == ErrorCode.NONE and beat.done()
        stale = read_sync_v0(await raw.call(14, 0, 4, sync_v0("g", 7, me, [])))
        assert stale["error_code"] == ErrorCode.ILLEGAL_GENERATION
    finally:
        raw.close()


async def test_join_v0_takes_the_session_timeout_as_rebalance_timeout(kafka_broker) -> None:
    raw = await Raw.open(kafka_broker.kafka_port)
    try:
        j0 = read_join_v0_v1(await raw.call(11, 0, 1, join_v0_v1(0, "g0", "")))
        j1 = read_join_v0_v1(await raw.call(11, 1, 2, join_v0_v1(1, "g1", "", rebalance_ms=45_000)))
        groups = kafka_broker.groups
        assert groups.groups["g0"].members[j0["member_id"]].rebalance_timeout == SESSION_MS / 1000
        assert groups.groups["g1"].members[j1["member_id"]].rebalance_timeout == 45.0
    finally:
        raw.close()


async def test_a_v1_member_and_a_v5_member_share_a_group(kafka_broker) -> None:
    """Versions mix in one group: a second member's join rebalances the first, whichever
    version each speaks, and each answer is in its own request's layout."""
    old, new = await Raw.open(kafka_broker.kafka_port), await Raw.open(kafka_broker.kafka_port)
    try:
        first = read_join_v0_v1(await old.call(11, 1, 1, join_v0_v1(1, "mix", "")))
        me = first["member_id"]
        assert read_sync_v0(await old.call(14, 0, 2, sync_v0("mix", 1, me, [(me, b"a")])))[
            "error_code"] == ErrorCode.NONE
        # v5 needs two rounds: MEMBER_ID_REQUIRED, then the join with the id
        v5 = (_str("mix") + struct.pack(">ii", SESSION_MS, SESSION_MS) + _str("") + struct.pack(">h", -1)
              + _str("consumer") + struct.pack(">i", 1) + _str("range") + _bytes(b"m5"))
        r = await new.call(11, 5, 3, v5)
        assert r.take(">i") == 0 and r.take(">h") == ErrorCode.MEMBER_ID_REQUIRED
        r.take(">i"), r.string(), r.string()
        other = r.string()
        v5 = (_str("mix") + struct.pack(">ii", SESSION_MS, SESSION_MS) + _str(other)
              + struct.pack(">h", -1) + _str("consumer") + struct.pack(">i", 1) + _str("range")
              + _bytes(b"m5"))
        new.writer.write(_request(11, 5, 4, v5))
        # the old member learns of the rebalance by its heartbeat, then rejoins with v1
        for _ in range(50):
            beat = await old.call(12, 0, 5, _str("mix") + struct.pack(">i", 1) + _str(me))
            if beat.take(">h") == ErrorCode.REBALANCE_IN_PROGRESS:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the heartbeat never saw the rebalance")
        again = read_join_v0_v1(await old.call(11, 1, 6, join_v0_v1(1, "mix", me)))
        assert again["error_code"] == ErrorCode.NONE and again["generation_id"] == 2
        if again["leader"] == me:
            assert sorted(m for m, _ in again["members"]) == sorted([me, other])
    finally:
        old.close()
        new.close()


def commit_v0_v1(version: int, group: str, offset: int, *, generation: int = -1, member: str = "",
                 stamp: int = -1, metadata: str = "md") -> bytes:
    """OffsetCommit v0/v1 (Kafka 3.9's layouts; Kafka 4 serves from v2): one partition of T."""
    body = _str(group)
    if version >= 1:
        body += struct.pack(">i", generation) + _str(member)
    body += struct.pack(">i", 1) + _str("T") + struct.pack(">i", 1) + struct.pack(">iq", 0, offset)
    if version == 1:
        body += struct.pack(">q", stamp)
    return body + _str(metadata)


def read_commit(r: Reader) -> list[tuple[str, int, int]]:
    """OffsetCommit v0-2 answer: no throttle time (v3+)."""
    out = []
    for _ in range(r.take(">i")):
        name = r.string()
        out += [(name, r.take(">i"), r.take(">h")) for _ in range(r.take(">i"))]
    assert r.done()
    return out


async def fetch_v1(raw: Raw, corr: int, group: str) -> tuple[int, str, int]:
    r = await raw.call(9, 1, corr, _str(group) + struct.pack(">i", 1) + _str("T")
                       + struct.pack(">ii", 1, 0))
    assert r.take(">i") == 1 and r.string() == "T" and r.take(">i") == 1
    assert r.take(">i") == 0
    offset, metadata, error = r.take(">q"), r.string(), r.take(">h")
    assert r.done()
    return offset, metadata, error


async def test_offset_commit_v1_in_a_group_and_v0_simple_commits(kafka_broker) -> None:
    from txbroker.service.topics import TopicConfig

    await kafka_broker.topics.create_or_update(TopicConfig("T", 2, 2))
    raw = await Raw.open(kafka_broker.kafka_port)
    try:
        me = read_join_v0_v1(await raw.call(11, 1, 1, join_v0_v1(1, "cg", "")))["member_id"]
        read_sync_v0(await raw.call(14, 0, 2, sync_v0("cg", 1, me, [(me, b"")])))
        # v1, the group's member and generation, a commit timestamp: Kafka 3.9 keeps it
        got = read_commit(await raw.call(8, 1, 3, commit_v0_v1(1, "cg", 5, generation=1, member=me,
                                                                stamp=1_234_000)))
        assert got == [("T", 0, ErrorCode.NONE)]
        assert kafka_broker.store.offsets.kafka_commit("cg", "T", 0) == ("md", 1_234_000)
        assert await fetch_v1(raw, 4, "cg") == (5, "md", ErrorCode.NONE)
        stale = read_commit(await raw.call(8, 1, 5, commit_v0_v1(1, "cg", 6, generation=3, member=me)))
        assert stale == [("T", 0, ErrorCode.ILLEGAL_GENERATION)]
        # v0 (no generation, no member) is a simple commit: refused while the group has members,
        # taken for a group without any
        busy = read_commit(await raw.call(8, 0, 6, commit_v0_v1(0, "cg", 7)))
        assert busy == [("T", 0, ErrorCode.UNKNOWN_MEMBER_ID)]
        assert read_commit(await raw.call(8, 0, 7, commit_v0_v1(0, "solo", 9))) == [
            ("T", 0, ErrorCode.NONE)]
        assert await fetch_v1(raw, 8, "solo") == (9, "md", ErrorCode.NONE)
        assert await fetch_v1(raw, 9, "cg") == (5, "md", ErrorCode.NONE)
    finally:
        raw.close()
