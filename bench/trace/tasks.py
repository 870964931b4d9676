"""What every bench Spark task that talks to a broker shares: an asyncio worker fed the task's
rows lazily and emitting result rows as it goes, and progress sent to the driver while it runs.

Why a thread: a Spark task is a Python generator driven by PySpark, which pulls the partition's
input from the JVM and pushes what the generator yields back to it.  A replay must keep its
event loop running (timers, check-backs, heartbeats) while PySpark waits on a shuffle block or
writes a batch, so the loop lives in its own thread and the task's own thread only moves rows:
input in batches through a bounded queue (the worker never holds more than ``window`` unread
rows), results back through another queue, yielded as soon as they exist.  Memory per task is
bounded by what the worker keeps in flight, never by the partition's size.

Progress: tasks run on executors, so the driver cannot count their rows until a task ends.  A
:class:`ProgressServer` on the driver (a TCP port on ``driver_host``, which executors reach
anyway) receives ``PHASE TASK COUNT`` lines that :class:`ProgressReporter` sends every half
second from each task; the driver sums the latest count per task.  Progress is best effort: a
task that cannot reach the server works on and reports nothing.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

#: Rows handed to the worker per batch (one queue operation each).
BATCH = 512
#: Seconds between two progress lines of one task.
REPORT_EVERY = 0.5
#: Seconds a delivery job may take past its tasks' own longest wait before it is cancelled.
JOB_GRACE_S = 120.0
_END = object()


def now_ms() -> float:
    """Wall-clock milliseconds: every time a result row records (compared across machines)."""
    return time.time() * 1000.0


class Schedule:
    """When a replay task sends each row: at the trace's ``start_ms`` after ``epoch_ms``
    (``rate`` None), all at once (``rate`` 0: as fast as the in-flight bound allows) or row
    ``id / rate`` (a fixed rate).

    Spark may start a task after its first row was due (more tasks than free slots for a
    moment, a slow executor): the task's whole schedule then shifts by that delay, fixed at its
    first row (rows come sorted), so ``schedule_lag_ms`` measures the replay, not Spark."""

    def __init__(self, epoch_ms: float, rate: float | None) -> None:
        self.epoch_ms, self.rate = epoch_ms, rate
        self.shift_ms: float | None = None

    def due(self, row: dict) -> float:
        if self.rate is None:
            due = self.epoch_ms + row["start_ms"]
        elif self.rate == 0:
            due = self.epoch_ms
        else:
            due = self.epoch_ms + row["id"] * 1000.0 / self.rate
        if self.shift_ms is None:
            self.shift_ms = max(0.0, now_ms() - due)
        return due + self.shift_ms


class RowFeed:
    """The task's input as the worker sees it: ``await feed.next_batch()`` returns up to
    :data:`BATCH` rows (dicts), or an empty list once the partition is exhausted."""

    def __init__(self, window: int) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=max(1, window // BATCH))
        self._done = False

    async def next_batch(self) -> list[dict]:
        if self._done:
            return []
        loop = asyncio.get_running_loop()
        item = await loop.run_in_executor(None, self._q.get)
        if item is _END:
            self._done = True
            return []
        return item


def _new_runner() -> asyncio.Runner:
    try:
        import uvloop
        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        return asyncio.Runner()


def stream_task(rows: Iterable[Any], worker: Callable[[RowFeed, Callable[[tuple], None]], Awaitable[None]],
                *, window: int = 8192, reporter: ProgressReporter | None = None) -> Iterator[tuple]:
    """Run ``worker(feed, emit)`` on its own event loop in a thread and yield every tuple it
    passes to ``emit``, while feeding it ``rows`` (Spark ``Row``s or dicts) in batches.

    The worker must return once ``feed.next_batch()`` gave ``[]`` and its own work is done; an
    exception in it is raised here, failing the Spark task (Spark's retry then replays the
    partition, which a verify counts honestly).  ``reporter`` (optional) is told every emitted
    row."""
    feed = RowFeed(window)
    out: queue.SimpleQueue = queue.SimpleQueue()
    failure: list[BaseException] = []

    def emit(row: tuple) -> None:
        out.put(row)

    def run() -> None:
        try:
            with _new_runner() as runner:
                runner.run(worker(feed, emit))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the task's thread
            failure.append(exc)
        finally:
            out.put(_END)

    thread = threading.Thread(target=run, name="bench-task-loop", daemon=True)
    thread.start()
    finished = False

    def drain() -> Iterator[tuple]:
        nonlocal finished
        while True:
            try:
                item = out.get_nowait()
            except queue.Empty:
                return
            if item is _END:
                finished = True
                return
            if reporter is not None:
                reporter.add(1)
            yield item

    def put(item: object) -> Iterator[tuple]:
        while not finished:
            try:
                feed._q.put(item, timeout=0.05)
                return
            except queue.Full:
                yield from drain()

    try:
        batch: list[dict] = []
        for r in rows:
            batch.append(r.asDict(recursive=True) if hasattr(r, "asDict") else r)
            if len(batch) >= BATCH:
                yield from put(batch)
                yield from drain()
                batch = []
            if finished:
                break
        if batch:
            yield from put(batch)
        yield from put(_END)
        while not finished:
            try:
                item = out.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END:
                finished = True
                break
            if reporter is not None:
                reporter.add(1)
            yield item
        yield from drain()
    finally:
        thread.join(timeout=5)
        if reporter is not None:
            reporter.close()
    if failure:
        raise failure[0]


class ProgressReporter:
    """A task's side of progress: counts rows and sends ``PHASE TASK COUNT`` to the driver's
    :class:`ProgressServer` at most every :data:`REPORT_EVERY` seconds (and once at the end)."""

    def __init__(self, address: str | None, phase: str, task: int) -> None:
        self.phase, self.task, self.count = phase, task, 0
        self._sock: socket.socket | None = None
        self._last = 0.0
        if address:
            host, _, port = address.rpartition(":")
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=2.0)
            except OSError:
                self._sock = None  # best effort: the task works on without reporting

    def add(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last >= REPORT_EVERY:
            self._last = now
            self._send()

    def _send(self) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendall(f"{self.phase} {self.task} {self.count}\n".encode())
        except OSError:
            self._sock = None

    def close(self) -> None:
        self._send()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class ProgressServer:
    """The driver's side: accepts task connections on ``host`` (port chosen by the OS) and keeps
    the latest count per (phase, task).  ``address`` is what tasks are given."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="bench-progress", daemon=True)
        self._thread.start()

    def done(self, phase: str) -> int:
        """Rows reported so far by every task of ``phase``."""
        with self._lock:
            return sum(n for (p, _), n in self._counts.items() if p == phase)

    def reset(self, phase: str) -> None:
        """Forget ``phase``'s counts (a phase run again after a resume)."""
        with self._lock:
            for key in [k for k in self._counts if k[0] == phase]:
                del self._counts[key]

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn, conn.makefile("r", encoding="ascii", errors="replace") as lines:
            for line in lines:
                parts = line.split()
                if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                    continue
                with self._lock:
                    self._counts[(parts[0], int(parts[1]))] = int(parts[2])
                if self._closed.is_set():
                    return

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(timeout=2)


