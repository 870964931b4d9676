"""The unmodified RocketMQ C++ client consuming from a real txbroker, and the SDK consuming
what that client produced."""

from __future__ import annotations

import pytest
from compat_cpp import CppRun, run_cpp
from support.waiting import eventually

from txbroker.client import Consumer, Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.remoting.codes import RequestCode

pytestmark = pytest.mark.needs_cpp

TOPIC = "CompatConsume"


async def produce(broker, bodies_tags: list[tuple[str, str]], topic: str = TOPIC) -> None:
    """Send with the txbroker SDK; it spreads messages round-robin over the topic's 4 queues."""
    async with Producer("PID_SDK_COMPAT", namesrv=broker.namesrv_addr) as p:
        for body, tag in bodies_tags:
            await p.send(Message(topic, body.encode(), tags=tag, keys="K-" + body,
                                 properties={"origin": "sdk"}))


async def create_topic(broker, topic: str = TOPIC) -> None:
    """Consumers never create their topic (RocketMQ's neither): made before one starts."""
    async with AdminClient(broker.namesrv_addr) as admin:
        await admin.create_topic(topic, 4)


class GroupWatch:
    """What the broker received from one consumer group: which connection pulled which queue
    of TOPIC, and the member ids each connection was answered when it asked for the group's
    consumer list (a member's rebalance starts with that question)."""

    def __init__(self, broker, group: str) -> None:
        self.broker, self.group = broker, group
        self.pulls: set[tuple[int, int]] = set()     # (connection id, queue id)
        self.listed: dict[int, frozenset[str]] = {}  # connection id -> ids it was answered
        handlers = broker.server._handlers  # shared by every connection, so wrapping is enough
        pull, consumer_list = (handlers[int(RequestCode.PULL_MESSAGE)],
                               handlers[int(RequestCode.GET_CONSUMER_LIST_BY_GROUP)])

        async def watched_pull(conn, cmd):
            ext = cmd.ext_fields
            if ext.get("consumerGroup") == group and ext.get("topic") == TOPIC:
                self.pulls.add((conn.id, int(ext["queueId"])))
            return await pull(conn, cmd)

        async def watched_list(conn, cmd):
            resp = await consumer_list(conn, cmd)
            if cmd.ext_fields.get("consumerGroup") == group:
                self.listed[conn.id] = frozenset(broker.registry.consumer_ids(group))
            return resp

        broker.server.register(RequestCode.PULL_MESSAGE, watched_pull)
        broker.server.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, watched_list)

    def split_settled(self) -> bool:
        """Both members rebalanced to the two-member split: each was answered a list naming
        both, and every queue was pulled by the member that owns it under that split (the C++
        client's average allocation: sorted ids, queues 0-1 to the first, 2-3 to the second)."""
        members = self.broker.registry.consumer_groups().get(self.group, {})
        if len(members) != 2:
            return False
        ids = sorted(members)
        conns = [members[cid].conn.id for cid in ids]
        return (all(self.listed.get(c) == frozenset(ids) for c in conns)
                and all((conns[q // 2], q) in self.pulls for q in range(4)))

    def describe(self) -> str:
        return f"pulls {sorted(self.pulls)}, lists answered {self.listed}"


def push_spec(broker, **kw) -> dict:
    return {"scenario": "push_consume", "namesrv": broker.namesrv_addr, "topic": TOPIC,
            "group": "CID_COMPAT", "record_props": ["origin"], **kw}


async def test_push_consumer_tag_expression_offsets_committed_and_resumed(broker, tmp_path):
    first = [(f"m{i}", ("TagA", "TagB", "TagC")[i % 3]) for i in range(12)]
    await produce(broker, first)
    assert len(broker.store.queues()[TOPIC]) == 4  # several queues are in play
    wanted = {b for b, t in first if t != "TagC"}

    run = await run_cpp(tmp_path / "home1", timeout=30,
                        **push_spec(broker, expression="TagA || TagB", expect=len(wanted),
                                    max_seconds=20))
    assert run.returncode == 0, run.describe()
    got = run.of("msg")
    assert {m["body"] for m in got} == wanted, run.describe()
    for m in got:
        assert m["tags"] in ("TagA", "TagB")
        assert m["keys"] == "K-" + m["body"]
        assert m["props"]["origin"] == "sdk"
        assert m["topic"] == TOPIC
    assert {m["queue_id"] for m in got} == {0, 1, 2, 3}

    # Shutdown committed every queue's offset (UPDATE_CONSUMER_OFFSET without the one-way bit):
    # at least past the last message it consumed there.  (A trailing TagC message the broker
    # filtered out may stay below the commit; that is the client's bookkeeping.)
    for qid in range(4):
        committed = broker.store.offsets.get("CID_COMPAT", TOPIC, qid)
        last = max(m["queue_offset"] for m in got if m["queue_id"] == qid)
        assert committed is not None and committed >= last + 1, (qid, committed, last)

    # A restarted consumer of the same group resumes after the committed offsets.
    second = [(f"n{i}", "TagA") for i in range(4)]
    await produce(broker, second)
    run2 = await run_cpp(tmp_path / "home2", timeout=30,
                         **push_spec(broker, expression="TagA || TagB", expect=4, max_seconds=20,
                                     linger=1.0))
    assert run2.returncode == 0, run2.describe()
    assert sorted(m["body"] for m in run2.of("msg")) == [f"n{i}" for i in range(4)], run2.describe()


async def test_two_push_consumers_of_one_group_share_the_queues(broker, tmp_path):
    await create_topic(broker)
    watch = GroupWatch(broker, "CID_COMPAT")
    stop = tmp_path / "stop"
    spec = push_spec(broker, max_seconds=25, stop_file=str(stop))
    a = await CppRun(spec, tmp_path / "a").start()
    b = await CppRun(spec, tmp_path / "b").start()
    try:
        await a.wait_started()
        await b.wait_started()
        # Both members must have rebalanced before messages flow, so the split is settled.
        await eventually(watch.split_settled, 20, lambda: f"the split settled: {watch.describe()}")
        bodies = [(f"s{i}", "TagA") for i in range(16)]
        await produce(broker, bodies)
        await eventually(lambda: len(a.of("msg")) + len(b.of("msg")) >= 16, 10, "16 messages consumed")
    finally:
        stop.touch()
        await a.finish(20)
        await b.finish(20)
    got_a, got_b = a.of("msg"), b.of("msg")
    assert got_a and got_b, (a.describe(), b.describe())
    assert {m["body"] for m in got_a} | {m["body"] for m in got_b} == {b for b, _ in bodies}
    # Each queue is owned by exactly one member.
    assert not ({m["queue_id"] for m in got_a} & {m["queue_id"] for m in got_b})
    assert len(got_a) + len(got_b) == 16


async def test_pull_consumer_reads_all_queues(broker, tmp_path):
    bodies = [(f"p{i}", "TagP") for i in range(10)]
    await produce(broker, bodies)
    run = await run_cpp(tmp_path / "home", scenario="pull_consume", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="CID_PULL_COMPAT", record_props=["origin"])
    run.assert_clean()
    got = run.of("msg")
    assert sorted(m["body"] for m in got) == sorted(b for b, _ in bodies)
    assert {m["queue_id"] for m in got} == {0, 1, 2, 3}
    for m in got:
        stored = broker.store.get(TOPIC, m["queue_id"], m["queue_offset"], 1).messages()[0]
        assert stored.body.decode() == m["body"]
        assert stored.physical_offset == m["commit_log_offset"]
        assert m["id"] == stored.properties["UNIQ_KEY"]


async def test_sdk_consumes_what_the_cpp_client_produced(broker, tmp_path):
    small = await run_cpp(tmp_path / "h1", scenario="send_sync", namesrv=broker.namesrv_addr,
                          topic=TOPIC, group="PID_COMPAT", count=3, keys="CK", tags="TagX",
                          props={"color": "blue"}, body="from cpp")
    small.assert_clean()
    large = await run_cpp(tmp_path / "h2", scenario="send_large", namesrv=broker.namesrv_addr,
                          topic=TOPIC, group="PID_COMPAT", tags="TagX", body="big", size=8000)
    large.assert_clean()
    consumer = Consumer("CID_SDK_COMPAT", namesrv=broker.namesrv_addr, from_where="first",
                        long_poll_timeout=1.0)
    consumer.subscribe(TOPIC, "TagX")
    got = []
    async with consumer:
        while len(got) < 4:
            msg = await consumer.poll(timeout=10)
            assert msg is not None, [m.body[:20] for m in got]
            got.append(msg)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted([b"from cpp %d" % i for i in range(3)] + [b"big:" + b"x" * 8000])
    small_ids = {r["msg_id"] for r in small.of("sent")}
    for m in got:
        if m.body.startswith(b"from cpp"):
            assert m.keys == "CK" or m.keys == ["CK"]
            assert m.properties["color"] == "blue"
            assert m.msg_id in small_ids


async def test_cpp_pulls_the_large_compressed_body_intact(broker, tmp_path):
    big = "z" * 9000
    async with Producer("PID_SDK_COMPAT", namesrv=broker.namesrv_addr) as p:
        await p.send(Message(TOPIC, big.encode(), tags="TagL"))
    run = await run_cpp(tmp_path / "home", scenario="pull_consume", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="CID_PULL_COMPAT")
    run.assert_clean()
    assert [m["body"] for m in run.of("msg")] == [big]


async def test_orderly_push_consumer_locks_queues_and_keeps_queue_order(broker, tmp_path):
    bodies = [(f"o{i:02d}", "TagA") for i in range(12)]
    await produce(broker, bodies)
    run = await run_cpp(tmp_path / "home", timeout=30,
                        **push_spec(broker, orderly=True, expect=12, max_seconds=20))
    assert run.returncode == 0, run.describe()
    got = run.of("msg")
    assert sorted(m["body"] for m in got) == [b for b, _ in bodies], run.describe()
    for qid in range(4):
        offsets = [m["queue_offset"] for m in got if m["queue_id"] == qid]
        assert offsets == sorted(offsets) and offsets, (qid, offsets)


async def test_committed_offsets_survive_a_broker_restart(broker_process, tmp_path):
    proc = broker_process()
    first = await run_cpp(tmp_path / "p1", scenario="send_sync", namesrv=proc.namesrv_addr,
                          topic=TOPIC, group="PID_COMPAT", count=4, tags="TagA", body="before")
    first.assert_clean()
    spec = {"scenario": "push_consume", "topic": TOPIC, "group": "CID_RESTART", "linger": 0.5}
    c1 = await run_cpp(tmp_path / "c1", timeout=30, namesrv=proc.namesrv_addr, expect=4,
                       max_seconds=20, **spec)
    assert sorted(m["body"] for m in c1.of("msg")) == [f"before {i}" for i in range(4)], c1.describe()
    proc.restart()  # graceful stop, same data dir, new ports
    second = await run_cpp(tmp_path / "p2", scenario="send_sync", namesrv=proc.namesrv_addr,
                           topic=TOPIC, group="PID_COMPAT", count=2, tags="TagA", body="after")
    second.assert_clean()
    c2 = await run_cpp(tmp_path / "c2", timeout=30, namesrv=proc.namesrv_addr, expect=2,
                       max_seconds=20, **{**spec, "linger": 1.0})
    assert sorted(m["body"] for m in c2.of("msg")) == ["after 0", "after 1"], (
        f"first consumer got {[(m['body'], m['queue_id'], m['queue_offset']) for m in c1.of('msg')]}; "
        f"sends after restart {second.of('sent')}; second consumer: {c2.describe()}")


async def test_killed_cpp_consumer_queues_move_to_the_survivor(broker, tmp_path):
    # A member that crashes (SIGKILL, held pulls on its connection) must not strand its queues.
    await create_topic(broker)
    watch = GroupWatch(broker, "CID_COMPAT")
    a = await CppRun(push_spec(broker, max_seconds=25), tmp_path / "a").start()
    b = await CppRun(push_spec(broker, expect=8, max_seconds=25), tmp_path / "b").start()
    try:
        await a.wait_started()
        await b.wait_started()
        # both hold pulls on their queues now
        await eventually(watch.split_settled, 20, lambda: f"the split settled: {watch.describe()}")
        a.proc.kill()
        await a.finish(10)
        await eventually(lambda: len(broker.registry.consumer_ids("CID_COMPAT")) == 1, 10,
                         "the killed member unregistered")
        bodies = [(f"k{i}", "TagA") for i in range(8)]
        await produce(broker, bodies)
        await b.finish(30)
    finally:
        for run in (a, b):
            if run.returncode is None:
                await run.finish(1)
    assert b.returncode == 0, b.describe()
    assert sorted(m["body"] for m in b.of("msg")) == sorted(x for x, _ in bodies), b.describe()
    assert {m["queue_id"] for m in b.of("msg")} == {0, 1, 2, 3}
