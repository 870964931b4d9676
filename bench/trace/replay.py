"""``bench replay``: Spark spreads the trace over tasks; each task replays its rows against a
broker with real :class:`~txbroker.client.TransactionProducer`s on its own asyncio loop, and the
driver records every delivered message with a :class:`~txbroker.client.Consumer`.

The trace is partitioned **by producer**, so a producer group lives in exactly one task: the
broker sends a check-back to any live connection of the group, and a task that did not run the
transaction could not answer it from its (in-memory) state.  The listener answers checks the
way an application answers from its database: UNKNOW while the local transaction still runs,
the decision once one was made, otherwise the trace's scripted answer for that check.

Results (Parquet, all times epoch milliseconds as doubles):

* ``transactions/`` — one row per trace row: see :data:`RESULT_COLUMNS`.
* ``deliveries/`` — one row per delivered message: see :data:`DELIVERY_COLUMNS`.
* ``_txbroker_results.json`` — run id, broker address, trace metadata, timings.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.spec import (
    PROP_RUN,
    PROP_TX,
    SpecError,
    TraceMeta,
    producer_group,
)

RESULTS_META = "_txbroker_results.json"

RESULT_COLUMNS = {
    "id": "bigint: trace row",
    "task": "int: Spark partition that replayed it",
    "scheduled_ms": "double: when it was due",
    "start_ms": "double: send_message_in_transaction called",
    "half_ms": "double: half stored (local transaction started); null if the send failed",
    "decided_ms": "double: COMMIT/ROLLBACK sent (by the producer or in a check answer); null if never",
    "return_ms": "double: send_message_in_transaction returned",
    "first_state": "string: what execute_local_transaction returned",
    "final_state": "string: commit | rollback | unknown (what the producer last told the broker)",
    "check_ms": "array<double>: when each check arrived",
    "check_phase": "array<string>: running | undecided | decided — the producer's state then",
    "error": "string: why the send failed; null on success",
}
DELIVERY_COLUMNS = {
    "tx": "bigint: trace row (BENCH_TX property)",
    "topic": "string", "queue_id": "int", "queue_offset": "bigint",
    "msg_id": "string", "transaction_id": "string",
    "store_ms": "double: broker store time of the committed message",
    "recv_ms": "double: consumer received it",
}
_DELIVERY_SCHEMA = ("tx bigint, topic string, queue_id int, queue_offset bigint, msg_id string, "
                    "transaction_id string, store_ms double, recv_ms double")
_RESULT_SCHEMA = ("id bigint, task int, scheduled_ms double, start_ms double, half_ms double, "
                  "decided_ms double, return_ms double, first_state string, final_state string, "
                  "check_ms array<double>, check_phase array<string>, error string")

_STATES = {"commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE", "unknown": "UNKNOW"}


def _now_ms() -> float:
    return time.time() * 1000.0


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
    running: bool = False
    scripted_checks: int = 0
    check_ms: list[float] = field(default_factory=list)
    check_phase: list[str] = field(default_factory=list)
    error: str | None = None

    def done(self) -> bool:
        if self.error is not None or self.final_state != "unknown":
            return True
        return self.row["kind"] == "never" and self.scripted_checks >= self.row["expected_checks"]

    def as_tuple(self, task: int) -> tuple:
        return (self.row["id"], task, self.scheduled_ms, self.start_ms, self.half_ms,
                self.decided_ms, self.return_ms, self.first_state, self.final_state,
                self.check_ms, self.check_phase, self.error)


class ScriptedListener:
    """Plays the trace: the local transaction sleeps ``local_tx_ms`` then returns the row's first
    decision; checks get the scripted answers."""

    def __init__(self, txs: dict[int, _Tx]) -> None:
        self.txs = txs
        self.foreign_checks = 0

    async def execute_local_transaction(self, msg, tx: _Tx):
        from txbroker.client import LocalTransactionState

        tx.half_ms = _now_ms()
        tx.running = True
        if tx.row["local_tx_ms"]:
            await asyncio.sleep(tx.row["local_tx_ms"] / 1000.0)
        decision = tx.row["first_decision"]
        tx.first_state = decision
        tx.running = False
        if decision != "unknown":
            tx.final_state, tx.decided_ms = decision, _now_ms()
        return LocalTransactionState[_STATES[decision]]

    async def check_local_transaction(self, msg):
        from txbroker.client import LocalTransactionState

        try:
            tx = self.txs[int(msg.properties.get(PROP_TX, ""))]
        except (KeyError, ValueError):
            self.foreign_checks += 1
            return LocalTransactionState.UNKNOW
        now = _now_ms()
        tx.check_ms.append(now)
        if tx.running or tx.first_state is None:
            tx.check_phase.append("running")
            return LocalTransactionState.UNKNOW
        if tx.final_state != "unknown":
            tx.check_phase.append("decided")
            return LocalTransactionState[_STATES[tx.final_state]]
        tx.check_phase.append("undecided")
        tx.scripted_checks += 1
        answers = tx.row["check_answers"] or ["unknown"]
        answer = answers[min(tx.scripted_checks, len(answers)) - 1]
        if answer != "unknown":
            tx.final_state, tx.decided_ms = answer, now
        return LocalTransactionState[_STATES[answer]]


@dataclass(frozen=True)
class TaskParams:
    namesrv: str
    run_id: str
    epoch_ms: float
    rate: float | None          # None: trace schedule; 0: unthrottled; R: row id / R
    concurrency: int
    settle_s: float
    #: Check-backs answered at once per producer.  The SDK drops check-backs beyond 16 x this
    #: (the broker has already counted them), so a pass checking thousands of undecided halves
    #: of one group needs a high value or scripted answers get lost.
    check_concurrency: int = 1024


async def _replay_rows(rows: list[dict], p: TaskParams, task: int) -> list[tuple]:
    from txbroker.client import Message, TransactionProducer

    txs: dict[int, _Tx] = {}
    for r in rows:
        if p.rate is None:
            due = p.epoch_ms + r["start_ms"]
        elif p.rate == 0:
            due = p.epoch_ms
        else:
            due = p.epoch_ms + r["id"] * 1000.0 / p.rate
        txs[r["id"]] = _Tx(r, due)
    listener = ScriptedListener(txs)
    producers = {}
    for g in sorted({r["producer"] for r in rows}):
        producers[g] = TransactionProducer(producer_group(g), namesrv=p.namesrv, listener=listener,
                                           check_concurrency=p.check_concurrency)
    for prod in producers.values():
        await prod.start()
    slots = asyncio.Semaphore(p.concurrency)
    pending: set[asyncio.Task] = set()

    async def one(tx: _Tx) -> None:
        r = tx.row
        msg = Message(r["topic"], b"x" * r["body_bytes"], tags=r["tags"], keys=r["keys"],
                      properties={PROP_TX: str(r["id"]), PROP_RUN: p.run_id})
        tx.start_ms = _now_ms()
        try:
            await producers[r["producer"]].send_message_in_transaction(msg, tx)
        except Exception as exc:  # noqa: BLE001 - recorded per row; verify reports it
            tx.error = f"{type(exc).__name__}: {exc}"
        finally:
            tx.return_ms = _now_ms()
            slots.release()

    try:
        for tx in sorted(txs.values(), key=lambda t: (t.scheduled_ms, t.row["id"])):
            wait = (tx.scheduled_ms - _now_ms()) / 1000.0
            if wait > 0:
                await asyncio.sleep(wait)
            await slots.acquire()
            t = asyncio.get_running_loop().create_task(one(tx))
            pending.add(t)
            t.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
        # Wait for the scripted checks (bounded): each undecided half is checked every
        # interval after its immunity time, at most check-max times.
        deadline = time.monotonic() + p.settle_s
        while time.monotonic() < deadline and not all(t.done() for t in txs.values()):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # one-way answers of the last checks leave the socket
    finally:
        for prod in producers.values():
            await prod.shutdown()
    return [t.as_tuple(task) for t in txs.values()]


def _task_runner(p: TaskParams) -> Callable[[int, Iterable], Iterator[tuple]]:
    def run(index: int, it: Iterable) -> Iterator[tuple]:
        rows = [r.asDict() for r in it]
        if not rows:
            return iter(())
        try:
            import uvloop
            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        with runner:
            return iter(runner.run(_replay_rows(rows, p, index)))
    return run


class DeliveryRecorder(threading.Thread):
    """Consumes every trace topic from the first offset in its own thread and event loop and
    keeps each delivered message of this run."""

    def __init__(self, namesrv: str, topics: list[str], run_id: str) -> None:
        super().__init__(name="bench-deliveries", daemon=True)
        self.namesrv, self.topics, self.run_id = namesrv, topics, run_id
        self.rows: list[tuple] = []
        self.foreign = 0
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self._stop_at: float | None = None   # monotonic deadline once asked to stop
        self._idle_s = 2.0
        self._last = time.monotonic()

    def stop(self, expected: int, idle_s: float = 2.0, max_wait_s: float = 30.0) -> None:
        """Stop once ``expected`` deliveries arrived and none came for ``idle_s`` (a late
        duplicate still gets a chance), or after ``max_wait_s`` whatever happened."""
        self._expected, self._idle_s = expected, idle_s
        self._stop_at = time.monotonic() + max_wait_s
        self.join(max_wait_s + 15)

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - surfaced by the driver
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        from txbroker.client import Consumer

        consumer = Consumer(f"bench-c-{self.run_id}", namesrv=self.namesrv, from_where="first",
                            rebalance_interval=1.0, long_poll_timeout=1.0, pull_batch_size=64,
                            buffer_size=4096)
        for topic in self.topics:
            consumer.subscribe(topic, "*")
        await consumer.start()
        self.ready.set()
        try:
            while True:
                msg = await consumer.poll(0.2)
                now = time.monotonic()
                if msg is not None:
                    self._last = now
                    props = msg.properties
                    if props.get(PROP_RUN) != self.run_id:
                        self.foreign += 1
                        continue
                    try:
                        tx = int(props.get(PROP_TX, ""))
                    except ValueError:
                        tx = -1
                    self.rows.append((tx, msg.topic, msg.queue_id, msg.queue_offset, msg.msg_id,
                                      msg.transaction_id, float(msg.store_timestamp), _now_ms()))
                    continue
                if self._stop_at is not None and (
                        now >= self._stop_at or (len(self.rows) >= self._expected
                                                 and now - self._last >= self._idle_s)):
                    break
        finally:
            await consumer.shutdown()


async def _create_topics(namesrv: str, topics: list[str]) -> None:
    from txbroker.client.admin import AdminClient
    from txbroker.client.errors import TopicExistsError

    async with AdminClient(namesrv) as admin:
        for topic in topics:
            try:
                await admin.create_topic(topic, 4)
            except TopicExistsError:
                pass  # an earlier replay against the same broker made it: reuse it as it is


def replay(spark, trace_dir: str | Path, namesrv: str, out: str | Path, *,
           tasks: int | None = None, concurrency: int = 64, rate: float | None = None,
           check_concurrency: int = 1024, lead_s: float = 2.0, on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Replay the trace; write results to ``out`` (replaced); return the run summary."""
    if concurrency < 1 or check_concurrency < 1:
        raise SpecError("--concurrency and --check-concurrency must be >= 1")
    if rate is not None and rate < 0:
        raise SpecError("--rate must be >= 0")
    fs = WorkFS(spark)
    trace_uri, out_uri = fs.qualify(trace_dir), fs.qualify(out)
    meta = TraceMeta.read(fs, trace_uri)
    fs.replace_dir(out_uri, RESULTS_META, "results directory")
    trace = spark.read.parquet(trace_uri)
    expected = trace.filter("expected_outcome = 'commit'").count()
    run_id = uuid.uuid4().hex[:12]
    asyncio.run(_create_topics(namesrv, meta.topic_names()))
    recorder = DeliveryRecorder(namesrv, meta.topic_names(), run_id)
    recorder.start()
    recorder.ready.wait(30)
    if recorder.error:
        raise recorder.error
    n_tasks = tasks or spark.sparkContext.defaultParallelism
    n_tasks = max(1, min(n_tasks, meta.producers))
    params = TaskParams(namesrv=namesrv, run_id=run_id, epoch_ms=_now_ms() + lead_s * 1000,
                        rate=rate, concurrency=concurrency, settle_s=meta.broker.settle_seconds(),
                        check_concurrency=check_concurrency)
    stop_progress = threading.Event()
    if on_progress:
        def report() -> None:
            while not stop_progress.wait(0.25):
                on_progress(len(recorder.rows), expected)
        threading.Thread(target=report, daemon=True).start()
    started = time.time()
    rdd = (trace.repartition(n_tasks, "producer").rdd
           .mapPartitionsWithIndex(_task_runner(params)))
    spark.createDataFrame(rdd, _RESULT_SCHEMA).write.parquet(join(out_uri, "transactions"))
    replay_done = time.time()
    recorder.stop(expected, idle_s=2.0, max_wait_s=max(10.0, meta.broker.settle_seconds() * 2))
    stop_progress.set()
    if on_progress:
        on_progress(len(recorder.rows), expected)
    if recorder.error:
        raise RuntimeError(f"delivery recorder failed: {recorder.error!r}") from recorder.error
    # Collected on the driver, written by Spark: verify reads it wherever its tasks run.
    spark.createDataFrame(recorder.rows, _DELIVERY_SCHEMA).write.parquet(join(out_uri, "deliveries"))
    summary = {"run_id": run_id, "namesrv": namesrv, "trace": trace_uri,
               "tasks": n_tasks, "concurrency": concurrency, "rate": rate,
               "check_concurrency": check_concurrency,
               "epoch_ms": params.epoch_ms, "started": started, "replay_done": replay_done,
               "finished": time.time(), "deliveries": len(recorder.rows),
               "foreign_deliveries": recorder.foreign, "trace_meta": asdict(meta)}
    fs.write_text(join(out_uri, RESULTS_META), json.dumps(summary, indent=2) + "\n")
    return summary

