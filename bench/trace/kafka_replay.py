"""The trace replayed through Kafka transactions: the Kafka side of ``bench run --protocol``.

Same trace, same pacing and the same results layout as the RocketMQ replay
(:mod:`txbroker.bench.trace.replay`), written to ``WORK/results/kafka``; what a row means here:

* the trace is partitioned **by producer** and sorted by ``start_ms`` within a partition, and
  each trace producer is one aiokafka transactional producer (``transactional.id``
  ``bench-p<producer>``) running its transactions one after the other, as one application
  instance does.  A task therefore has at most as many transactions in flight as it has
  producers, and ``concurrency`` bounds that number further (the most producers of a task
  inside a transaction at once);
* commit / rollback rows: begin, produce the row's messages (topic ``topics[i]``, key
  ``keys``, headers ``bench_tx``, ``bench_msg``, ``bench_run``), sleep ``local_tx_ms``, commit
  or abort;
* every ``first_decision = unknown`` row is an instance that dies inside its transaction (Kafka
  has no check-back to ask it later): begin, produce, sleep, then its connections are dropped
  with no EndTxn.  ``restart_ms`` later a replacement starts: ``unknown_commit`` and
  ``unknown_rollback`` reuse the transactional id, so its InitProducerId fences the dead epoch
  and the broker aborts the open transaction; ``unknown_commit`` then sends the messages again
  in a new transaction and commits (the application's outbox: ``attempts`` 2).  ``never``
  takes a new id (``bench-p<producer>-g<n>``), so only the broker's transaction timeout (the
  trace's ``kafka.transaction_timeout_ms``) ends the old transaction; the replay polls the
  broker and records when it did (:class:`_TimeoutWatch`: the id no longer among the open
  transactions, and the last stable offset past the records that have an offset).

A step that fails with an error that is not the trace's scripted death (a produce refused, the
coordinator or a partition leader moving, a fencing, no answer within :data:`STEP_TIMEOUT_S`)
is handled as a Kafka application handles it: the instance is closed (its open transaction,
if any, is aborted by the broker when the next instance's InitProducerId fences it), a new
instance with the same transactional id starts and the same trace transaction runs again, after
:data:`FIRST_BACKOFF_S` doubling to :data:`MAX_BACKOFF_S`, at most ``TaskParams.attempts``
times per step and none begun more than ``TaskParams.retry_window_s`` after the step's first
run (6 and 30 s by default).
An error from ``commit_transaction`` is retried too: aiokafka retries a retriable EndTxn
itself, so it raises only when the broker refused the commit.  A commit with no answer within
:data:`COMMIT_TIMEOUT_S` may have been applied and is not run again: the row fails.  ``retries``
counts the runs again, ``attempts`` the transactions begun; a row is ``send_failed`` (its
``error`` set) only when the retries are exhausted.

Deliveries are recorded meanwhile by Spark tasks of :mod:`txbroker.bench.trace.kafka_deliveries`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from txbroker.bench.trace import kafka_deliveries as deliveries
from txbroker.bench.trace import replay as rmq
from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.spec import SpecError, TraceMeta, producer_group, read_trace
from txbroker.bench.trace.tasks import (
    ProgressReporter,
    ProgressServer,
    Schedule,
    now_ms,
    stream_task,
)

log = logging.getLogger(__name__)

RESULTS_META = "_txbroker_results.json"
PROTOCOL = "kafka"
#: Progress phase of the replay tasks (rows done) on the driver's ProgressServer.
PHASE = "replay-kafka"
#: Partitions of every trace topic: the queues a RocketMQ replay creates.
PARTITIONS = 4
#: Delay before a replacement instance starts when the trace gives none (version 1 traces).
DEFAULT_RESTART_MS = 200
#: Rows a task holds queued for its producers at most (the task's memory bound).
WINDOW = 4096
#: Seconds between two polls of the broker for abandoned ``never`` transactions.
POLL_S = 0.1
#: Coordinator states of a transaction the broker has not ended yet.
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")
#: Runs of one step of a row at most (the first and the retries), and the window from the
#: step's first run in which a retry may begin: a group's slave is promoted within a few seconds.
ATTEMPTS = 6
RETRY_WINDOW_S = 30.0
#: Back-off before the first retry of a step, doubling up to the last.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 4.0
#: Bound on a step before its commit (start, begin, produce): then it counts as failed and
#: runs again on a new instance.  Well within the retry window: an aiokafka producer that
#: still asks a killed leader can hang until its metadata ages out, while a new instance
#: learns the promoted one from the bootstrap servers at once.
STEP_TIMEOUT_S = 10.0
#: Bound on a commit: past it the outcome is unknown and the row fails.
COMMIT_TIMEOUT_S = 120.0
#: A ``never`` row's transaction not seen ended this long after its timeout is left unresolved.
RESOLVE_MARGIN_S = 60.0

_RESULT_SCHEMA = ("id bigint, task int, scheduled_ms double, start_ms double, half_ms double, "
                  "decided_ms double, return_ms double, first_state string, final_state string, "
                  "check_ms array<double>, check_phase array<string>, error string, "
                  "abandoned_ms double, resolved_ms double, attempts int, retries int")



@dataclass(frozen=True)
class TaskParams:
    bootstrap: str
    run_id: str
    epoch_ms: float
    rate: float | None          # None: trace schedule; 0: unthrottled; R: row id / R
    concurrency: int
    transaction_timeout_ms: int
    progress: str | None        # the driver's ProgressServer address
    attempts: int = ATTEMPTS    # runs of one step of a row at most
    retry_window_s: float = RETRY_WINDOW_S
    resolve_margin_s: float = RESOLVE_MARGIN_S


@dataclass
class _Tx:
    row: dict
    scheduled_ms: float
    start_ms: float | None = None
    half_ms: float | None = None
    decided_ms: float | None = None
    return_ms: float | None = None
    first_state: str | None = None
    final_state: str = "unknown"
    error: str | None = None
    abandoned_ms: float | None = None
    resolved_ms: float | None = None
    #: Transactions begun for the row (``unknown_commit``: 2, more when a step ran again).
    attempts: int = 0
    #: Steps run again after an error that was not the trace's (see the module docstring).
    retries: int = 0
    #: partition -> highest offset of this transaction's records (what the LSO must pass).
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def as_tuple(self, task: int) -> tuple:
        return (self.row["id"], task, self.scheduled_ms, self.start_ms, self.half_ms,
                self.decided_ms, self.return_ms, self.first_state, self.final_state, [], [],
                self.error, self.abandoned_ms, self.resolved_ms, self.attempts, self.retries)


async def _die(producer) -> None:
    """End an instance the way a crash does: no EndTxn, its connections dropped.

    aiokafka's ``stop()`` would flush and close in order; a process that dies does neither, so
    the sender task (the only one that would ever send EndTxn, and only once a commit or abort
    is asked) is cancelled and the client's connections closed."""
    producer._closed = True   # its own stop() (in a finally) then does nothing
    await producer._sender.close()
    await producer.client.close()


