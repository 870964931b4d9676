"""Deliveries of a Kafka replay, recorded by Spark tasks while the replay runs.

``consumers`` delivery tasks run as one Spark job, started from a second driver thread before
the replay job: task ``i`` owns queue ``j`` of the sorted ``(topic, partition)`` list when
``j % consumers == i``, reads it with a read_committed aiokafka consumer from offset 0 (partitions
assigned, no group coordination: nothing to rebalance) and yields one delivery row per record of
this run as it arrives, so Spark writes Parquet as it goes and neither the task nor the driver
holds the deliveries.

End of recording: once the replay tasks finished, the driver waits 1 s and sends one
non-transactional record with header ``bench_end=<run id>`` to every partition
(:func:`send_end_markers`).  A read_committed consumer reaches it only after every transaction
before it ended (committed, aborted, or aborted by the broker at its timeout), so a task stops
once it saw the marker on each of its partitions and then nothing for :data:`IDLE_S`, or
``max_wait_s`` after its first marker whatever happened.

Consumer restarts scheduled by the trace (``consumer_restarts``): at ``at_ms`` the task stops
its consumer, waits ``down_ms`` and starts a new one at the offsets it had processed (a Kafka
consumer without a group restarts from what the application stored, here the next offset after
the last record it handled: no redelivery).  Restarts and the count of records of other runs
come back to the driver through Spark accumulators.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from txbroker.bench.trace.tasks import (
    JOB_GRACE_S,
    BackgroundJob,
    ProgressReporter,
    now_ms,
    stream_task,
)

#: Progress phase of the delivery tasks (records received) on the driver's ProgressServer.
PHASE = "deliveries-kafka"
#: Header of an end marker; its value is the run id.
END_HEADER = "bench_end"
#: Seconds without any record, after the last marker, before a delivery task stops.
IDLE_S = 2.0

DELIVERY_SCHEMA = ("tx bigint, msg int, topic string, queue_id int, queue_offset bigint, "
                   "msg_id string, transaction_id string, store_ms double, recv_ms double, "
                   "consumer int")



def trace_topics(trace) -> list[str]:
    """Every topic a trace writes to (``topics`` of all rows): a handful of names."""
    from pyspark.sql import functions as F

    return sorted(r[0] for r in trace.select(F.explode("topics")).distinct().collect())


def queues_of(topics: list[str], partitions: int) -> tuple[tuple[str, int], ...]:
    return tuple((t, p) for t in sorted(topics) for p in range(partitions))


@dataclass(frozen=True)
class DeliveryParams:
    bootstrap: str
    run_id: str
    epoch_ms: float
    queues: tuple[tuple[str, int], ...]
    consumers: int
    restarts: tuple[dict, ...]   # {"at_ms", "consumer", "down_ms"} from the trace metadata
    max_wait_s: float
    progress: str | None


class DeliveryConsumer:
    """A read_committed consumer of fixed partitions, stopped and started at stored offsets."""

    def __init__(self, p: DeliveryParams, queues: list[tuple[str, int]]) -> None:
        self.p, self.queues = p, queues
        self.next_offset = dict.fromkeys(queues, 0)
        self.client = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self.client = AIOKafkaConsumer(bootstrap_servers=self.p.bootstrap, group_id=None,
                                       isolation_level="read_committed",
                                       enable_auto_commit=False, auto_offset_reset="earliest")
        await self.client.start()
        tps = [TopicPartition(t, q) for t, q in self.queues]
        self.client.assign(tps)
        for tp in tps:
            self.client.seek(tp, self.next_offset[(tp.topic, tp.partition)])
        # One turn of the loop, so the consumer's own background task has started: aiokafka
        # (0.14) stopping a group-less consumer whose task never ran raises that task's
        # CancelledError in the caller (a restart due at once would hit it).
        await asyncio.sleep(0)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None


async def _record(feed, emit: Callable[[tuple], None], p: DeliveryParams, index: int,
                  stats: dict) -> None:
    """Consume task ``index``'s partitions until the stop rule holds (``feed``, the task's
    index as its one row, is not read)."""
    mine = [q for j, q in enumerate(p.queues) if j % p.consumers == index]
    if not mine:
        return
    restarts = sorted((r for r in p.restarts if r["consumer"] == index), key=lambda r: r["at_ms"])
    consumer = DeliveryConsumer(p, mine)
    await consumer.start()
    ended: set[tuple[str, int]] = set()
    last = first_end = None
    try:
        while True:
            now = time.monotonic()
            if restarts and now_ms() >= p.epoch_ms + restarts[0]["at_ms"]:
                r = restarts.pop(0)
                stopped = now_ms()
                await consumer.stop()
                await asyncio.sleep(r["down_ms"] / 1000.0)
                await consumer.start()
                stats["restarts"].append({"consumer": index, "at_ms": r["at_ms"],
                                          "down_ms": r["down_ms"], "stopped_ms": stopped,
                                          "restarted_ms": now_ms(),
                                          "offsets": {f"{t}-{q}": o for (t, q), o
                                                      in consumer.next_offset.items()}})
                continue
            batches = await consumer.client.getmany(timeout_ms=200, max_records=2048)
            for tp, records in batches.items():
                for rec in records:
                    consumer.next_offset[(tp.topic, tp.partition)] = rec.offset + 1
                    last = time.monotonic()
                    headers = {k: v for k, v in rec.headers or ()}
                    if END_HEADER in headers:
                        if headers[END_HEADER] == p.run_id.encode():
                            ended.add((tp.topic, tp.partition))
                            first_end = first_end or last
                        continue
                    if headers.get("bench_run") != p.run_id.encode():
                        stats["foreign"] += 1
                        continue
                    emit((_int(headers.get("bench_tx")), _int(headers.get("bench_msg")),
                          tp.topic, tp.partition, rec.offset, "", "", float(rec.timestamp),
                          now_ms(), index))
                    stats["count"] += 1
            now = time.monotonic()
            if len(ended) == len(mine) and now - (last or now) >= IDLE_S:
                return
            if first_end is not None and now - first_end >= p.max_wait_s:
                return
    finally:
        await consumer.stop()


def _int(raw: bytes | None) -> int:
    try:
        return int(raw or b"")
    except ValueError:
        return -1


def _list_param():
    from pyspark.accumulators import AccumulatorParam

    class ListParam(AccumulatorParam):
        def zero(self, value: list) -> list:
            return []

        def addInPlace(self, a: list, b: list) -> list:
            return a + b
    return ListParam()


class DeliveryJob(BackgroundJob):
    """The delivery tasks: one Spark task per consumer, beside the replay; what they counted
    comes back through accumulators."""

    def __init__(self, spark, out_uri: str, p: DeliveryParams) -> None:
        sc = spark.sparkContext
        self._count = sc.accumulator(0)
        self._foreign = sc.accumulator(0)
        self._restarts = sc.accumulator([], _list_param())
        runner = self._runner(p)
        super().__init__(spark, out_uri, DELIVERY_SCHEMA,
                         lambda sc: sc.parallelize(range(p.consumers), p.consumers)
                         .mapPartitionsWithIndex(runner),
                         group=f"bench-kafka-deliveries-{p.run_id}",
                         what=f"Kafka delivery tasks ({p.bootstrap})",
                         timeout=p.max_wait_s + JOB_GRACE_S)

    def _runner(self, p: DeliveryParams) -> Callable[[int, Iterable], Iterator[tuple]]:
        count, foreign, restarts = self._count, self._foreign, self._restarts

        def run(index: int, rows: Iterable) -> Iterator[tuple]:
            stats: dict = {"count": 0, "foreign": 0, "restarts": []}
            reporter = ProgressReporter(p.progress, PHASE, index) if p.progress else None
            yield from stream_task(rows, lambda feed, emit: _record(feed, emit, p, index, stats),
                                   reporter=reporter)
            count.add(stats["count"])
            foreign.add(stats["foreign"])
            restarts.add(stats["restarts"])
        return run

    def count(self) -> int:
        return self._count.value

    def foreign(self) -> int:
        return self._foreign.value

    def restarts(self) -> list[dict]:
        return sorted(self._restarts.value, key=lambda r: (r["at_ms"], r["consumer"]))


async def send_end_markers(bootstrap: str, topics: list[str], partitions: int, run_id: str) -> None:
    """One non-transactional ``bench_end=<run id>`` record to every partition of every topic."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*(producer.send_and_wait(t, b"", partition=q,
                                                      headers=[(END_HEADER, run_id.encode())])
                               for t, q in queues_of(topics, partitions)))
    finally:
        await producer.stop()
