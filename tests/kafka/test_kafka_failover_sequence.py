"""Producer sequences through a master SIGKILL: a transactional and an idempotent aiokafka
producer go on, with no error, on the slave the controller promotes.  Two broker groups: the
transaction coordinator and both partitions are on ``broker-a``, whose master is killed;
``broker-b`` stays up (a client finds the new master through the metadata a live node gives).

The promoted slave rebuilds the producers' sequence state from the latest snapshot plus the
log after it (docs/kafka.md, "Idempotent producers").  The transactions here complete after
that snapshot: their batches live only in the data topic, and the new master must know their
sequences as a Kafka follower does, or the producer's next batch is OUT_OF_ORDER_SEQUENCE_NUMBER
(45).  At the end every acknowledged record is read once, read_committed."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from txbroker.bench.trace.cluster import EmbeddedCluster
from txbroker.bench.trace.kafka_replay import create_topics
from txbroker.service.kafka.cluster_view import coordinator_index

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

TOPIC = "seq"
#: A snapshot after this many state records: one is written among the first transactions.
SNAPSHOT_RECORDS = 20
#: Transactions before the snapshot (3 state records each: Ongoing, PrepareCommit, CompleteCommit).
BEFORE = 10
#: Transactions after it, before the kill: fewer records than another snapshot needs.
AFTER = 2
#: Transactions after the kill, on the promoted slave.
ON_NEW_MASTER = 5
#: Seconds after the kill the killed broker starts again.
RESTART_AFTER = 3.0
#: Bound on every step that waits for the cluster or a client.
STEP_TIMEOUT = 60


def _id_on_first_group() -> str:
    """A transactional id whose coordinator is ``broker-a`` (the first of two groups)."""
    return next(f"seq-tx-{n}" for n in range(1000) if coordinator_index(f"seq-tx-{n}", 2) == 0)


async def _transaction(producer, partition: int, value: bytes) -> None:
    await producer.begin_transaction()
    await producer.send_and_wait(TOPIC, value, partition=partition)
    await producer.commit_transaction()


async def _partitions_on_node(producer, node: int) -> list[int]:
    from aiokafka import TopicPartition

    partitions = await producer.partitions_for(TOPIC)
    return sorted(p for p in partitions
                  if producer.client.cluster.leader_for_partition(TopicPartition(TOPIC, p)) == node)


async def _read_committed(bootstrap: str, partitions: list[int],
                          expected: int) -> dict[int, list[bytes]]:
    """Every record of ``partitions`` (read_committed), a little past ``expected`` ones."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                isolation_level="read_committed", enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    got: dict[int, list[bytes]] = {p: [] for p in partitions}
    try:
        tps = [TopicPartition(TOPIC, p) for p in got]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        quiet = 0
        for _ in range(120):  # bounded: 120 polls of at most 0.5 s
            batches = await consumer.getmany(*tps, timeout_ms=500)
            for tp, records in batches.items():
                got[tp.partition] += [r.value for r in records]
            total = sum(len(v) for v in got.values())
            quiet = quiet + 1 if not batches else 0
            if total >= expected and quiet >= 2:  # then nothing more: no duplicate follows
                break
    finally:
        await consumer.stop()
    return got


async def test_producers_continue_on_the_promoted_slave(tmp_path) -> None:
    from aiokafka import AIOKafkaProducer

    cluster = EmbeddedCluster(2, {"kafka_snapshot_records": SNAPSHOT_RECORDS},
                              root=tmp_path / "c")
    await asyncio.to_thread(cluster.start)
    txp = idp = None
    try:
        bootstrap = cluster.bootstrap
        await create_topics(bootstrap, [TOPIC])
        txp = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=_id_on_first_group(),
                               linger_ms=0, request_timeout_ms=10000, retry_backoff_ms=200)
        idp = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                               acks="all", linger_ms=0, request_timeout_ms=10000,
                               retry_backoff_ms=200)
        await asyncio.wait_for(txp.start(), STEP_TIMEOUT)
        await asyncio.wait_for(idp.start(), STEP_TIMEOUT)
        on_a = await _partitions_on_node(txp, 1)
        assert len(on_a) >= 2, on_a
        tx_part, id_part = on_a[:2]
        acked: dict[int, list[bytes]] = {tx_part: [], id_part: []}

        async def both(n: int) -> None:
            for _ in range(n):
                value = f"{len(acked[tx_part])}".encode()
                await asyncio.wait_for(_transaction(txp, tx_part, b"tx-" + value), STEP_TIMEOUT)
                acked[tx_part].append(b"tx-" + value)
                await asyncio.wait_for(idp.send_and_wait(TOPIC, b"id-" + value,
                                                         partition=id_part), STEP_TIMEOUT)
                acked[id_part].append(b"id-" + value)

        await both(BEFORE)
        await asyncio.sleep(2.0)  # the scan (every 0.2 s) writes the snapshot meanwhile
        await both(AFTER)
        master = await asyncio.to_thread(cluster.resolve, "broker-a-master")
        await asyncio.to_thread(cluster.kill, master)

        async def rejoin() -> None:
            """The killed broker starts again and becomes the new master's slave (acks=all
            on a SYNC_MASTER waits for one), as in the bench's kill-master plan."""
            await asyncio.sleep(RESTART_AFTER)
            await asyncio.to_thread(cluster.restart, master)

        # no error: each step answered by the promoted slave
        await asyncio.gather(both(ON_NEW_MASTER), rejoin())
        promoted = await asyncio.to_thread(cluster.master_of, "broker-a")
        assert promoted is not None and promoted != master
        got = await _read_committed(bootstrap, [tx_part, id_part],
                                    len(acked[tx_part]) + len(acked[id_part]))
        assert got == acked  # every acknowledged record once, in order
    finally:
        for producer in (txp, idp):
            if producer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.stop(), 30)
        await asyncio.to_thread(cluster.close)