class BackgroundJob:
    """A Spark job writing Parquet from a driver thread of its own: the delivery tasks run
    beside the replay's job, which holds the caller's thread (Spark schedules the jobs of
    several driver threads at once).  Its job group lets the driver cancel it; :meth:`wait`
    re-raises its failure in the caller, as one line naming ``what``."""

    def __init__(self, spark, out_uri: str, schema, rdd: Callable[[Any], Any], *, group: str,
                 what: str, timeout: float) -> None:
        self.spark, self.out_uri, self.schema, self.rdd = spark, out_uri, schema, rdd
        self.group, self.what, self.timeout = group, what, timeout
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=group, daemon=True)

    def _run(self) -> None:
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(self.group, f"txbroker bench: {self.what}", interruptOnCancel=True)
            self.spark.createDataFrame(self.rdd(sc), self.schema).write.parquet(self.out_uri)
        except BaseException as exc:  # noqa: BLE001 - raised by wait() in the caller's thread
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.spark.sparkContext.cancelJobGroup(self.group)
        self._thread.join(30)

    def wait(self) -> None:
        """Until the tasks stopped (by their own rule); past ``timeout`` seconds the job is
        cancelled and this raises."""
        self._thread.join(self.timeout)
        if self._thread.is_alive():
            self.cancel()
            raise RuntimeError(f"{self.what} did not stop within {self.timeout:.0f} s")
        if self._error is not None:
            first = str(self._error).splitlines()[0] if str(self._error) else type(self._error).__name__
            raise RuntimeError(f"{self.what} failed: {first}") from self._error
