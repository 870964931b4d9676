"""Static membership (KIP-345): a member with a ``group.instance.id`` that rejoins with no
member id (it restarted) takes its old id's place and assignment without a rebalance; the old
id is fenced (FENCED_INSTANCE_ID); the new id is recorded with the group, so it survives a
broker restart.  The state machine over a real store, then librdkafka consumers end to end."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.kafka_groups import G, answer, form, join

from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.groups import STABLE


async def test_a_static_member_joins_without_member_id_required(group_node):
    got = await answer(join(group_node.coord, instance="inst-0"))
    assert got["error_code"] == ErrorCode.NONE and got["member_id"].startswith("inst-0-")


async def test_a_restarted_static_member_takes_its_place_without_a_rebalance(group_node):
    coord = group_node.coord
    joined = await form(coord, 2, static=True)
    gen = joined[0]["generation_id"]
    old = {m.group_instance_id: m.member_id for m in coord.groups[G].members.values()}
    assignment = coord.groups[G].members[old["inst-1"]].assignment
    again = await answer(join(coord, instance="inst-1"))
    new_id = again["member_id"]
    assert again["error_code"] == ErrorCode.NONE and new_id != old["inst-1"]
    assert again["generation_id"] == gen and again["members"] == []
    group = coord.groups[G]
    assert group.state == STABLE and group.generation == gen   # no rebalance
    assert list(group.members) == [old["inst-0"], new_id] or list(group.members) == [
        new_id, old["inst-0"]]
    # the old id is fenced everywhere; the new one has the old assignment
    assert coord.heartbeat(G, gen, old["inst-1"], "inst-1") == ErrorCode.FENCED_INSTANCE_ID
    assert (await answer(coord.sync(G, gen, old["inst-1"], [], "inst-1")))["error_code"] == (
        ErrorCode.FENCED_INSTANCE_ID)
    stale = await answer(join(coord, old["inst-1"], instance="inst-1"))
    assert stale["error_code"] == ErrorCode.FENCED_INSTANCE_ID
    assert coord.heartbeat(G, gen, new_id, "inst-1") == ErrorCode.NONE
    assert (await answer(coord.sync(G, gen, new_id, [], "inst-1")))["assignment"] == assignment
    # the other member never noticed
    assert coord.heartbeat(G, gen, old["inst-0"], "inst-0") == ErrorCode.NONE
    # recorded: a restarted broker knows the new id, and the old one stays fenced
    coord = await group_node.restart()
    assert coord.groups[G].members[new_id].group_instance_id == "inst-1"
    assert coord.heartbeat(G, gen, new_id, "inst-1") == ErrorCode.NONE
    assert coord.heartbeat(G, gen, old["inst-1"], "inst-1") == ErrorCode.FENCED_INSTANCE_ID


async def test_a_static_rejoin_that_changes_the_protocol_choice_rebalances(group_node):
    coord = group_node.coord
    gen = (await form(coord, 1, static=True))[0]["generation_id"]
    got = await answer(join(coord, instance="inst-0",
                            protocols=(("roundrobin", b"m"), ("range", b"meta"))))
    # a new generation with the new choice (the only member rejoined: the phase ends at once)
    assert (got["error_code"], got["generation_id"], got["protocol_name"]) == (
        ErrorCode.NONE, gen + 1, "roundrobin")


# --- end to end: librdkafka consumers with group.instance.id -------------------------------
@pytest.fixture
def kafka_config(kafka_config):
    return kafka_config.replace(kafka_group_min_session_timeout=1.0)


def rd_consumer(bootstrap: str, instance: str, events: list):
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "static-g",
                  "group.instance.id": instance, "session.timeout.ms": 10_000,
                  "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})
    c.subscribe(["static-t"], on_assign=lambda _, ps: events.append(("assign", instance, len(ps))),
                on_revoke=lambda _, ps: events.append(("revoke", instance, len(ps))))
    return c


def poll_until(consumers, pred, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        for c in consumers:
            c.poll(0.05)


@pytest.mark.slow
async def test_a_restarted_static_librdkafka_consumer_causes_no_rebalance(kafka_broker,
                                                                         kafka_bootstrap):
    from txbroker.service.topics import TopicConfig

    await kafka_broker.topics.create_or_update(TopicConfig("static-t", 4, 4))
    events: list = []

    def scenario() -> None:
        a, b = rd_consumer(kafka_bootstrap, "a", events), rd_consumer(kafka_bootstrap, "b", events)
        try:
            poll_until([a, b], lambda: len(a.assignment()) + len(b.assignment()) == 4, 30)
            poll_until([a, b], lambda: len(a.assignment()) == 2 == len(b.assignment()), 30)
            before = list(events)
            a.close()            # a static member leaves no LeaveGroup behind
            a2 = rd_consumer(kafka_bootstrap, "a", events)
            try:
                poll_until([a2, b], lambda: len(a2.assignment()) == 2, 30)
                for _ in range(20):   # a while longer: no late rebalance either
                    a2.poll(0.05)
                    b.poll(0.05)
                assert len(b.assignment()) == 2
            finally:
                a2.close()
            after = events[len(before):]
            # a's own close revokes its partitions; b is never revoked, a2 gets a's two
            assert ("revoke", "b", 2) not in after and ("assign", "a", 2) in after, after
        finally:
            b.close()

    await asyncio.to_thread(scenario)
