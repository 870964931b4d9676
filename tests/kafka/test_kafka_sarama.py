"""sarama 1.22 (Debian's Go Kafka client) against a broker process: cluster admin, an
idempotent producer with keys and headers, a two-member consumer group reading committed
transactions exactly once and aborted ones never, and an idempotent producer riding a
SIGKILL and restart of the broker.  The Go program is tests/kafka/sarama/main.go, built
offline once per source (tests/support/sarama.py); without Go or sarama's source the tests
are skipped with one line naming the package to install."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from support import sarama
from support.kafka_sasl import users_file

from txbroker.bench.chaos.process import free_port

#: sarama's Producer.MaxMessageBytes for the batching producer: at most the test broker's
#: max_message_size (256 KiB; sarama's default, 1000000, is above it and a batch that large is
#: refused MESSAGE_TOO_LARGE, after which sarama 1.22's idempotent producer gets
#: OUT_OF_ORDER_SEQUENCE_NUMBER for every later batch: docs/kafka.md, "Per client").
MAX_BATCH_BYTES = 200_000

WHY_NOT = sarama.missing()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


@pytest.fixture(scope="session")
def sarama_bin(request) -> Path:
    return sarama.build(Path(request.config.cache.mkdir("sarama-build")))


@pytest.fixture
def kafka_process(broker_process):
    """A broker process with its Kafka port open, and its bootstrap address."""
    port = free_port()
    bp = broker_process(kafka_port=port, kafka_group_initial_rebalance_delay=0.2)
    return bp, f"127.0.0.1:{port}"


async def create_topic(binary: Path, bootstrap: str, topic: str, partitions: int) -> list[dict]:
    return await sarama.run(binary, "admin", "-brokers", bootstrap, "-topic", topic,
                            "-partitions", str(partitions))


async def test_cluster_admin_creates_and_describes_a_topic(sarama_bin, kafka_process):
    _, bootstrap = kafka_process
    events = await create_topic(sarama_bin, bootstrap, "sarama-admin", 3)
    created, described, missing, configs, listed, cluster = events
    assert created["event"] == "created" and created["again_exists"], created
    assert described == {"event": "described", "topic": "sarama-admin", "error": 0,
                         "partitions": [0, 1, 2], "leaders": [0, 0, 0]}
    assert missing == {"event": "described", "topic": "sarama-admin-missing", "error": 3,
                       "partitions": [], "leaders": []}
    # DescribeConfigs v0: is_default stands for the config source sarama 1.22 cannot read
    assert configs["configs"]["cleanup.policy"] == {"value": "delete", "default": True,
                                                    "read_only": False}
    assert configs["configs"]["max.message.bytes"] == {"value": str(256 * 1024), "default": False,
                                                       "read_only": True}
    assert configs["configs"]["retention.bytes"]["default"]
    assert not configs["configs"]["retention.ms"]["default"]
    # ListTopics: Metadata, then DescribeConfigs v0 of every topic, default configs left out
    assert listed == {"event": "listed", "topic": "sarama-admin", "partitions": 3, "replication": 1,
                      "configs": {"retention.ms": configs["configs"]["retention.ms"]["value"],
                                  "max.message.bytes": str(256 * 1024)}}
    assert await create_topic(sarama_bin, bootstrap, "sarama-admin-missing", 1)  # it was not there
    # sarama 1.22's DescribeCluster asks Metadata v0, which carries no controller: it says -1
    assert cluster == {"event": "cluster", "brokers": 1, "controller": -1}


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4"])
async def test_idempotent_producer_keys_and_headers_read_back(sarama_bin, kafka_process,
                                                              compression):
    _, bootstrap = kafka_process
    await create_topic(sarama_bin, bootstrap, "sarama-idem", 3)
    events = await sarama.run(sarama_bin, "produce", "-brokers", bootstrap, "-topic", "sarama-idem",
                              "-count", "30", "-prefix", "idem", "-compression", compression)
    acks = [e for e in events if e["event"] == "ack"]
    assert events[-1] == {"event": "done", "acked": 30, "failed": 0}
    assert len({a["partition"] for a in acks}) > 1       # the keys spread over the partitions
    read = await sarama.run(sarama_bin, "read", "-brokers", bootstrap, "-topic", "sarama-idem",
                            "-expect", "30", "-idle", "10")
    recs = [e for e in read if e["event"] == "rec"]
    assert read[-1] == {"event": "done", "got": 30}
    at = {(a["partition"], a["offset"]): a["value"] for a in acks}
    for r in recs:
        i = int(r["value"].rsplit("-", 1)[1])
        assert r["value"] == f"idem-{i}" and r["key"] == f"k-{i}"
        assert r["headers"] == {"idx": str(i), "src": "sarama"}
        assert at[(r["partition"], r["offset"])] == r["value"]     # where the ack said
    assert sorted(r["value"] for r in recs) == sorted(f"idem-{i}" for i in range(30))
    # the same key, the same partition (sarama's hash partitioner)
    by_key = {}
    for r in recs:
        by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(ps) == 1 for ps in by_key.values())


async def transactions(bootstrap: str, topic: str, partitions: int) -> tuple[list[str], list[str]]:
    """One committed and one aborted transaction by aiokafka; their values."""
    committed = [f"tc-{i}" for i in range(8)]
    aborted = [f"ta-{i}" for i in range(6)]
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="sarama-peer")
    await p.start()
    try:
        async with p.transaction():
            for i, v in enumerate(committed):
                await p.send(topic, v.encode(), key=f"t{i}".encode(), partition=i % partitions)
        await p.begin_transaction()
        for i, v in enumerate(aborted):
            await p.send_and_wait(topic, v.encode(), partition=i % partitions)
        await p.abort_transaction()
    finally:
        await p.stop()
    return committed, aborted


async def wait_for(predicate, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


def stable_generation(members: list[sarama.Run], partitions: int) -> int | None:
    """The generation both members last set up, when their claims split every partition."""
    last = [m.of("setup")[-1] if m.of("setup") else None for m in members]
    if None in last or len({s["generation"] for s in last}) != 1:
        return None
    claimed = [p for s in last for ps in s["claims"].values() for p in ps]
    if sorted(claimed) != list(range(partitions)) or any(not s["claims"] for s in last):
        return None
    return last[0]["generation"]


async def test_two_member_group_reads_committed_records_exactly_once(sarama_bin, kafka_process):
    _, bootstrap = kafka_process
    topic, partitions, group = "sarama-group", 4, "sarama-g"
    await create_topic(sarama_bin, bootstrap, topic, partitions)
    await create_topic(sarama_bin, bootstrap, "sarama-scratch", 1)
    # one member commits with OffsetCommit v1 (sarama's default), the other with v2 (a
    # retention time set)
    members = [await sarama.Run.start(sarama_bin, "group", "-brokers", bootstrap, "-topic", topic,
                                      "-group", group, "-retention", retention)
               for retention in ("0s", "24h")]
    try:
        await wait_for(lambda: stable_generation(members, partitions) is not None, 60,
                       "both members to share the partitions")
        generation = stable_generation(members, partitions)
        events = await sarama.run(sarama_bin, "produce", "-brokers", bootstrap, "-topic", topic,
                                  "-count", "20", "-prefix", "plain")
        assert events[-1]["acked"] == 20
        committed, aborted = await transactions(bootstrap, topic, partitions)
        want = sorted([f"plain-{i}" for i in range(20)] + committed)

        def seen() -> list[str]:
            return [r["value"] for m in members for r in m.of("rec")]
        await wait_for(lambda: len(seen()) >= len(want), 30, f"{len(want)} records")
        await asyncio.sleep(1.5)     # time for a duplicate or an aborted record to show
        for m in members:
            m.terminate()
        for m in members:
            assert await m.wait(30) == 0, m.events[-3:]
    finally:
        for m in members:
            m.kill()
    counts = Counter(seen())
    assert not set(counts) & set(aborted)
    assert sorted(counts.elements()) == want, [v for v, n in counts.items() if n > 1]
    # nobody rebalanced while reading, and each member read only its own partitions
    for m in members:
        mine = {p for ps in m.of("setup")[-1]["claims"].values() for p in ps}
        assert {r["generation"] for r in m.of("rec")} <= {generation}
        assert {r["partition"] for r in m.of("rec")} <= mine
        assert not m.of("group-error") and not m.of("consume-error")
    # sarama's admin calls on the group and on topics (ListGroups, DescribeGroups, OffsetFetch,
    # CreatePartitions, DeleteTopics)
    managed = await sarama.run(sarama_bin, "manage", "-brokers", bootstrap, "-topic", topic,
                               "-group", group, "-scratch", "sarama-scratch", "-partitions", "3")
    assert managed[0] == {"event": "groups", "groups": {group: "consumer"}}
    assert managed[1] == {"event": "group", "group": group, "error": 0, "state": "Empty",
                          "protocol_type": "consumer", "protocol": "", "members": {}}
    assert managed[2]["event"] == "offsets" and managed[2]["error"] == 0
    assert managed[3:] == [{"event": "grown", "partitions": 3}, {"event": "deleted", "error": 3}]
    # the group's commits stand at the end of every partition (read exactly once, for good)
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await c.end_offsets(tps)
        assert {tp.partition: await c.committed(tp) for tp in tps} == {
            tp.partition: ends[tp] for tp in tps}
        assert managed[2]["offset"] == ends[tps[0]]
    finally:
        await c.stop()


@pytest.mark.parametrize("batched", [
    pytest.param(False, id="one-per-request"),
    pytest.param(True, id="batched", marks=pytest.mark.slow),   # 5-16 s here, more when loaded
])
async def test_idempotent_producer_rides_a_broker_sigkill(sarama_bin, kafka_process, batched):
    bp, bootstrap = kafka_process
    topic, count = "sarama-kill", 1500 if not batched else 20_000
    await create_topic(sarama_bin, bootstrap, topic, 2)
    producer = await sarama.Run.start(sarama_bin, "produce", "-brokers", bootstrap, "-topic", topic,
                                      "-count", str(count), "-prefix", "k", "-retries", "300",
                                      "-max-bytes", str(MAX_BATCH_BYTES),
                                      *(["-batched"] if batched else []))
    try:
        await wait_for(lambda: len(producer.of("ack")) >= count // 4, 60, "a quarter acknowledged")
        bp.kill()
        acked_before = len(producer.of("ack"))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(bp.start)
        assert await producer.wait(180) == 0
    finally:
        producer.kill()
    done = producer.of("done")[0]
    acks = producer.of("ack")
    assert acked_before < count and done["acked"] == len(acks) > acked_before
    failed = {e["value"] for e in producer.of("failed")}
    read = await sarama.run(sarama_bin, "read", "-brokers", bootstrap, "-topic", topic,
                            "-expect", str(count), "-idle", "10", timeout=120)
    recs = [e for e in read if e["event"] == "rec"]
    values = Counter(r["value"] for r in recs)
    assert [v for v, n in values.items() if n > 1] == []                   # nothing duplicated
    acked = {a["value"] for a in acks}
    assert acked <= set(values), sorted(acked - set(values))[:10]          # nothing acked lost
    assert set(values) <= acked | failed                                    # nothing invented
    positions = {(r["partition"], r["offset"]): r["value"] for r in recs}
    assert all(positions.get((a["partition"], a["offset"])) == a["value"] for a in acks)


async def test_acl_admin_over_sasl_plain(sarama_bin, broker_process, tmp_path):
    """sarama 1.22's ACL calls send v0 of DescribeAcls, CreateAcls and DeleteAcls (no pattern
    type: LITERAL), over SASL/PLAIN with SaslHandshake v1 and SaslAuthenticate v0."""
    from txbroker.service.users import edit_users, load_users

    path = users_file(tmp_path / "users.json", alice="alice-secret", bob="bob-secret")
    with edit_users(path) as box:
        box[0] = box[0].with_password("alice", "alice-secret", ("admin",))
    port = free_port()
    broker_process(kafka_port=port, kafka_sasl_mechanisms="PLAIN",
                   kafka_sasl_plain_over_plaintext=True, users_file=path)
    bootstrap = f"127.0.0.1:{port}"
    events = await sarama.run(sarama_bin, "acls", "-brokers", bootstrap, "-user", "alice",
                              "-password", "alice-secret", "-topic", "orders")
    read, allow = 3, 3      # Kafka's AclOperation.READ and AclPermissionType.ALLOW
    assert events == [
        {"event": "listed", "acls": [f"orders User:bob {read} {allow}"]},
        {"event": "deleted", "acls": ["orders User:bob 0"]},
        {"event": "after", "acls": []}]
    assert load_users(path).acls == ()
    # a wrong password is refused, and nothing is created
    r = await sarama.Run.start(sarama_bin, "acls", "-brokers", bootstrap, "-user", "alice",
                               "-password", "wrong", "-topic", "orders")
    assert await r.wait(60) == 1 and r.events[-1]["event"] == "error"
    assert load_users(path).acls == ()
