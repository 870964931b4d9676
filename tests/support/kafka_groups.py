"""The durable group coordinator on a real store, for the group tests: a manual wall clock, a
:class:`Node` (store + coordinator, restartable on the same data directory; the
``group_node`` fixture of tests/kafka/conftest.py) and helpers that join members and form a
Stable generation."""

from __future__ import annotations

import asyncio

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.group_log import GroupLog
from txbroker.service.kafka.groups import STABLE, GroupCoordinator
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
                                      offsets=self.store.offsets,
                                      forget_offsets=self.store.forget_offsets_now)
        await self.coord.start()
        self.coord.load()
        return self.coord

    async def close(self) -> None:
        await self.coord.close()
        await self.store.close()

    async def restart(self) -> GroupCoordinator:
        await self.close()
        return await self.open()


def join(coord: GroupCoordinator, member_id: str = "", *, instance: str | None = None,
         protocols=(("range", b"meta"),), group: str = G) -> asyncio.Future:
    return asyncio.ensure_future(coord.join(
        group, member_id, client_id="cli", api_version=5, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=20_000, protocol_type="consumer", protocols=list(protocols),
        group_instance_id=instance, client_host="/127.0.0.1"))


async def answer(fut) -> dict:
    return await asyncio.wait_for(fut, 5)


async def form(coord: GroupCoordinator, n: int, *, static: bool = False) -> list[dict]:
    """``n`` members join and the leader assigns ``a-<member id>``: Stable.  Dynamic members
    first get their ids (MEMBER_ID_REQUIRED) and join together; static members (instance ids
    ``inst-<i>``) join one after the other, those already in rejoining each time, as clients
    do on REBALANCE_IN_PROGRESS."""
    if static:
        joined: list[dict] = []
        for i in range(n):
            tasks = [join(coord, instance=f"inst-{i}")]
            tasks += [join(coord, j["member_id"], instance=f"inst-{k}")
                      for k, j in enumerate(joined)]
            got = [await answer(t) for t in tasks]
            joined = got[1:] + got[:1]
    else:
        ids = []
        for _ in range(n):
            first = await answer(join(coord))
            assert first["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
            ids.append(first["member_id"])
        joined = [await answer(t) for t in [join(coord, mid) for mid in ids]]
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
