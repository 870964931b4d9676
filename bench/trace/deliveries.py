"""Delivery recording for ``bench replay`` (RocketMQ side): ``consumers`` Spark tasks, each a
:class:`~txbroker.client.Consumer` pulling fixed queues (``Consumer.assign``) from the first
offset, yielding one row per received message; Spark writes them as Parquet while they come.
The job runs from its own driver thread beside the replay job, so no delivery passes through
the driver.

Queue ``i`` of the sorted (topic, broker, queue) list goes to task ``i % consumers``.  Every
task's consumer is a member of one group (``bench-c-<run id>``), committing its offsets for
that group: a consumer restart scheduled in the trace (``consumer_restarts``) shuts the task's
consumer down for ``down_ms`` and starts a new one from the committed offsets, as a restarted
application would, so the messages received but not yet committed come again.

End of recording: once every replay task has finished, the driver sends one end marker per
queue (:func:`send_end_markers`: a plain message with property ``BENCH_END=<run id>``, sent
after the last transaction of the run was decided or discarded).  A task stops once it has
seen the marker on each of its queues and then nothing for ``idle_s``, or ``max_wait_s`` after
its first marker, whatever came.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from txbroker.bench.trace.spec import PROP_RUN, PROP_TX
from txbroker.bench.trace.tasks import (
    JOB_GRACE_S,
    BackgroundJob,
    ProgressReporter,
    RowFeed,
    now_ms,
    stream_task,
)

#: Property of an end marker: the run id it ends.
PROP_END = "BENCH_END"
#: Property naming a message's index within its trace row (the replay sets it).
PROP_MSG = "BENCH_MSG"

DELIVERY_COLUMNS = {
    "tx": "bigint: trace row (BENCH_TX property)",
    "msg": "int: message index within the row (BENCH_MSG property)",
    "topic": "string", "queue_id": "int", "queue_offset": "bigint",
    "msg_id": "string", "transaction_id": "string",
    "store_ms": "double: broker store time of the committed message",
    "recv_ms": "double: consumer received it",
    "consumer": "int: delivery task that received it",
}
DELIVERY_SCHEMA = ("tx bigint, msg int, topic string, queue_id int, queue_offset bigint, "
                   "msg_id string, transaction_id string, store_ms double, recv_ms double, "
                   "consumer int")

#: A queue as it travels to an executor: (topic, broker name, queue id).
QueueKey = tuple[str, str, int]



@dataclass(frozen=True)
class DeliveryParams:
    namesrv: str
    run_id: str
    queues: tuple[QueueKey, ...]   # every queue of every trace topic, sorted
    consumers: int
    epoch_ms: float                 # the replay's epoch: restarts are at epoch + at_ms
    restarts: tuple[tuple[int, int, int], ...] = ()  # (at_ms, consumer, down_ms)
    max_wait_s: float = 60.0
    idle_s: float = 2.0
    progress: str | None = None
    phase: str = "deliveries-rocketmq"

    @property
    def group(self) -> str:
        return f"bench-c-{self.run_id}"

    def queues_of(self, task: int) -> list[QueueKey]:
        return [q for i, q in enumerate(self.queues) if i % self.consumers == task]


async def list_queues(namesrv: str, topics: list[str]) -> list[QueueKey]:
    """Every readable queue of ``topics``, sorted (the order tasks are assigned in)."""
    from txbroker.client import Consumer

    consumer = Consumer("bench-queues", namesrv)
    try:
        out: list[QueueKey] = []
        for topic in topics:
            out += [(q.topic, q.broker_name, q.queue_id) for q in await consumer.queues(topic)]
    finally:
        await consumer.shutdown()
    return sorted(out)


async def send_end_markers(namesrv: str, queues: list[QueueKey], run_id: str) -> None:
    """One end marker per queue, sent to that very queue."""
    from txbroker.client import Message, MessageQueue, Producer

    async with Producer(f"bench-end-{run_id}", namesrv, create_topics=False) as producer:
        for topic, broker, qid in queues:
            await producer.send(Message(topic, b"end", properties={PROP_END: run_id}),
                                queue=MessageQueue(topic, broker, qid))


class _Recorder:
    """One delivery task's asyncio side."""

    def __init__(self, p: DeliveryParams, task: int, emit: Callable[[tuple], None]) -> None:
        self.p, self.task, self.emit = p, task, emit
        self.mine = p.queues_of(task)
        #: Queues whose end marker came, as (topic, broker, queue id): on a cluster every
        #: group has a queue 0, so the broker is part of the key.
        self.ended: set[QueueKey] = set()
        self.first_end: float | None = None
        self.last = time.monotonic()

    def _consumer(self):
        from txbroker.client import Consumer, MessageQueue

        c = Consumer(self.p.group, namesrv=self.p.namesrv, from_where="first",
                     rebalance_interval=5.0, long_poll_timeout=1.0, pull_batch_size=64,
                     buffer_size=4096, persist_interval=1.0)
        c.assign([MessageQueue(*q) for q in self.mine])
        return c

    def _stop_now(self) -> bool:
        now = time.monotonic()
        if self.first_end is None:
            return False
        if now - self.first_end >= self.p.max_wait_s:
            return True
        return len(self.ended) == len(self.mine) and now - self.last >= self.p.idle_s

    def _take(self, msg) -> None:
        props = msg.properties
        self.last = time.monotonic()
        if props.get(PROP_END) == self.p.run_id:
            self.ended.add((msg.topic, msg.broker_name, msg.queue_id))
            self.first_end = self.first_end or time.monotonic()
            return
        if props.get(PROP_RUN) != self.p.run_id:
            return  # an older run's message on a reused broker
        try:
            tx, index = int(props.get(PROP_TX, "")), int(props.get(PROP_MSG, "0"))
        except ValueError:
            tx, index = -1, 0
        self.emit((tx, index, msg.topic, msg.queue_id, msg.queue_offset, msg.msg_id,
                   msg.transaction_id, float(msg.store_timestamp), now_ms(), self.task))

    async def run(self, feed: RowFeed) -> None:
        while await feed.next_batch():
            pass  # the task's one input row only says which task this is
        if not self.mine:
            return
        restarts = sorted((self.p.epoch_ms + at, down) for at, who, down in self.p.restarts
                          if who == self.task)
        consumer = self._consumer()
        await consumer.start()
        try:
            while not self._stop_now():
                if restarts and now_ms() >= restarts[0][0]:
                    _, down = restarts.pop(0)
                    await consumer.shutdown()  # commits what was received
                    await asyncio.sleep(down / 1000.0)
                    consumer = self._consumer()
                    await consumer.start()
                msg = await consumer.poll(0.2)
                if msg is not None:
                    self._take(msg)
        finally:
            await consumer.shutdown()


def task_runner(p: DeliveryParams) -> Callable[[int, Iterable], Iterator[tuple]]:
    def run(index: int, it: Iterable) -> Iterator[tuple]:
        async def worker(feed: RowFeed, emit: Callable[[tuple], None]) -> None:
            await _Recorder(p, index, emit).run(feed)

        return stream_task(it, worker, reporter=ProgressReporter(p.progress, p.phase, index))
    return run


class DeliveryJob(BackgroundJob):
    """The delivery tasks: one Spark task per consumer, beside the replay."""

    def __init__(self, spark, out_uri: str, p: DeliveryParams) -> None:
        super().__init__(
            spark, out_uri, DELIVERY_SCHEMA,
            lambda sc: sc.parallelize([(i,) for i in range(p.consumers)], p.consumers)
            .mapPartitionsWithIndex(task_runner(p)),
            group=f"txbroker-bench-deliveries-{p.run_id}", what=f"delivery tasks ({p.namesrv})",
            timeout=p.max_wait_s + JOB_GRACE_S)
