"""The durable group coordinator over a real store: what a generation's SyncGroup writes is
what a new coordinator (a restarted broker, a new master) loads, with sessions restarted from
the load; static members keep their place across a restart; deletions and pruning stay done;
the log is compacted so loading reads the last snapshot and what followed only."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.group_log import COMPACT_MIN, GroupLog
from txbroker.service.kafka.groups import EMPTY, STABLE, GroupCoordinator
from txbroker.service.metrics import BrokerMetrics
from txbroker.store.message_store import MessageStore

G = "orders"
SESSION_MS = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class Node:
    """A store and a coordinator on it; ``restart()`` closes both and opens new ones on the
    same data directory (``crash=True``: the store is not closed, as after SIGKILL)."""

    def __init__(self, config: BrokerConfig, clock: Clock) -> None:
        self.config, self.clock = config, clock
        self.store: MessageStore | None = None
        self.coord: GroupCoordinator | None = None

    async def open(self) -> GroupCoordinator:
        self.store = MessageStore(self.config, clock=self.clock)
        self.store.open()
        log = GroupLog(self.store, reserved_time=self.config.file_reserved_time, clock=self.clock)
        self.coord = GroupCoordinator(self.config, BrokerMetrics(), clock=self.clock, log=log,
                                      offsets=self.store.offsets)
        await self.coord.start()
        self.coord.load()
        return self.coord

    async def close(self) -> None:
        await self.coord.close()
        await self.store.close()

    async def restart(self) -> GroupCoordinator:
        await self.close()
        return await self.open()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def node(broker_config: BrokerConfig, clock: Clock):
    n = Node(broker_config.replace(kafka_group_initial_rebalance_delay=0.0), clock)
    await n.open()
    try:
        yield n
    finally:
        await n.close()


def join(coord: GroupCoordinator, member_id: str = "", *, instance: str | None = None,
         protocols=(("range", b"meta"),)) -> asyncio.Future:
    return asyncio.ensure_future(coord.join(
        G, member_id, client_id="cli", api_version=5, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=20_000, protocol_type="consumer", protocols=list(protocols),
        group_instance_id=instance, client_host="/127.0.0.1"))


async def answer(fut) -> dict:
    return await asyncio.wait_for(fut, 5)


async def form(coord: GroupCoordinator, n: int, *, static: bool = False) -> list[dict]:
    """``n`` members join together and the leader assigns ``a-<member id>``: Stable."""
    ids = []
    for i in range(n):
        if static:
            ids.append(None)
            continue
        first = await answer(join(coord))
        assert first["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
        ids.append(first["member_id"])
    tasks = [join(coord, mid or "", instance=f"inst-{i}" if static else None)
             for i, mid in enumerate(ids)]
    joined = [await answer(t) for t in tasks]
    assert all(j["error_code"] == ErrorCode.NONE for j in joined), joined
    leader = next(j for j in joined if j["member_id"] == j["leader"])
    gen = leader["generation_id"]
    syncs = [asyncio.ensure_future(coord.sync(G, gen, j["member_id"], [])) for j in joined
             if j is not leader]
    given = [(m["member_id"], b"a-" + m["member_id"].encode()) for m in leader["members"]]
    got = await answer(coord.sync(G, gen, leader["member_id"], given))
    assert got["error_code"] == ErrorCode.NONE
    for s in syncs:
        assert (await answer(s))["error_code"] == ErrorCode.NONE
    assert coord.groups[G].state == STABLE
    return joined


async def test_a_stable_generation_is_loaded_after_a_restart(node, clock):
    joined = await form(node.coord, 2)
    gen, leader = joined[0]["generation_id"], joined[0]["leader"]
    coord = await node.restart()
    group = coord.groups[G]
    assert (group.state, group.generation, group.leader, group.protocol_name) == (
        STABLE, gen, leader, "range")
    assert [m.member_id for m in group.members.values()] == [j["member_id"] for j in joined]
    for j in joined:
        mid = j["member_id"]
        assert group.members[mid].assignment == b"a-" + mid.encode()
        # the members go on as if nothing happened: heartbeats, their assignment, commits
        assert coord.heartbeat(G, gen, mid) == ErrorCode.NONE
        assert (await answer(coord.sync(G, gen, mid, [])))["assignment"] == b"a-" + mid.encode()
        assert coord.validate_commit(G, gen, mid) == ErrorCode.NONE
    # each session runs a whole timeout from the load, then the silent member is dropped
    clock.now += SESSION_MS / 1000 - 1
    coord.heartbeat(G, gen, joined[0]["member_id"])
    coord.tick()
    assert len(group.members) == 2
    clock.now += 2
    coord.tick()
    assert list(group.members) == [joined[0]["member_id"]]


async def test_an_emptied_group_is_loaded_empty_with_its_generation(node, clock):
    joined = await form(node.coord, 1)
    assert node.coord.leave(G, joined[0]["member_id"]) == ErrorCode.NONE
    assert node.coord.groups[G].state == EMPTY
    coord = await node.restart()
    group = coord.groups[G]
    assert (group.state, group.generation, group.protocol_type, list(group.members)) == (
        EMPTY, joined[0]["generation_id"] + 1, "consumer", [])


async def test_loading_reads_the_last_snapshot_and_what_followed(node, clock):
    await form(node.coord, 1)
    coord = node.coord
    for _ in range(COMPACT_MIN + 5):          # many generations of one group
        coord._record(coord.groups[G])
    await asyncio.sleep(0.1)
    assert coord.log.snapshot_due(len(coord.groups))
    coord.snapshot()
    coord._record(coord.groups[G])
    await asyncio.sleep(0.1)
    coord = await node.restart()
    assert coord.log.since_snapshot == 2      # the snapshot's record and the one after it
    assert coord.groups[G].state == STABLE
