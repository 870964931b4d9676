"""Delivery tasks against a real broker: fixed queues per task, a consumer restart from the
trace's schedule (down for ``down_ms``, back from the committed offsets), and the stop rule
(an end marker on each queue, then quiet)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import pyarrow.parquet as pq
from bench_helpers import E2E_BROKER

from txbroker.bench.trace import deliveries as dl
from txbroker.bench.trace.embedded import EmbeddedBroker
from txbroker.bench.trace.replay import _create_topics
from txbroker.bench.trace.spec import PROP_RUN, PROP_TX

#: Task 0's consumer restarts this long after the epoch (Spark starts its tasks well before,
#: even on a loaded machine) and stays down DOWN_MS; sends go on every 0.1 s until after.
RESTART_AT_MS = 25_000
DOWN_MS = 2000
SENDS = (RESTART_AT_MS + DOWN_MS + 3000) // 100


async def _send(namesrv: str, run_id: str, queues: list[dl.QueueKey]) -> None:
    from txbroker.client import Message, MessageQueue, Producer

    async with Producer("bench-deliveries-test", namesrv) as producer:
        for i in range(SENDS):
            topic, broker, qid = queues[i % len(queues)]
            await producer.send(Message(topic, b"x", properties={PROP_TX: str(i), PROP_RUN: run_id}),
                                queue=MessageQueue(topic, broker, qid))
            await asyncio.sleep(0.1)


def _max_gap(times: list[float]) -> float:
    times = sorted(times)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def test_delivery_tasks_with_a_scheduled_consumer_restart(spark, tmp_path):
    run_id = uuid.uuid4().hex[:12]
    out = tmp_path / "deliveries"
    with EmbeddedBroker(E2E_BROKER) as broker:
        asyncio.run(_create_topics(broker.namesrv_addr, ["BenchT0"]))
        queues = asyncio.run(dl.list_queues(broker.namesrv_addr, ["BenchT0"]))
        assert [q[2] for q in queues] == [0, 1, 2, 3]
        epoch = time.time() * 1000
        job = dl.DeliveryJob(spark, str(out), dl.DeliveryParams(
            namesrv=broker.namesrv_addr, run_id=run_id, queues=tuple(queues), consumers=2,
            epoch_ms=epoch, restarts=((RESTART_AT_MS, 0, DOWN_MS),), max_wait_s=60))
        job.start()
        asyncio.run(_send(broker.namesrv_addr, run_id, queues))
        asyncio.run(dl.send_end_markers(broker.namesrv_addr, queues, run_id))
        job.wait()
    rows = pq.read_table(out).to_pylist()
    # Each task pulled its own queues only: queue i goes to task i % 2.
    assert all(r["queue_id"] % 2 == r["consumer"] for r in rows), rows
    # Every message received; a redelivery is the same queue offset again, never another one.
    assert {r["tx"] for r in rows} == set(range(SENDS))
    places = {}
    for r in rows:
        assert places.setdefault(r["tx"], (r["queue_id"], r["queue_offset"])) == \
            (r["queue_id"], r["queue_offset"])
    # Task 0 was down for DOWN_MS while messages kept coming every 0.2 s to its queues;
    # task 1 never was.  (Both were receiving before the restart was due.)
    recv = {c: [r["recv_ms"] for r in rows if r["consumer"] == c] for c in (0, 1)}
    starts = {c: round(min(recv[c]) - epoch) for c in (0, 1)}
    assert starts[0] < RESTART_AT_MS - 1000 and starts[1] < RESTART_AT_MS, starts
    assert _max_gap(recv[0]) >= DOWN_MS * 0.9, recv[0]
    assert _max_gap(recv[1]) < DOWN_MS * 0.9, recv[1]


def test_the_stop_rule_tells_queues_of_two_broker_groups_apart() -> None:
    """On a cluster each broker group has its own queue 0 of a topic: the end markers of
    both are two queues, so the task stops once quiet after both, not at ``max_wait_s`` (it
    used to key them by topic and queue id, and every cluster run waited the whole 72 s)."""
    from txbroker.client.message import MessageExt

    queues = (("T", "broker-a", 0), ("T", "broker-b", 0))
    rec = dl._Recorder(dl.DeliveryParams(namesrv="", run_id="r", queues=queues, consumers=1,
                                         epoch_ms=0, max_wait_s=3600, idle_s=0.0),
                       0, lambda row: None)
    rec._take(MessageExt("T", b"end", properties={dl.PROP_END: "r"}, broker_name="broker-a"))
    assert not rec._stop_now()  # broker-b's queue 0 has not ended
    rec._take(MessageExt("T", b"end", properties={dl.PROP_END: "r"}, broker_name="broker-b"))
    assert rec._stop_now()