class CommitUnknown(Exception):
    """A commit with no answer: it may have been applied, so the row is not run again."""


class _TimeoutWatch:
    """Tells when the broker ended abandoned ``never`` transactions at their timeout.

    Kafka's sign is the partitions' last stable offset (the read_committed end offset) passing
    the transaction's records.  txbroker places transactional records in their partitions only
    at commit (docs/kafka.md, "Transactions: the half-message design": a transactional produce
    answers offset -1 and an open transaction holds no reader back), so there the LSO says
    nothing; what does, on both brokers, is the coordinator no longer listing the transactional
    id among open transactions (ListTransactions).  A transaction is resolved at the first poll
    where both hold (the LSO part only for records that have an offset)."""

    def __init__(self, bootstrap: str, bound_s: float) -> None:
        self.bootstrap = bootstrap
        #: How long a transaction is waited for at most (its timeout and a margin): a replay
        #: never hangs on a broker that does not end it, or on polls that keep failing.
        self.bound_s = bound_s
        self._waiting: list[tuple[_Tx, str, asyncio.Future]] = []
        self._consumer = None
        self._admin = None
        self._task: asyncio.Task | None = None

    async def resolved(self, tx: _Tx, transactional_id: str) -> None:
        """Return once the broker ended ``tx``, begun by ``transactional_id`` (sets resolved_ms),
        or after :attr:`bound_s` with resolved_ms unset (verify counts it unresolved)."""
        loop = asyncio.get_running_loop()
        if self._task is None:
            from aiokafka import AIOKafkaConsumer
            from kafka.admin import KafkaAdminClient

            self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                              isolation_level="read_committed",
                                              enable_auto_commit=False)
            await self._consumer.start()
            self._admin = await loop.run_in_executor(
                None, lambda: KafkaAdminClient(bootstrap_servers=self.bootstrap))
            self._task = loop.create_task(self._poll())
        fut = loop.create_future()
        self._waiting.append((tx, transactional_id, fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.bound_s)
        except TimeoutError:
            self._waiting = [w for w in self._waiting if w[2] is not fut]
            log.warning("row %s: the transaction %s abandoned was not seen ended within %g s",
                        tx.row["id"], transactional_id, self.bound_s)

    async def _open_ids(self) -> set[str]:
        listed = await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._admin.list_transactions(state_filters=list(OPEN_STATES)))
        return {t.transactional_id for per_broker in listed.values() for t in per_broker}

    async def _poll(self) -> None:
        from aiokafka import TopicPartition

        while True:
            await asyncio.sleep(POLL_S)
            if not self._waiting:
                continue
            tps = {TopicPartition(t, p) for tx, _, _ in self._waiting
                   for (t, p), off in tx.offsets.items() if off >= 0}
            try:
                open_ids = await self._open_ids()
                lso = await self._consumer.end_offsets(list(tps)) if tps else {}
            except Exception as exc:  # noqa: BLE001 - a failed poll is tried again at the next one
                log.debug("poll for abandoned transactions failed: %r", exc)
                continue
            now, still = now_ms(), []
            for tx, tid, fut in self._waiting:
                if tid not in open_ids and all(lso.get(TopicPartition(t, p), -1) > off
                                               for (t, p), off in tx.offsets.items() if off >= 0):
                    tx.resolved_ms = now
                    fut.set_result(None)
                else:
                    still.append((tx, tid, fut))
            self._waiting = still

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._admin.close)


