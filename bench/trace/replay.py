"""``bench replay``: Spark spreads the trace over tasks; each task replays its rows against a
broker with real :class:`~txbroker.client.TransactionProducer`s on its own asyncio loop, while
``consumers`` delivery tasks (:mod:`txbroker.bench.trace.deliveries`) record every delivered
message.  Both are Spark jobs, started from two driver threads, so nothing per transaction or
per delivery passes through the driver: its memory does not grow with the trace.

The trace is partitioned **by producer**, so a producer group lives in exactly one task: the
broker sends a check-back to any live connection of the group, and a task that did not run the
transaction could not answer it from its (in-memory) state.  The listener answers checks the
way an application answers from its database: UNKNOW while the local transaction still runs,
the decision once one was made, otherwise the trace's scripted answer for that check.

Streaming: a task's rows arrive sorted by ``start_ms`` through
:func:`~txbroker.bench.trace.tasks.stream_task`, are paced to their due time, and each row's
result is emitted once it is finished (decided and its scripted checks received, or settle
seconds passed since its send returned or its last check came): a task holds only the
transactions in flight or undecided, whatever the size of its partition.  A finished row stays answerable for :attr:`TaskParams.linger_s` more (a
check crossing the decision still finds it) and is then forgotten.

Rows of several messages are sent as that many halves, one after another, each its own
transaction, all decided alike (RocketMQ has no multi-message transaction).  A ``crash`` row's
half is sent by a dedicated producer instance of the group that dies after ``local_tx_ms``
without ending the transaction; the group's long-lived instance in the task answers the
checks.

A failed transactional send is retried the way an application retries it: as a new
transaction (a new half, the local transaction, END), at most :attr:`TaskParams.send_attempts`
times per message and none begun more than :attr:`TaskParams.retry_window_s` after the row's
first send (back-off 0.5 s doubling to 4 s: a group whose master died has a new one within a
few seconds).  A send whose outcome is unknown (no answer, connection lost after the request
went out) may have left its half stored, to be checked back later: every half carries its
attempt number (``BENCH_ATTEMPT``, the application's outbox key), and a check for a half that
is not the message's current attempt is an orphan: no local transaction ran for it, so it is
answered ROLLBACK (counted in ``orphan_checks``, not among the row's checks).  Only when the
attempts run out is the row a failed send.

Results (Parquet, all times epoch milliseconds as doubles):

* ``transactions/`` — one row per trace row: see :data:`RESULT_COLUMNS`.
* ``deliveries/`` — one row per delivered message: see ``deliveries.DELIVERY_COLUMNS``.
* ``_txbroker_results.json`` — run id, broker address, trace metadata, timings, broker CPU,
  the driver's peak RSS.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from txbroker.bench.trace import deliveries as dl
from txbroker.bench.trace.deliveries import PROP_MSG
from txbroker.bench.trace.fs import WorkFS, join
from txbroker.bench.trace.spec import (
    PROP_RUN,
    PROP_TX,
    SpecError,
    TraceMeta,
    producer_group,
)
from txbroker.bench.trace.tasks import (
    ProgressReporter,
    ProgressServer,
    RowFeed,
    Schedule,
    now_ms,
    stream_task,
)

#: Producers heartbeat this often (the SDK's default is 30 s): a master promoted after a
#: failover checks back only producers that have heartbeated to it, and a replay waits for
#: its scripted checks only a few check intervals.
HEARTBEAT_S = 1.0
#: Each half's attempt number (1, 2, ...) of its message: what tells a retried transaction's
#: half from the halves of its failed attempts when the broker checks one back.
PROP_ATTEMPT = "BENCH_ATTEMPT"
#: Back-off before a failed transactional send is tried again: doubles from the first to the
#: last value.
RETRY_BACKOFF_S = (0.5, 4.0)
RESULTS_META = "_txbroker_results.json"
PROTOCOL = "rocketmq"

RESULT_COLUMNS = {
    "id": "bigint: trace row",
    "task": "int: Spark partition that replayed it",
    "scheduled_ms": "double: when it was due",
    "start_ms": "double: send_message_in_transaction called (first message)",
    "half_ms": "double: half stored (local transaction started); null if the send failed",
    "decided_ms": "double: COMMIT/ROLLBACK sent (by the producer or in a check answer); null if never",
    "return_ms": "double: send_message_in_transaction returned (last message)",
    "first_state": "string: what execute_local_transaction returned (unknown: also a killed instance)",
    "final_state": "string: commit | rollback | unknown (what the producer last told the broker)",
    "check_ms": "array<double>: when each check arrived (every message's)",
    "check_phase": "array<string>: running | undecided | decided — the producer's state then",
    "error": "string: why the send failed; null on success",
    "abandoned_ms": "double: UNKNOW returned or the instance killed; null otherwise",
    "resolved_ms": "double: the decisive check answer (never: the last check); null otherwise",
    "attempts": "int: transactions begun for the row: 1 + halves sent again after a failed send",
}
RESULT_SCHEMA = ("id bigint, task int, scheduled_ms double, start_ms double, half_ms double, "
                 "decided_ms double, return_ms double, first_state string, final_state string, "
                 "check_ms array<double>, check_phase array<string>, error string, "
                 "abandoned_ms double, resolved_ms double, attempts int")

_STATES = {"commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE", "unknown": "UNKNOW"}



def row_messages(row: dict) -> list[str]:
    """Topic of each message of a trace row; a version-1 trace (no ``messages`` / ``topics``
    columns) has one message, on ``topic``."""
    topics = row.get("topics")
    if topics:
        return list(topics)
    return [row["topic"]] * int(row.get("messages") or 1)


@dataclass
class _Tx:
    """One trace row while its task holds it.  Per-message lists: each half is checked (and
    answered from the script) on its own."""

    row: dict
    scheduled_ms: float
    topics: list[str]
    crash: bool
    start_ms: float | None = None
    half_ms: float | None = None
    decided_ms: float | None = None
    return_ms: float | None = None
    first_state: str | None = None
    running: bool = False
    abandoned_ms: float | None = None
    resolved_ms: float | None = None
    states: list[str] = field(default_factory=list)     # per message: commit | rollback | unknown
    scripted: list[int] = field(default_factory=list)   # per message: undecided checks answered
    check_ms: list[float] = field(default_factory=list)
    check_phase: list[str] = field(default_factory=list)
    #: per message: the current attempt (the half a check must name to be this row's); past
    #: the last attempt when the attempts ran out, so every half of the message is an orphan.
    attempt: list[int] = field(default_factory=list)
    #: per message: the current attempt's local transaction ran (its half is stored).
    stored: list[bool] = field(default_factory=list)
    retries: int = 0
    error: str | None = None
    deadline: float | None = None    # monotonic: emitted then, unless a check moves it on
    finished_at: float | None = None  # monotonic: done; emitted linger_s later
    emitted: bool = False

    @property
    def final_state(self) -> str:
        return self.states[0] if self.states and len(set(self.states)) == 1 else "unknown"

    def done(self) -> bool:
        if self.error is not None:
            return True
        if self.return_ms is None:
            return False
        if self.row["kind"] == "never":
            return all(n >= self.row["expected_checks"] for n in self.scripted)
        return all(s != "unknown" for s in self.states)

    def as_tuple(self, task: int) -> tuple:
        return (self.row["id"], task, self.scheduled_ms, self.start_ms, self.half_ms,
                self.decided_ms, self.return_ms, self.first_state, self.final_state,
                self.check_ms, self.check_phase, self.error, self.abandoned_ms,
                self.resolved_ms, 1 + self.retries)


class ScriptedListener:
    """Plays the trace: the local transaction sleeps ``local_tx_ms`` then returns the row's first
    decision; checks get the scripted answers, per message.  ``txs`` holds the rows the task
    still knows; ``on_change(tx, checked)`` is told when a row was checked (or may have
    finished).  ``retried``: row id -> current attempt per message, of every row that had a
    failed send, kept after the row is forgotten (its orphan halves may be checked late).

    The application's database outlives what the task holds: a row emitted and forgotten keeps
    its decisions (one letter per message) for ``remember_s`` more, because a decided half's
    one-way END may have been lost with a master that died, and the master promoted in its
    place checks the half back seconds later.  Such a check is answered from them (counted in
    ``late_checks``, not among the row's checks, which were emitted)."""

    def __init__(self, txs: dict[int, _Tx], on_change: Callable[[_Tx, bool], None],
                 remember_s: float = 30.0) -> None:
        self.txs = txs
        self.on_change = on_change
        self.retried: dict[int, list[int]] = {}
        self.remember_s = remember_s
        #: row id -> its decisions, one letter per message (c, r, u); in emission order, so
        #: the oldest expire first.
        self.decided: dict[int, str] = {}
        self._expiry: collections.deque[tuple[float, int]] = collections.deque()
        self.foreign_checks = 0
        self.orphan_checks = 0
        self.late_checks = 0

    def remember(self, tx: _Tx) -> None:
        """Keep a forgotten row's decisions for ``remember_s``."""
        row = tx.row["id"]
        self.decided[row] = "".join(state[0] for state in tx.states)
        self._expiry.append((time.monotonic() + self.remember_s, row))

    def expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            self.decided.pop(self._expiry.popleft()[1], None)

    async def execute_local_transaction(self, msg, arg: tuple[_Tx, int, asyncio.Future | None]):
        from txbroker.client import LocalTransactionState

        tx, index, crash = arg
        tx.stored[index] = True
        if index == 0:
            tx.half_ms = now_ms()
            tx.running = True
            if tx.row["local_tx_ms"]:
                await asyncio.sleep(tx.row["local_tx_ms"] / 1000.0)
            tx.running = False
            tx.first_state = tx.row["first_decision"]
        if crash is not None:
            # The instance dies here: the caller cancels this send, so no END_TRANSACTION.
            tx.abandoned_ms = tx.abandoned_ms or now_ms()
            crash.set_result(None)
            await asyncio.Event().wait()
        decision = tx.row["first_decision"]
        if decision != "unknown":
            tx.states[index], tx.decided_ms = decision, now_ms()
        else:
            tx.abandoned_ms = tx.abandoned_ms or now_ms()
        return LocalTransactionState[_STATES[decision]]

    async def check_local_transaction(self, msg):
        from txbroker.client import LocalTransactionState

        try:
            row = int(msg.properties.get(PROP_TX, ""))
            index = int(msg.properties.get(PROP_MSG, "0"))
            attempt = int(msg.properties.get(PROP_ATTEMPT, "1"))
            tx = self.txs.get(row)
            if tx is not None:
                current = tx.attempt[index]
            elif row in self.retried:
                current = self.retried[row][index]
            elif row in self.decided:
                current = 1
            else:
                raise KeyError(row)
        except (KeyError, ValueError, IndexError):
            self.foreign_checks += 1
            return LocalTransactionState.UNKNOW
        if attempt != current:
            # A failed attempt's half: no local transaction ran for it (the application's
            # database has no row under this key), so it must never commit.
            self.orphan_checks += 1
            return LocalTransactionState.ROLLBACK_MESSAGE
        if tx is None:
            decided = self.decided.get(row, "")
            letter = decided[index] if index < len(decided) else "u"
            if letter == "u":  # undecided, or no longer remembered: the broker decides
                self.foreign_checks += 1
                return LocalTransactionState.UNKNOW
            self.late_checks += 1
            return (LocalTransactionState.COMMIT_MESSAGE if letter == "c"
                    else LocalTransactionState.ROLLBACK_MESSAGE)
        state = tx.states[index]
        now = now_ms()
        tx.check_ms.append(now)
        if tx.running or tx.first_state is None or not tx.stored[index]:
            tx.check_phase.append("running")
            return LocalTransactionState.UNKNOW
        if state != "unknown":
            tx.check_phase.append("decided")
            return LocalTransactionState[_STATES[state]]
        tx.check_phase.append("undecided")
        tx.scripted[index] += 1
        answers = tx.row["check_answers"] or ["unknown"]
        answer = answers[min(tx.scripted[index], len(answers)) - 1]
        if answer != "unknown":
            tx.states[index], tx.decided_ms = answer, now
            tx.resolved_ms = now
        elif tx.row["kind"] == "never" and tx.scripted[index] >= tx.row["expected_checks"]:
            tx.resolved_ms = now  # the broker discards it at its next pass
        self.on_change(tx, True)
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
    #: How long a finished row stays answerable before it is emitted and forgotten: a check
    #: crossing the decision still finds it (two check intervals).
    linger_s: float = 1.0
    progress: str | None = None  # ProgressServer address
    #: Transactions begun per message at most (the first and its retries), and no retry
    #: begins later than ``retry_window_s`` after the row's first send: a master failover
    #: (promotion in 2-3 s, the route refreshed after it) fits well within both.
    send_attempts: int = 6
    retry_window_s: float = 30.0
    #: How long an emitted row's decisions still answer checks (a master promoted after a
    #: failover checks back halves whose END died with the old one within a few seconds);
    #: memory grows with the rate times this, not with the trace.
    remember_s: float = 30.0


class _ReplayWorker:
    """One replay task's asyncio side: paces its rows, runs them, emits finished rows."""

    def __init__(self, p: TaskParams, task: int, emit: Callable[[tuple], None]) -> None:
        self.p, self.task, self.emit = p, task, emit
        self.txs: dict[int, _Tx] = {}
        self.listener = ScriptedListener(self.txs, self._changed, p.remember_s)
        self.producers: dict[int, asyncio.Task] = {}
        self.finished: collections.deque[_Tx] = collections.deque()
        #: (deadline, row) in deadline order; a row's deadline moves on with each check, the
        #: older entry then no longer matches it and is dropped.
        self.by_deadline: collections.deque[tuple[float, _Tx]] = collections.deque()
        self.schedule = Schedule(p.epoch_ms, p.rate)

    def _extend(self, tx: _Tx) -> None:
        """The row is emitted ``settle_s`` after its send returned or its last check came,
        unless it finishes first: on a loaded broker check passes come late, but come."""
        tx.deadline = time.monotonic() + self.p.settle_s
        self.by_deadline.append((tx.deadline, tx))

    def _changed(self, tx: _Tx, checked: bool = False) -> None:
        if checked and tx.return_ms is not None and not tx.emitted:
            self._extend(tx)
        if tx.finished_at is None and tx.done():
            tx.finished_at = time.monotonic()
            self.finished.append(tx)

    def _emit(self, tx: _Tx) -> None:
        if not tx.emitted:
            tx.emitted = True
            self.txs.pop(tx.row["id"], None)
            self.listener.remember(tx)
            self.emit(tx.as_tuple(self.task))

    def _sweep(self) -> None:
        now = time.monotonic()
        self.listener.expire(now)
        while self.finished and now - self.finished[0].finished_at >= self.p.linger_s:
            self._emit(self.finished.popleft())
        while self.by_deadline:
            deadline, tx = self.by_deadline[0]
            if tx.emitted or deadline != tx.deadline:
                self.by_deadline.popleft()  # emitted already, or a later entry stands for it
            elif now >= deadline:
                self._emit(self.by_deadline.popleft()[1])
            else:
                break

    async def _producer(self, group: int, instance: str | None = None):
        from txbroker.client import TransactionProducer

        prod = TransactionProducer(producer_group(group), namesrv=self.p.namesrv,
                                   listener=self.listener, instance_name=instance,
                                   check_concurrency=self.p.check_concurrency,
                                   heartbeat_interval=HEARTBEAT_S)
        await prod.start()
        return prod

    async def _group(self, group: int):
        task = self.producers.get(group)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            # None yet, or its start failed (no name server for a moment): start one now.
            task = self.producers[group] = asyncio.get_running_loop().create_task(self._producer(group))
        return await task

    async def _one(self, tx: _Tx, slots: asyncio.Semaphore) -> None:
        tx.start_ms = now_ms()
        first = time.monotonic()
        try:
            for index in range(len(tx.topics)):
                await self._send_retrying(tx, index, first)
        except Exception as exc:  # noqa: BLE001 - recorded per row; verify reports it
            tx.error = "; ".join([f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", ())])
        finally:
            tx.return_ms = now_ms()
            self._extend(tx)
            self._changed(tx)
            slots.release()

    async def _send_retrying(self, tx: _Tx, index: int, first: float) -> None:
        """Send message ``index`` of the row in its own transaction; after a failed send, begin
        it again as a new transaction (a new half under the next attempt number) until the
        attempts or the window run out, then raise the last error."""
        from txbroker.client import Message
        from txbroker.client.errors import ClientError

        r = tx.row
        for tried in range(1, self.p.send_attempts + 1):
            msg = Message(tx.topics[index], b"x" * r["body_bytes"], tags=r["tags"], keys=r["keys"],
                          properties={PROP_TX: str(r["id"]), PROP_MSG: str(index),
                                      PROP_RUN: self.p.run_id,
                                      PROP_ATTEMPT: str(tx.attempt[index])})
            try:
                # The group's long-lived instance: it sends, or, for a crash row, answers the
                # checks of the half a dedicated instance sends.
                prod = await self._group(r["producer"])
                if tx.crash:
                    await self._crash_send(tx, index, msg)
                else:
                    await prod.send_message_in_transaction(msg, (tx, index, None))
                return
            except (ClientError, OSError, TimeoutError) as exc:
                # This attempt's half, if stored after all, is an orphan from now on.
                tx.attempt[index] += 1
                self.listener.retried[r["id"]] = tx.attempt
                low, high = RETRY_BACKOFF_S
                delay = min(high, low * 2 ** (tried - 1))
                elapsed = time.monotonic() - first
                if tried == self.p.send_attempts or elapsed + delay > self.p.retry_window_s:
                    exc.add_note(f"message {index}: transaction begun {tried} time(s) over "
                                 f"{elapsed:.1f} s")
                    raise
            tx.retries += 1
            await asyncio.sleep(delay)

    async def _crash_send(self, tx: _Tx, index: int, msg) -> None:
        """Send one half from a short-lived instance of the group that dies before deciding."""
        prod = await self._producer(tx.row["producer"], f"crash-{self.p.run_id}-{tx.row['id']}-{index}")
        dead: asyncio.Future = asyncio.get_running_loop().create_future()
        send = asyncio.get_running_loop().create_task(
            prod.send_message_in_transaction(msg, (tx, index, dead)))
        try:
            await asyncio.wait([send, dead], return_when=asyncio.FIRST_COMPLETED)
        finally:
            send.cancel()
            await asyncio.gather(send, return_exceptions=True)
            await prod.shutdown()
        if send.done() and not send.cancelled() and send.exception() is not None:
            raise send.exception()  # the half itself failed: no local transaction ran

    async def run(self, feed: RowFeed) -> None:
        slots = asyncio.Semaphore(self.p.concurrency)
        pending: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        sweeping = True

        async def sweeper() -> None:
            while sweeping or self.txs:
                self._sweep()
                await asyncio.sleep(0.05)

        sweep = loop.create_task(sweeper())
        try:
            while batch := await feed.next_batch():
                for r in batch:
                    topics = row_messages(r)
                    tx = _Tx(r, self.schedule.due(r), topics, bool(r.get("crash")),
                             states=["unknown"] * len(topics), scripted=[0] * len(topics),
                             attempt=[1] * len(topics), stored=[False] * len(topics))
                    wait = (tx.scheduled_ms - now_ms()) / 1000.0
                    if wait > 0:
                        await asyncio.sleep(wait)
                    await slots.acquire()
                    self.txs[r["id"]] = tx
                    t = loop.create_task(self._one(tx, slots))
                    pending.add(t)
                    t.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*pending)
            sweeping = False
            await sweep  # every row emitted: finished, or its settle deadline passed
            await asyncio.sleep(0.3)  # one-way answers of the last checks leave the socket
        finally:
            sweep.cancel()
            for t in list(pending):
                t.cancel()
            for task in self.producers.values():
                if task.done() and not task.cancelled() and task.exception() is None:
                    await task.result().shutdown()


#: Listener counters summed over the tasks into ``_txbroker_results.json``.
COUNTERS = ("orphan_checks", "late_checks")


def task_runner(p: TaskParams, counters=None) -> Callable[[int, Iterable], Iterator[tuple]]:
    """The Spark task: stream the partition's rows through a :class:`_ReplayWorker`;
    ``counters`` (name -> Spark accumulator, names of :data:`COUNTERS`) sum the listener's."""
    def run(index: int, it: Iterable) -> Iterator[tuple]:
        async def worker(feed: RowFeed, emit: Callable[[tuple], None]) -> None:
            replayer = _ReplayWorker(p, index, emit)
            try:
                await replayer.run(feed)
            finally:
                for name, acc in (counters or {}).items():
                    acc.add(getattr(replayer.listener, name))

        reporter = ProgressReporter(p.progress, f"replay-{PROTOCOL}", index)
        return stream_task(it, worker, window=max(4096, p.concurrency * 4), reporter=reporter)
    return run


async def _create_topics(namesrv: str, topics: list[str]) -> None:
    from txbroker.client.admin import AdminClient
    from txbroker.client.errors import TopicExistsError

    async with AdminClient(namesrv) as admin:
        for topic in topics:
            try:
                await admin.create_topic(topic, 4)
            except TopicExistsError:
                pass  # an earlier replay against the same broker made it: reuse it as it is


def driver_peak_rss_mb(spark) -> dict[str, float]:
    """Peak resident memory of the driver: this Python process and the driver JVM (a child
    process: ``ru_maxrss`` of this process does not count it), from ``VmHWM`` in /proc."""
    import resource

    python = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux
    jvm = None
    try:
        pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                jvm = int(line.split()[1]) / 1024.0
    except (OSError, ValueError, AttributeError):
        jvm = None  # not Linux, or the JVM is not on this machine: the Python side only
    return {"python": round(python, 1), "jvm": None if jvm is None else round(jvm, 1),
            "total": round(python + (jvm or 0.0), 1)}


def check_slots(spark, tasks: int, consumers: int) -> None:
    """Replay and delivery tasks run at the same time: Spark must have a slot for each, or
    the delivery tasks would wait for end markers the replay never gets to send."""
    slots = spark.sparkContext.defaultParallelism
    if slots < tasks + consumers:
        raise SpecError(f"Spark has {slots} task slots (defaultParallelism) but the replay needs "
                        f"{tasks} replay tasks + {consumers} delivery tasks = {tasks + consumers}; "
                        "give the cluster more cores, or lower --tasks or --consumers")


def default_tasks(spark, producers: int, consumers: int) -> int:
    """Replay tasks when none are asked for: the slots left by the delivery tasks, at most one
    per producer group."""
    return max(1, min(producers, spark.sparkContext.defaultParallelism - consumers))


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU seconds the processes ``pids`` used so far (/proc); None when there are none or
    one is gone (an external broker, or a process killed by a fault plan)."""
    from txbroker.bench.broker import proc_cpu_seconds

    if not pids:
        return None
    try:
        return sum(proc_cpu_seconds(pid) for pid in pids)
    except (OSError, ValueError):
        return None


def replay(spark, trace_dir: str | Path, namesrv: str, out: str | Path, *,
           tasks: int | None = None, consumers: int | None = None, concurrency: int = 64,
           rate: float | None = None, progress: ProgressServer | None = None,
           broker_pids: Sequence[int] = (), check_concurrency: int = 1024,
           lead_s: float = 2.0) -> dict:
    """Replay the trace against ``namesrv`` and record its deliveries; write results to
    ``out`` (replaced); return the run summary.

    ``progress``: tasks report rows to it, phases ``replay-rocketmq`` (result rows) and
    ``deliveries-rocketmq`` (messages received).  ``broker_pids``: processes whose CPU over
    the replay is ``broker_cpu_seconds`` (an embedded broker; empty for an external one)."""
    if concurrency < 1 or check_concurrency < 1:
        raise SpecError("--concurrency and --check-concurrency must be >= 1")
    if rate is not None and rate < 0:
        raise SpecError("--rate must be >= 0")
    fs = WorkFS(spark)
    trace_uri, out_uri = fs.qualify(trace_dir), fs.qualify(out)
    meta = TraceMeta.read(fs, trace_uri)
    n_consumers = consumers or getattr(meta, "consumers", None) or 2
    if n_consumers < 1:
        raise SpecError("--consumers must be >= 1")
    n_tasks = max(1, min(tasks or default_tasks(spark, meta.producers, n_consumers), meta.producers))
    check_slots(spark, n_tasks, n_consumers)
    fs.replace_dir(out_uri, RESULTS_META, "results directory")
    trace = spark.read.parquet(trace_uri)
    run_id = uuid.uuid4().hex[:12]
    asyncio.run(_create_topics(namesrv, meta.topic_names()))
    queues = asyncio.run(dl.list_queues(namesrv, meta.topic_names()))
    epoch_ms = now_ms() + lead_s * 1000
    settle_s = meta.broker.settle_seconds()
    address = progress.address if progress is not None else None
    restarts = tuple((int(r["at_ms"]), int(r["consumer"]), int(r["down_ms"]))
                     for r in getattr(meta, "consumer_restarts", None) or ())
    recorder = dl.DeliveryJob(spark, join(out_uri, "deliveries"), dl.DeliveryParams(
        namesrv=namesrv, run_id=run_id, queues=tuple(queues), consumers=n_consumers,
        epoch_ms=epoch_ms, restarts=restarts, max_wait_s=settle_s * 2 + 60,
        progress=address, phase=f"deliveries-{PROTOCOL}"))
    params = TaskParams(namesrv=namesrv, run_id=run_id, epoch_ms=epoch_ms, rate=rate,
                        concurrency=concurrency, settle_s=settle_s,
                        check_concurrency=check_concurrency,
                        linger_s=2 * meta.broker.transaction_check_interval, progress=address)
    cpu_before = cpu_seconds(broker_pids)
    started = time.time()
    recorder.start()
    sc = spark.sparkContext
    counters = {name: sc.accumulator(0) for name in COUNTERS}
    try:
        sc.setJobGroup(f"txbroker-bench-replay-{run_id}", "bench replay tasks")
        rdd = (trace.repartition(n_tasks, "producer").sortWithinPartitions("start_ms", "id").rdd
               .mapPartitionsWithIndex(task_runner(params, counters)))
        spark.createDataFrame(rdd, RESULT_SCHEMA).write.parquet(join(out_uri, "transactions"))
    except BaseException:
        recorder.cancel()
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    replay_done = time.time()
    cpu_after = cpu_seconds(broker_pids)
    time.sleep(1.0)  # the last one-way answers reach the broker before the markers
    asyncio.run(dl.send_end_markers(namesrv, queues, run_id))
    recorder.wait()
    delivered = spark.read.parquet(join(out_uri, "deliveries")).count()
    summary = {"run_id": run_id, "protocol": PROTOCOL, "namesrv": namesrv, "trace": trace_uri,
               "tasks": n_tasks, "consumers": n_consumers, "concurrency": concurrency,
               "rate": rate, "check_concurrency": check_concurrency,
               "epoch_ms": epoch_ms, "started": started, "replay_done": replay_done,
               "finished": time.time(), "deliveries": delivered,
               **{name: acc.value for name, acc in counters.items()},
               "broker_cpu_seconds": (None if cpu_before is None or cpu_after is None
                                      else round(cpu_after - cpu_before, 3)),
               "driver_peak_rss_mb": driver_peak_rss_mb(spark)["total"],
               "driver_peak_rss": driver_peak_rss_mb(spark),
               "trace_meta": asdict(meta)}
    fs.write_text(join(out_uri, RESULTS_META), json.dumps(summary, indent=2) + "\n")
    return summary
