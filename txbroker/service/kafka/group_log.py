"""The group coordinator's durable records: the system topic ``RMQ_SYS_KAFKA_GROUPS`` of the
commitlog (docs/kafka.md, "Consumer groups"), Kafka's group-metadata records of
``__consumer_offsets``.

Queue 0 holds one JSON record per group change worth keeping: the whole metadata of the group
each time (generation, protocol type and name, leader, members with their session and
rebalance timeouts, the chosen protocol's metadata and assignment), written when a generation
completes SyncGroup, when a static member takes a new member id, and when the group empties;
``{"group": g, "deleted": ms}`` when it is deleted or pruned.  So the latest record of a
group is its state.

Recovery must not grow with history, so the log is compacted by snapshots: every live group's
latest record is appended again, then queue 1 gets ``{"from": q}``, the queue-0 offset where
that snapshot starts.  Loading reads the last queue-1 record and replays queue 0 from there
only: the snapshot plus the changes after it.  A snapshot is taken when more records were
written since the last one than twice the live groups (at least :data:`COMPACT_MIN`), and
when the last one is half ``file_reserved_time`` old, so retention (which deletes whole old
segments) never takes a record that is still a group's state.

Every record goes through one writer task, in the order it was submitted: a record describes
the group as it was when submitted, so a later submission is always the newer state."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable

import orjson

from txbroker.service.kafka.txn_log import read_queue
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

TOPIC = "RMQ_SYS_KAFKA_GROUPS"
STATE_QUEUE = 0
CHECKPOINT_QUEUE = 1
#: Fewest records between two snapshots (a small broker does not rewrite its groups often).
COMPACT_MIN = 1000

log = logging.getLogger(__name__)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _message(doc: dict, queue_id: int = STATE_QUEUE) -> Message:
    return Message(topic=TOPIC, queue_id=queue_id, body=orjson.dumps(doc))


class GroupLog:
    """Writes and replays the group records.  Used from the event loop only.

    ``clock`` gives wall-clock seconds (the age of the last snapshot)."""

    def __init__(self, store: MessageStore, *, reserved_time: float,
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self.reserved_time = reserved_time
        #: Records written since the last snapshot, and when that snapshot was taken.
        self.since_snapshot = 0
        self.snapshot_at = clock()
        self._pending: list[tuple[list[dict], asyncio.Future[bool], bool]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # --- replay ------------------------------------------------------------------------------
    def replay(self) -> dict[str, dict]:
        """The latest record of every group, tombstones included, read from the last
        snapshot on."""
        start = 0
        end = self.store.max_offset(TOPIC, CHECKPOINT_QUEUE)
        if end > self.store.min_offset(TOPIC, CHECKPOINT_QUEUE):
            found = self.store.get(TOPIC, CHECKPOINT_QUEUE, end - 1, 1).messages()
            if found:
                start = orjson.loads(found[-1].body)["from"]
        latest: dict[str, dict] = {}
        count = 0
        for _, m in read_queue(self.store, TOPIC, start):
            doc = orjson.loads(m.body)
            latest[doc["group"]] = doc
            count += 1
        self.since_snapshot = count
        self.snapshot_at = self.clock()
        return latest

    # --- writing -----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._writer(),
                                                            name="kafka-group-log")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, fut, _ in self._pending:
            if not fut.done():
                fut.set_result(False)
        self._pending.clear()

    def submit(self, doc: dict) -> asyncio.Future[bool]:
        """Queue one record; the future says whether it was stored."""
        return self._submit([doc], snapshot=False)

    def snapshot_due(self, live: int) -> bool:
        return (self.since_snapshot > max(COMPACT_MIN, 2 * live)
                or self.clock() - self.snapshot_at >= self.reserved_time / 2)

    def snapshot(self, docs: list[dict]) -> asyncio.Future[bool]:
        """Queue a snapshot: ``docs`` (every live group's record), then the checkpoint."""
        self.since_snapshot = 0
        self.snapshot_at = self.clock()
        return self._submit(docs, snapshot=True)

    def _submit(self, docs: list[dict], *, snapshot: bool) -> asyncio.Future[bool]:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._task is None:
            fut.set_result(False)
            return fut
        self._pending.append((docs, fut, snapshot))
        self.since_snapshot += 0 if snapshot else len(docs)
        self._wake.set()
        return fut

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            try:
                await self._write(batch)
            except Exception:    # a failed write must not stop every later one
                log.exception("kafka group log: write failed")
                for _, fut, _ in batch:
                    if not fut.done():
                        fut.set_result(False)

    async def _write(self, batch: list[tuple[list[dict], asyncio.Future[bool], bool]]) -> None:
        """One put for everything queued (one flush in sync mode); a snapshot's checkpoint
        follows once its records are stored, naming where they start."""
        msgs = [_message(doc) for docs, _, _ in batch for doc in docs]
        first = self.store.max_offset(TOPIC, STATE_QUEUE)
        results = await self.store.put_batch(msgs) if msgs else []
        at = 0
        for docs, fut, snapshot in batch:
            mine = results[at:at + len(docs)]
            # where this item starts in queue 0 (an empty snapshot: after what came before it)
            start = (mine[0].queue_offset if mine else
                     results[at - 1].queue_offset + 1 if at else first)
            at += len(docs)
            ok = all(r.ok for r in mine)
            if snapshot and all(r.in_log for r in mine):
                # The checkpoint may name the snapshot once its records are in the log, even
                # unacknowledged: a checkpoint never points past records that are not there.
                ok = (await self.store.put(_message({"from": start}, CHECKPOINT_QUEUE))).ok and ok
            if not fut.done():
                fut.set_result(ok)