class _Instance:
    """One trace producer: its current aiokafka producer and the generation of its id."""

    def __init__(self, index: int, p: TaskParams) -> None:
        self.index, self.p = index, p
        self.generation = 0
        self.producer = None

    def transactional_id(self) -> str:
        base = producer_group(self.index)
        return base if self.generation == 0 else f"{base}-g{self.generation}"

    async def start(self) -> None:
        """A new instance (InitProducerId fences any older epoch of the same id)."""
        from aiokafka import AIOKafkaProducer

        self.producer = AIOKafkaProducer(bootstrap_servers=self.p.bootstrap,
                                         transactional_id=self.transactional_id(),
                                         transaction_timeout_ms=self.p.transaction_timeout_ms,
                                         linger_ms=0)
        await self.producer.start()

    async def produce(self, tx: _Tx) -> None:
        r = tx.row
        body = b"x" * r["body_bytes"]
        key = r["keys"].encode()
        futures = []
        for i, topic in enumerate(r["topics"] or [r["topic"]]):
            headers = [("bench_tx", str(r["id"]).encode()), ("bench_msg", str(i).encode()),
                       ("bench_run", self.p.run_id.encode())]
            futures.append(await self.producer.send(topic, body, key=key, headers=headers))
        for i, fut in enumerate(futures):
            md = await fut
            if i == 0 and tx.half_ms is None:
                tx.half_ms = now_ms()
            tp = (md.topic, md.partition)
            tx.offsets[tp] = max(md.offset, tx.offsets.get(tp, -1))

    async def discard(self) -> None:
        """Close a failed instance as a crash would (any open transaction is aborted when the
        next instance of the id fences it)."""
        producer, self.producer = self.producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(_die(producer), STEP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the instance is dropped either way
                log.debug("closing a failed producer: %r", exc)

    async def retrying(self, tx: _Tx, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` on the current instance (started first when there is none), and after
        an error that is not the trace's, again on a new instance of the same id, bounded as
        the module docstring says; the last error is raised when the bound is reached."""
        loop = asyncio.get_running_loop()
        window_end = loop.time() + self.p.retry_window_s
        backoff = FIRST_BACKOFF_S
        for run in range(1, self.p.attempts + 1):
            try:
                if self.producer is None:
                    await asyncio.wait_for(self.start(), STEP_TIMEOUT_S)
                await step()
                return
            except CommitUnknown:
                raise
            except Exception as exc:
                if run == self.p.attempts or loop.time() + backoff > window_end:
                    raise
                log.info("row %s on %s: %r; a new instance runs it again in %g s", tx.row["id"],
                         self.transactional_id(), exc, backoff)
                await self.discard()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                tx.retries += 1

    async def transaction(self, tx: _Tx, local_tx_ms: int, commit: bool | None) -> None:
        """One transaction of the row: begin, produce, the local transaction, then commit,
        abort, or (``commit`` None) the instance dies with the transaction open."""
        producer = self.producer
        tx.attempts += 1

        async def open_it() -> None:
            await producer.begin_transaction()
            await self.produce(tx)
        await asyncio.wait_for(open_it(), STEP_TIMEOUT_S)
        if local_tx_ms:
            await asyncio.sleep(local_tx_ms / 1000.0)
        if commit is None:
            await _die(producer)
            self.producer = None
            tx.abandoned_ms = now_ms()
        elif commit:
            try:
                await asyncio.wait_for(producer.commit_transaction(), COMMIT_TIMEOUT_S)
            except TimeoutError:
                raise CommitUnknown(f"no answer to the commit within {COMMIT_TIMEOUT_S:g} s; "
                                    "it may have been applied") from None
        else:
            await asyncio.wait_for(producer.abort_transaction(), STEP_TIMEOUT_S)

    async def run(self, tx: _Tx, watch: _TimeoutWatch) -> Awaitable[None] | None:
        """Play one row (see the module docstring).  For a ``never`` row, return once the
        replacement is up, with what to await for the broker's timeout to end the old
        transaction (the producer goes on with its next rows meanwhile); else ``None``."""
        r = tx.row
        tx.start_ms = now_ms()
        decision = r["first_decision"]
        tx.first_state = decision
        if decision in ("commit", "rollback"):
            await self.retrying(tx, lambda: self.transaction(tx, r["local_tx_ms"],
                                                             decision == "commit"))
            tx.final_state, tx.decided_ms = decision, now_ms()
            return None
        await self.retrying(tx, lambda: self.transaction(tx, r["local_tx_ms"], None))
        restart = r.get("restart_ms")
        await asyncio.sleep((DEFAULT_RESTART_MS if restart is None else restart) / 1000.0)
        if r["kind"] == "never":
            abandoned_id = self.transactional_id()
            self.generation += 1
            await self.retrying(tx, _started)
            return watch.resolved(tx, abandoned_id)
        await self.retrying(tx, _started)  # InitProducerId fences the dead epoch
        tx.resolved_ms = now_ms()
        if r["kind"] == "unknown_commit":
            await self.retrying(tx, lambda: self.transaction(tx, 0, True))
            tx.final_state, tx.decided_ms = "commit", now_ms()
        else:
            tx.final_state, tx.decided_ms = "rollback", tx.resolved_ms
        return None


async def _started() -> None:
    """The step of starting a replacement instance: :meth:`_Instance.retrying` starts it."""


async def _replay_task(feed, emit: Callable[[tuple], None], p: TaskParams, task: int) -> None:
    """Feed rows to one sequential runner per trace producer, each at its row's due time."""
    instances: dict[int, _Instance] = {}
    queues: dict[int, asyncio.Queue] = {}
    runners: list[asyncio.Task] = []
    window = asyncio.Semaphore(WINDOW)
    slots = asyncio.Semaphore(p.concurrency)
    watch = _TimeoutWatch(p.bootstrap, p.transaction_timeout_ms / 1000.0 + p.resolve_margin_s)
    schedule = Schedule(p.epoch_ms, p.rate)
    background: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()

    def record(tx: _Tx, exc: BaseException | None = None) -> None:
        if exc is not None:
            tx.error = f"{type(exc).__name__}: {exc}"
        if tx.return_ms is None:  # a timed-out row returned when its producer moved on
            tx.return_ms = now_ms()
        emit(tx.as_tuple(task))
        window.release()

    async def after_timeout(tx: _Tx, resolution: Awaitable[None]) -> None:
        try:
            await resolution
        except Exception as exc:  # noqa: BLE001 - recorded per row; verify reports it
            record(tx, exc)
        else:
            record(tx)

    async def run_producer(index: int) -> None:
        inst, q = instances[index], queues[index]
        while (tx := await q.get()) is not None:
            async with slots:
                try:
                    resolution = await inst.run(tx, watch)
                except Exception as exc:  # noqa: BLE001 - recorded per row; verify reports it
                    record(tx, exc)
                    # Fatal errors stick to an aiokafka producer: the next row gets a new one.
                    await inst.discard()
                    continue
            if resolution is None:
                record(tx)
            else:
                tx.return_ms = now_ms()
                t = loop.create_task(after_timeout(tx, resolution))
                background.add(t)
                t.add_done_callback(background.discard)

    try:
        while batch := await feed.next_batch():
            for row in batch:
                tx = _Tx(row, schedule.due(row))
                wait = (tx.scheduled_ms - now_ms()) / 1000.0
                if wait > 0:
                    await asyncio.sleep(wait)
                await window.acquire()
                index = row["producer"]
                if index not in instances:
                    instances[index] = _Instance(index, p)
                    queues[index] = asyncio.Queue()
                    runners.append(loop.create_task(run_producer(index)))
                queues[index].put_nowait(tx)
        for q in queues.values():
            q.put_nowait(None)
        await asyncio.gather(*runners)
        while background:
            await asyncio.gather(*list(background))
    finally:
        for t in [*runners, *background]:
            t.cancel()
        await asyncio.gather(*runners, *background, return_exceptions=True)
        await watch.close()
        for inst in instances.values():
            if inst.producer is not None:
                await inst.producer.stop()


def _task_runner(p: TaskParams) -> Callable[[int, Iterable], Iterator[tuple]]:
    def run(index: int, rows: Iterable) -> Iterator[tuple]:
        reporter = ProgressReporter(p.progress, PHASE, index) if p.progress else None
        return stream_task(rows, lambda feed, emit: _replay_task(feed, emit, p, index),
                           window=WINDOW, reporter=reporter)
    return run


async def create_topics(bootstrap: str, topics: list[str]) -> None:
    """CreateTopics through the Kafka listener, :data:`PARTITIONS` each; a topic that exists
    (an earlier replay against the same broker) is used as it is."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        resp = await admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics])
    except (KafkaError, OSError) as exc:
        # OSError(strerror, filename): the CLI prints it as one line naming the address.
        raise OSError(None, f"no Kafka listener answers ({exc})", bootstrap) from None
    finally:
        await admin.close()
    for name, code, *rest in resp.topic_errors:
        if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
            reason = rest[0] if rest and rest[0] else f"error code {code}"
            raise OSError(None, f"the Kafka listener refused to create topic {name}: {reason}",
                          bootstrap)


def replay(spark, trace_dir: str | Path, bootstrap: str, out: str | Path, *,
           tasks: int | None = None, consumers: int | None = None, concurrency: int = 64,
           rate: float | None = None, progress: ProgressServer | None = None,
           broker_pids: Iterable[int] = (), lead_s: float = 2.0) -> dict:
    """Replay the trace through Kafka transactions at ``bootstrap`` while ``consumers``
    delivery tasks record what read_committed consumers receive; write ``out`` (replaced) as
    the results of the ``kafka`` protocol and return the run summary.

    Replay tasks and delivery tasks hold Spark slots at the same time: fewer slots than both
    together is refused (the delivery tasks would wait for end markers the replay could never
    send)."""
    if concurrency < 1:
        raise SpecError("--concurrency must be >= 1")
    if rate is not None and rate < 0:
        raise SpecError("--rate must be >= 0")
    fs = WorkFS(spark)
    trace_uri, out_uri = fs.qualify(trace_dir), fs.qualify(out)
    meta = TraceMeta.read(fs, trace_uri)
    timeout_ms = meta.kafka.transaction_timeout_ms
    n_consumers = consumers or meta.consumers
    if n_consumers < 1:
        raise SpecError("--consumers must be >= 1")
    trace = read_trace(spark, trace_uri, meta)
    n_tasks = max(1, min(tasks or rmq.default_tasks(spark, meta.producers, n_consumers),
                         meta.producers))
    rmq.check_slots(spark, n_tasks, n_consumers)
    fs.replace_dir(out_uri, RESULTS_META, "results directory")
    topics = deliveries.trace_topics(trace)
    asyncio.run(create_topics(bootstrap, topics))
    run_id = uuid.uuid4().hex[:12]
    params = TaskParams(bootstrap=bootstrap, run_id=run_id, epoch_ms=now_ms() + lead_s * 1000,
                        rate=rate, concurrency=concurrency,
                        transaction_timeout_ms=timeout_ms,
                        progress=progress.address if progress else None)
    settle_s = timeout_ms / 1000.0 + 5.0
    recorder = deliveries.DeliveryJob(
        spark, join(out_uri, "deliveries"),
        deliveries.DeliveryParams(bootstrap=bootstrap, run_id=run_id, epoch_ms=params.epoch_ms,
                                  queues=deliveries.queues_of(topics, PARTITIONS),
                                  consumers=n_consumers, restarts=tuple(asdict(r) for r in meta.consumer_restarts),
                                  max_wait_s=settle_s * 2 + 60.0,
                                  progress=params.progress))
    cpu0 = rmq.cpu_seconds(broker_pids)
    started = time.time()
    recorder.start()
    try:
        rdd = (trace.repartition(n_tasks, "producer").sortWithinPartitions("start_ms", "id")
               .rdd.mapPartitionsWithIndex(_task_runner(params)))
        spark.createDataFrame(rdd, _RESULT_SCHEMA).write.parquet(join(out_uri, "transactions"))
        replay_done = time.time()
        time.sleep(1.0)
        asyncio.run(deliveries.send_end_markers(bootstrap, topics, PARTITIONS, run_id))
    except BaseException:
        recorder.cancel()
        raise
    recorder.wait()
    cpu1 = rmq.cpu_seconds(broker_pids)
    summary = {"protocol": PROTOCOL, "run_id": run_id, "bootstrap": bootstrap, "trace": trace_uri,
               "tasks": n_tasks, "consumers": n_consumers, "concurrency": concurrency,
               "rate": rate, "epoch_ms": params.epoch_ms, "started": started,
               "replay_done": replay_done, "finished": time.time(),
               "deliveries": recorder.count(), "foreign_deliveries": recorder.foreign(),
               "consumer_restarts": recorder.restarts(),
               "transaction_timeout_ms": timeout_ms,
               "broker_cpu_seconds": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
               "driver_peak_rss_mb": rmq.driver_peak_rss_mb(spark)["total"],
               "driver_peak_rss": rmq.driver_peak_rss_mb(spark),
               "trace_meta": asdict(meta)}
    fs.write_text(join(out_uri, RESULTS_META), json.dumps(summary, indent=2) + "\n")
    return summary

