"""The timer service: messages delivered at a time to the millisecond (RocketMQ 5's timer
messages), recall before delivery, and the commit side of transactional timers.

Everything durable is a record in the commitlog, so a slave holds it and a promoted master
rebuilds it (docs/grpc.md, "Timer messages"):

* a **timer record** in ``rmq_sys_wheel_timer`` queue 0 per timer (:func:`.props.wrap`);
* a **settle record** in queue 1 per delivery pass, recall or roll, naming the timers it
  finished and the low-water mark below which every timer is finished (format and reads in
  :mod:`.log`).

The master keeps the pending timers in a :class:`~.index.TimerIndex` (a wheel of one-second
slots and a pending bit per timer) fed by reading its own timer queue (the *intake*), so every
path that stores a timer record (a send, a transaction commit, a roll) is picked up the same
way; a timer due within 2 s goes straight to a small heap ordered by due time with the record
just read.  The loop takes the timers of the next second off the wheel into that heap, and when
they are due stores each in its real topic and queue, followed by one settle record for the
pass (``put_chain``: one flush wait).  A crash between the two stores
delivers those timers again after the restart: a timer may be delivered twice, never lost.

**Rolling** bounds what recovery reads: a timer still pending ``timer_roll_window`` after it was
stored is written again at the head of the timer queue and its old record settled, so the mark
never trails the head by more than the window, and retention (``file_reserved_time``) never
deletes a pending timer.  Recovery reads the last settle record's mark, the timer queue from the
mark and the settle records written since the timer at the mark was stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import threading
import time
from collections.abc import Callable

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.recall import encode_handle
from txbroker.service.timer.index import TimerIndex
from txbroker.service.timer.log import TAG_DELIVERED, TAG_RECALLED, TAG_ROLLED, TimerLog
from txbroker.service.timer.props import (
    TIMER_QUEUE,
    TimerRefusal,
    again,
    decode_handle,
    deliver_at,
    is_timer,
    out_ms,
    strip_requests,
    unwrap,
    wrap,
)
from txbroker.service.topics import TIMER_TOPIC
from txbroker.store.record import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_UNIQ_KEY,
    Message,
    StoredMessage,
)
from txbroker.store.results import PutResult

log = logging.getLogger(__name__)

#: Longest the loop sleeps with nothing due: how soon a new timer due within the next
#: second is taken off the wheel (a put also wakes it).
MAX_IDLE = 0.1
#: Shortest time between two passes without a backlog: at thousands of timer puts a second,
#: each put's wake-up would otherwise cost a pass of its own; 5 ms of lateness buys batches.
MIN_PASS_INTERVAL = 0.005
#: A timer taken in due within this many ms goes straight to the heap of timers being
#: delivered with the record just read, instead of the wheel (no second read).
_NEAR_MS = 2000
#: Timers delivered per pass at most (one put_chain): a backlog is delivered over several
#: passes, with the broker's other work served between them.
_DELIVER_PER_PASS = 512
#: Wheel entries read into the heap per pass at most: a full slot is read over several
#: passes, so deliveries due meanwhile are not held up behind it.
_LOAD_PER_PASS = 2048
#: Rolls per pass at most, so a backlog of old timers never stalls delivery.
_ROLLS_PER_PASS = 1000


class TimerService:
    """Timer messages of one broker; only a master delivers (event-loop only)."""

    def __init__(self, config: BrokerConfig, store, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.max_delay_ms = int(config.timer_max_delay * 1000)
        self.roll_window_ms = int(min(config.timer_roll_window, config.file_reserved_time / 2) * 1000)
        #: Pending timers (None while not a master: nothing is indexed on a slave).
        self._index: TimerIndex | None = None
        #: Next timer queue offset the intake reads.
        self._cursor = 0
        #: Timers of the next seconds, read and waiting: (due ms, timer queue offset, record).
        self._near: list[tuple[int, int, StoredMessage]] = []
        #: Wheel entries taken off their slot and not yet read into ``_near`` (in order).
        self._loading: list[int] = []
        #: Delivered timers whose settle record is still to be written (a refused put).
        self._unsettled: list[int] = []
        #: Timers a recall is settling right now: the loop leaves them alone.
        self._holding: set[int] = set()
        self._wake = asyncio.Event()
        #: The last pass left work it bounded (timers to read or deliver): the next runs now.
        self._more = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._last_roll = 0.0
        #: Why the store refused the last delivery ('' = delivering), logged once per cause.
        self._held = ""
        #: Reads of the timer topic and the settle records to write.
        self.log = TimerLog(store, self._now_ms)
        store.add_listener(self._on_put)

    # --- the send paths' entry points --------------------------------------------------------
    @property
    def pending(self) -> int:
        return self._index.pending if self._index is not None else 0

    @property
    def active(self) -> bool:
        return self._index is not None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def wrap(self, msg: Message) -> Message:
        """What a send stores for ``msg``: its timer record, or ``msg`` itself (not a timer, or
        a time already past: delivered now, as RocketMQ does).  Both send paths (remoting and
        gRPC) call this; a bad or too distant time, or a full index, is a :class:`TimerRefusal`."""
        if not is_timer(msg.properties):
            return msg
        now = self._now_ms()
        when = deliver_at(msg.properties, now, self.max_delay_ms)
        if when <= now:
            return msg
        self._check_room()
        return wrap(msg, when)

    def check_half(self, msg: Message) -> None:
        """Refuse a transactional half whose timer properties could not be honoured at commit
        (not a number, too far, a full index): the producer hears it at send time."""
        if is_timer(msg.properties):
            deliver_at(msg.properties, self._now_ms(), self.max_delay_ms)
            self._check_room()

    def wrap_committed(self, final: Message) -> Message:
        """A committed transaction's final message: scheduled if its half asked for a time
        (a relative delay counts from the commit, as in RocketMQ), else as it is.  Never
        refuses: the half was checked when it was sent, and a decided commit must be stored.
        Should its time no longer pass the checks (a broker restarted with a shorter
        ``timer_max_delay`` since), it is delivered now, with an error logged."""
        props = final.properties
        if not is_timer(props):
            return final
        now = self._now_ms()
        try:
            when = deliver_at(props, now, self.max_delay_ms)
        except TimerRefusal as exc:
            log.error("committed message of half %d: %s; delivered now",
                      final.prepared_transaction_offset, exc.remark)
            props = dict(props)
            strip_requests(props)
            return dataclasses.replace(final, properties=props)
        return wrap(final, when) if when > now else final

    def _check_room(self) -> None:
        if self._index is not None and self._index.pending >= self.config.timer_max_pending:
            raise TimerRefusal(ResponseCode.SYSTEM_ERROR,
                               f"timer message refused: {self._index.pending} timers are pending "
                               f"on broker {self.config.broker_name}, the limit "
                               f"timer_max_pending is {self.config.timer_max_pending}")

    def recall_handle(self, stored: Message, result: PutResult) -> str | None:
        """The recall handle of a timer record the store took (None for any other message)."""
        if stored.topic != TIMER_TOPIC:
            return None
        props = stored.properties
        msg_id = props.get(PROPERTY_UNIQ_KEY) or result.msg_id
        return encode_handle(props[PROPERTY_REAL_TOPIC], self.config.broker_name,
                             int(props[PROPERTY_TIMER_OUT_MS]), msg_id)

    # --- recall ------------------------------------------------------------------------------
    async def recall(self, topic: str, handle: str) -> str:
        """Cancel the timer ``handle`` names before it is delivered (durably: a settle record);
        returns its message id.  A :class:`TimerRefusal` says why not: an invalid handle, one
        for another topic or broker, not the master, too late, or no such pending timer."""
        h = decode_handle(handle)
        if h.topic != topic:
            raise TimerRefusal(ResponseCode.ILLEGAL_OPERATION,
                               f"recall failed: the handle is for topic {h.topic}, not {topic}")
        if h.broker_name != self.config.broker_name:
            raise TimerRefusal(ResponseCode.ILLEGAL_OPERATION,
                               f"recall failed: the handle names broker {h.broker_name}, this is "
                               f"{self.config.broker_name}")
        index = self._index
        if index is None:
            raise TimerRefusal(ResponseCode.SLAVE_NOT_AVAILABLE,
                               f"recall failed: broker {self.config.broker_name} at this address "
                               "is not its group's master")
        if h.deliver_ms <= self._now_ms():
            raise TimerRefusal(ResponseCode.ILLEGAL_OPERATION,
                               f"recall failed: message {h.msg_id} was due at {h.deliver_ms} ms, "
                               "so it is delivered or being delivered: too late")
        self._intake()  # a timer sent a moment ago is found too
        offsets = self._find(h.deliver_ms, h.msg_id, topic)
        if not offsets:
            raise TimerRefusal(ResponseCode.ILLEGAL_OPERATION,
                               f"recall failed: no pending timer message {h.msg_id} in topic "
                               f"{topic} due at {h.deliver_ms} ms (already recalled, delivered, "
                               "or never sent to this broker)")
        self._holding.update(offsets)
        try:
            result = await self.store.put(self.log.settle_record(offsets, TAG_RECALLED,
                                                                 index.base))
        finally:
            self._holding.difference_update(offsets)
        if not result.in_log:
            raise TimerRefusal(ResponseCode.SYSTEM_ERROR,
                               f"recall failed: the store refused the record: "
                               f"{result.status.name} {result.reason}".strip())
        for offset in offsets:
            index.settle(offset)
        return h.msg_id

    def _find(self, when_ms: int, msg_id: str, topic: str) -> list[int]:
        """The pending timer queue offsets of message ``msg_id`` due at ``when_ms``: more than
        one when a producer's retried send was stored twice (one message to its producer, so
        one recall cancels both)."""
        assert self._index is not None
        candidates = [o for w, o, _ in self._near if w == when_ms]
        candidates += self._index.in_slot(when_ms // 1000)
        if when_ms // 1000 <= self._now_ms() // 1000 + 1:  # its slot may be being read
            candidates += self._loading
        found = []
        for offset in sorted(set(candidates)):
            if not self._index.is_pending(offset) or offset in self._holding:
                continue
            m = self.log.read(offset)
            if (m is not None and out_ms(m) == when_ms
                    and m.properties.get(PROPERTY_REAL_TOPIC) == topic
                    and msg_id in (m.properties.get(PROPERTY_UNIQ_KEY), m.msg_id)):
                found.append(offset)
        return found

    # --- lifecycle (a master's) ------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild the pending timers from the log (becoming the master, or at start)."""
        started = time.perf_counter()
        base = self.log.recovery_mark()
        index = self._index = TimerIndex(base)
        self._cursor = base
        self._near.clear()
        self._loading.clear()
        self._unsettled.clear()
        self._intake()
        settled = sum(1 for offset in self.log.settled_since(base, self._cursor)
                      if index.settle(offset))
        index.advance(self._cursor)
        log.info("timer messages recovered: %d pending (timer queue %d..%d, %d settled since) "
                 "in %.3f s", index.pending, base, self._cursor, settled,
                 time.perf_counter() - started)

    async def start(self) -> None:
        if self._index is None:
            self.recover()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._task = asyncio.create_task(self._run(), name="txbroker-timer")

    async def close(self) -> None:
        """Stop delivering and forget the index (a slave keeps none; the log keeps all)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._index = None
        self._near.clear()
        self._loading.clear()

    def _on_put(self, topic: str, queue_id: int, _max_offset: int) -> None:
        """Store listener: a new timer record wakes the loop (it may be due within 100 ms)."""
        if topic != TIMER_TOPIC or queue_id != TIMER_QUEUE or self._loop is None:
            return
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._wake.set)
        else:
            self._wake.set()

    # --- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()  # a wake-up during the pass runs the next one at once
            self._more = False
            started = loop.time()
            try:
                self._intake()
                await self.deliver_due()
                if self.clock() - self._last_roll >= 1.0:
                    self._last_roll = self.clock()
                    await self.roll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer delivery pass failed; retrying")
            if self._more:
                await asyncio.sleep(0)  # let the broker's other work in between
                continue
            try:
                async with asyncio.timeout(self._idle()):
                    await self._wake.wait()
            except TimeoutError:
                pass
            rest = MIN_PASS_INTERVAL - (loop.time() - started)
            if rest > 0:
                await asyncio.sleep(rest)

    def _idle(self) -> float:
        """Seconds until something may be due: the nearest timer read, else the next poll
        (also while the store refuses deliveries: retried every MAX_IDLE, as the schedule
        service retries)."""
        if self._held:
            return MAX_IDLE
        if self._near:
            return max(0.0, min(MAX_IDLE, self._near[0][0] / 1000 - self.clock()))
        return MAX_IDLE

    def _intake(self) -> None:
        """Index the timer records stored since the last intake.  Only records the store lets
        it read: a SYNC_MASTER shows what its in-sync slaves hold, so a timer a failover could
        cut is taken in once replicated, never skipped."""
        index = self._index
        if index is None:
            return
        near = self._now_ms() + _NEAR_MS
        for m in self.log.records(TIMER_QUEUE, self._cursor, self.log.end()):
            when = out_ms(m)
            if when is None:
                log.error("timer record at offset %d has no readable TIMER_OUT_MS: skipped",
                          m.queue_offset)
            elif m.queue_offset >= index.base and not index.is_pending(m.queue_offset):
                soon = when <= near
                index.add(m.queue_offset, when, wheel=not soon)
                if soon:
                    heapq.heappush(self._near, (when, m.queue_offset, m))
            self._cursor = m.queue_offset + 1

    async def deliver_due(self) -> int:
        """Store every due timer in its real topic, then one settle record; returns how many.
        A refused put stops the pass (the timer stays due and is tried again)."""
        index = self._index
        if index is None:
            return 0
        now = self._now_ms()
        self._load(now)
        batch: list[tuple[int, int, StoredMessage]] = []
        while self._near and self._near[0][0] <= now:
            if len(batch) >= _DELIVER_PER_PASS:
                self._more = True  # the rest in the next pass, at once
                break
            if self._near[0][1] in self._holding:
                break
            entry = heapq.heappop(self._near)
            if index.is_pending(entry[1]):
                batch.append(entry)
        if not batch and not self._unsettled:
            return 0
        offsets = self._unsettled + [offset for _, offset, _ in batch]
        records = [unwrap(m) for _, _, m in batch]
        records.append(self.log.settle_record(offsets, TAG_DELIVERED, index.base))
        results = await self.store.put_chain(records)
        stored = sum(1 for r in results[:len(batch)] if r.in_log)
        for _, offset, _ in batch[:stored]:
            index.settle(offset)
        refused = next((r for r in results if not r.in_log), None)
        if refused is None and len(results) == len(records):
            self._unsettled = []
        else:
            self._unsettled = offsets[:len(self._unsettled) + stored]
            for entry in batch[stored:]:  # due again, tried after MAX_IDLE
                heapq.heappush(self._near, entry)
        self._note_refusal(refused.reason or refused.status.name if refused is not None else "")
        index.advance(self._cursor)
        return stored

    def _load(self, now: int) -> None:
        """Read the wheel's timers of the next second into the heap, at most
        ``_LOAD_PER_PASS`` per pass (the loop comes back at once while some are left)."""
        assert self._index is not None
        self._loading.extend(self._index.take(now // 1000 + 1))
        if not self._loading:
            return
        self._loading.sort()
        chunk, self._loading = self._loading[:_LOAD_PER_PASS], self._loading[_LOAD_PER_PASS:]
        found = {m.queue_offset: m for m in self.log.read_runs(chunk)}
        for offset in chunk:
            m = found.get(offset)
            when = out_ms(m) if m is not None else None
            if m is None or when is None:
                log.error("timer at offset %d cannot be read: skipped", offset)
                self._index.settle(offset)
                continue
            heapq.heappush(self._near, (when, offset, m))
        if self._loading:
            self._more = True

    async def roll(self) -> int:
        """Write again the pending timers stored more than ``timer_roll_window`` ago (the
        oldest first, from the mark), settling their old records; returns how many."""
        index = self._index
        if index is None:
            return 0
        rolled = 0
        limit = self._now_ms() - self.roll_window_ms
        while rolled < _ROLLS_PER_PASS:
            base = index.advance(self._cursor)
            if base >= self._cursor or base in self._holding:
                break
            m = self.log.read(base)
            if m is None:
                index.settle(base)
                continue
            if m.store_timestamp > limit:
                break
            results = await self.store.put_chain([again(m), self.log.settle_record(
                [base], TAG_ROLLED, base)])
            if len(results) < 2 or not all(r.in_log for r in results):
                break  # retried next second; a stored copy alone is a duplicate, never a loss
            index.settle(base)
            rolled += 1
            self._intake()
        return rolled

    def _note_refusal(self, refused: str) -> None:
        if refused and refused != self._held:
            log.warning("timer delivery held back: the store refuses writes (%s); retried, "
                        "nothing is lost", refused)
        elif not refused and self._held:
            log.info("timer delivery resumed (the store accepts writes again)")
        self._held = refused
