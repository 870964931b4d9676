"""The transaction service's only door to the store (RocketMQ's TransactionalMessageBridge):
every put and read of halves, op records, discard copies and final messages goes through
:class:`TransactionalMessageBridge`.

Keeping the I/O in one class gives tests one seam: a crash test passes in a subclass whose
``put_commit`` stops the process after the final message is stored, which is how a broker dies
between a commit's two writes.  Each write has a ``*_now`` twin, used instead when the store
answers as soon as it appends (no flush or replica wait): the END and send handlers then run
without a coroutine.
"""

from __future__ import annotations

import itertools
import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from txbroker.store.message_store import PutResult
from txbroker.store.record import (
    HALF_TOPIC,
    OP_HALF_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    RecordError,
    RecordView,
    StoredMessage,
    view_record,
)

if TYPE_CHECKING:
    from txbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

#: RocketMQ counts a flush time-out as stored.
#: Messages and bytes per store.get while recovering.
_RECOVERY_BATCH = 4096
_RECOVERY_BYTES = 64 * 1024 * 1024



class TransactionalMessageBridge:
    """Store access for halves (half queue), op records (op queue), discard copies
    (TRANS_CHECK_MAX_TIME_TOPIC) and committed final messages; queue 0 of each system topic."""

    def __init__(self, store: MessageStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        # Op records get a fresh UNIQ_KEY (as RocketMQ's): random per process + a counter.
        self._id_prefix = uuid.uuid4().hex[:16].upper()
        self._ids = itertools.count()

    # --- writes ----------------------------------------------------------------------------
    async def put_half(self, half: Message) -> PutResult:
        return await self.store.put(half)

    def put_half_now(self, half: Message) -> PutResult:
        """:meth:`put_half` on a store that answers at once (``store.answers_at_once``)."""
        return self.store.put_now(half)

    async def put_commit(self, final: Message, op: Message) -> tuple[PutResult, PutResult | None]:
        """A commit's two records: the final message, then (only if it was stored) its op
        record, appended together and covered by one flush wait.  The op is None when the
        final was refused.  Recovery handles a crash between the two (see service.py)."""
        results = await self.store.put_chain([final, op])
        return results[0], results[1] if len(results) > 1 else None

    def put_commit_now(self, final: Message, op: Message) -> tuple[PutResult, PutResult | None]:
        """:meth:`put_commit` without waiting for the disk (see ``can_end_now``)."""
        results = self.store.put_chain_now([final, op])
        return results[0], results[1] if len(results) > 1 else None

    async def put_discard(self, copy: Message) -> PutResult:
        return await self.store.put(copy)

    def op_message(self, tag: str, body: str, extra: dict[str, str], *,
                   born_ms: int | None = None) -> Message:
        """An op record; a ``d`` record is born at its decision's time, which a replay reads
        back as the decision time."""
        props = {PROPERTY_TAGS: tag, PROPERTY_UNIQ_KEY: f"{self._id_prefix}{next(self._ids):016X}",
                 **extra}
        born = int(self.clock() * 1000) if born_ms is None else born_ms
        return Message(topic=OP_HALF_TOPIC, queue_id=0, body=body.encode(), properties=props,
                       born_timestamp=born)

    async def put_op(self, tag: str, body: str, extra: dict[str, str], *,
                     born_ms: int | None = None) -> PutResult:
        return await self.store.put(self.op_message(tag, body, extra, born_ms=born_ms))

    def put_op_now(self, tag: str, body: str, extra: dict[str, str], *,
                   born_ms: int | None = None) -> PutResult:
        """:meth:`put_op` without waiting for the disk (see ``can_end_now``)."""
        return self.store.put_now(self.op_message(tag, body, extra, born_ms=born_ms))

    def write_refusal(self) -> str:
        """Why the store refuses writes now ("" if it accepts them): its fence (a master whose
        lease is not known valid, a demotion, a stop) or the disk guard.  A check pass run
        while either holds would burn check counts on answers that cannot be applied."""
        fence = self.store.fenced
        if fence is not None:
            return fence.text
        return self.store.write_refusal()

    # --- reads -----------------------------------------------------------------------------
    def read_half(self, phys: int) -> StoredMessage | None:
        """The half message at ``phys``, or None if there is no half message there."""
        try:
            m = self.store.read(phys)
        except (RecordError, ValueError, IndexError):
            return None
        if m is None or m.topic != HALF_TOPIC or m.physical_offset != phys:
            return None
        return m

    def half_at(self, queue_offset: int) -> StoredMessage | None:
        """The half message at ``queue_offset`` of the half queue, if still retained."""
        found = self.store.get(HALF_TOPIC, 0, queue_offset, 1).messages()
        return found[0] if found and found[0].queue_offset == queue_offset else None

    def min_offset(self, topic: str) -> int:
        return self.store.min_offset(topic, 0)

    def max_offset(self, topic: str) -> int:
        return self.store.max_offset(topic, 0)

    @property
    def log_end(self) -> int:
        """The commitlog's end (physical offset)."""
        return self.store.max_physical_offset

    def views(self, topic: str, offset: int) -> Iterator[RecordView]:
        """Views of ``topic`` queue 0 from queue offset ``offset`` on, in order.

        An undecodable record is logged and skipped: one damaged op record must not keep the
        broker from starting (at worst its half is checked again).
        """
        end = self.store.max_offset(topic, 0)
        while offset < end:
            res = self.store.get(topic, 0, offset, _RECOVERY_BATCH, _RECOVERY_BYTES)
            for raw in res.raw:
                try:
                    yield view_record(raw)
                except (RecordError, struct.error, IndexError, UnicodeDecodeError) as exc:
                    log.error("skipping an undecodable %s record during recovery: %s", topic, exc)
            if res.next_offset <= offset:
                break
            offset = res.next_offset

    def halves(self, start: int, end: int) -> Iterator[StoredMessage]:
        """The halves at half queue offsets ``[start, end)`` that are still retained."""
        offset = start
        while offset < end:
            res = self.store.get(HALF_TOPIC, 0, offset, min(end - offset, _RECOVERY_BATCH),
                                 _RECOVERY_BYTES)
            yield from res.messages()
            if res.next_offset <= offset:
                break
            offset = res.next_offset

    def scan(self, start: int) -> Iterator[StoredMessage]:
        """Every record of the commitlog from physical offset ``start`` on."""
        return self.store.scan(start)
