"""The durable group coordinator over a real store: what a generation's SyncGroup writes is
what a new coordinator (a restarted broker, a new master) loads, with sessions restarted from
the load; an emptied group is loaded empty; the log is compacted so loading reads the last
snapshot and what followed only."""

from __future__ import annotations

import asyncio

from support.kafka_groups import SESSION_MS, G, answer, form, join

from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.group_log import COMPACT_MIN
from txbroker.service.kafka.groups import EMPTY, STABLE


async def test_a_stable_generation_is_loaded_after_a_restart(group_node, group_clock):
    joined = await form(group_node.coord, 2)
    gen, leader = joined[0]["generation_id"], joined[0]["leader"]
    coord = await group_node.restart()
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
    group_clock.now += SESSION_MS / 1000 - 1
    coord.heartbeat(G, gen, joined[0]["member_id"])
    coord.tick()
    assert len(group.members) == 2
    group_clock.now += 2
    coord.tick()
    assert list(group.members) == [joined[0]["member_id"]]


async def test_an_emptied_group_is_loaded_empty_with_its_generation(group_node, group_clock):
    joined = await form(group_node.coord, 1)
    assert group_node.coord.leave(G, joined[0]["member_id"]) == ErrorCode.NONE
    assert group_node.coord.groups[G].state == EMPTY
    coord = await group_node.restart()
    group = coord.groups[G]
    assert (group.state, group.generation, group.protocol_type, list(group.members)) == (
        EMPTY, joined[0]["generation_id"] + 1, "consumer", [])


async def test_loading_reads_the_last_snapshot_and_what_followed(group_node, group_clock):
    await form(group_node.coord, 1)
    coord = group_node.coord
    for _ in range(COMPACT_MIN + 5):          # many generations of one group
        coord._record(coord.groups[G])
    await asyncio.sleep(0.1)
    assert coord.log.snapshot_due(len(coord.groups))
    coord.snapshot()
    coord._record(coord.groups[G])
    await asyncio.sleep(0.1)
    coord = await group_node.restart()
    assert coord.log.since_snapshot == 2      # the snapshot's record and the one after it
    assert coord.groups[G].state == STABLE


async def test_suspend_then_load_as_a_master_change_does(group_node):
    coord = group_node.coord
    joined = await form(coord, 1)
    gen, mid = joined[0]["generation_id"], joined[0]["member_id"]
    await coord.suspend()               # no longer the master: nothing kept, nothing answered
    assert coord.groups == {}
    assert coord.heartbeat(G, gen, mid) == ErrorCode.NOT_COORDINATOR
    assert (await answer(join(coord)))["error_code"] == ErrorCode.NOT_COORDINATOR
    assert coord.validate_commit(G, gen, mid) == ErrorCode.NOT_COORDINATOR
    assert coord.load() == 1            # the master again: the group as the log has it
    assert coord.heartbeat(G, gen, mid) == ErrorCode.NONE
