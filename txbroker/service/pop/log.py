"""The POP log: POP state records in the system topic ``RMQ_SYS_POP_LOG`` of the commitlog
(RocketMQ keeps its checkpoints and acks in its revive topic), so a slave holds them and a
promoted slave or a restarted broker rebuilds the state (:mod:`.state`) from them.

Queue 0 holds the records in the order they were applied: a record is appended in the same
loop step as it is applied in memory (an append is synchronous), so replay order is apply
order.  Recovery must not grow with history, so the log is compacted by snapshots: every
queue's state is appended again as ``snap`` records, then queue 1 gets ``{"from": q}``, the
queue-0 offset where that snapshot starts; replay reads the last queue-1 record and queue 0
from there.  A snapshot is due after more records than twice the in-flight entries (at least
:data:`COMPACT_MIN`), and when the last one is half ``file_reserved_time`` old, so retention
(which deletes whole old segments) never takes a record the state still needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import orjson

from txbroker.service.pop.state import PopState, snapshot
from txbroker.store.record import Message
from txbroker.store.results import PutResult

TOPIC = "RMQ_SYS_POP_LOG"
RECORD_QUEUE = 0
CHECKPOINT_QUEUE = 1
COMPACT_MIN = 1000

log = logging.getLogger(__name__)


def message(doc: dict, queue_id: int = RECORD_QUEUE) -> Message:
    return Message(topic=TOPIC, queue_id=queue_id, body=orjson.dumps(doc))


class PopLog:
    """Appends and replays POP records.  Used from the event loop only."""

    def __init__(self, store, *, reserved_time: float, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self.reserved_time = reserved_time
        self.since_snapshot = 0
        self.snapshot_at = clock()

    async def append(self, doc: dict) -> PutResult:
        """Append one record (the append happens before the first await); the result says
        whether it is stored."""
        self.since_snapshot += 1
        return await self.store.put(message(doc))

    def _records(self, start: int) -> Iterator[dict]:
        offset = max(start, self.store.min_offset(TOPIC, RECORD_QUEUE))
        end = self.store.max_offset(TOPIC, RECORD_QUEUE)
        while offset < end:
            result = self.store.get(TOPIC, RECORD_QUEUE, offset, 256)
            msgs = result.messages() if result.raw else []
            if not msgs:
                if result.next_offset <= offset:
                    return
                offset = result.next_offset
                continue
            for m in msgs:
                try:
                    yield orjson.loads(m.body)
                except orjson.JSONDecodeError:
                    log.error("POP log: unreadable record at offset %d skipped", m.queue_offset)
            offset = msgs[-1].queue_offset + 1

    def replay(self, state: PopState) -> int:
        """Rebuild ``state`` from the last snapshot on; returns the records read."""
        state.clear()
        start = 0
        end = self.store.max_offset(TOPIC, CHECKPOINT_QUEUE)
        if end > self.store.min_offset(TOPIC, CHECKPOINT_QUEUE):
            found = self.store.get(TOPIC, CHECKPOINT_QUEUE, end - 1, 1).messages()
            if found:
                start = orjson.loads(found[-1].body)["from"]
        count = 0
        for doc in self._records(start):
            try:
                state.apply(doc)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("POP log: record %r skipped (%s)", doc, exc)
            count += 1
        self.since_snapshot = count
        self.snapshot_at = self.clock()
        return count

    def snapshot_due(self, inflight: int) -> bool:
        return (self.since_snapshot > max(COMPACT_MIN, 2 * inflight)
                or self.clock() - self.snapshot_at >= self.reserved_time / 2)

    async def snapshot(self, state: PopState) -> bool:
        """Append every queue's state, then the checkpoint naming where it starts.  The
        records are appended together before the first await, so they show the state at one
        point of the log."""
        docs = [doc for key, qs in state.queues.items() if qs.inflight or qs.cursor >= 0
                for doc in snapshot(key, qs)]
        self.since_snapshot = 0
        self.snapshot_at = self.clock()
        start = self.store.max_offset(TOPIC, RECORD_QUEUE)
        results = await self.store.put_chain([message(d) for d in docs])
        if not all(r.ok for r in results) or len(results) != len(docs):
            return False
        if results:
            start = results[0].queue_offset
        return (await self.store.put(message({"from": start}, CHECKPOINT_QUEUE))).ok
