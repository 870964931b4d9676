"""The POP service: consumption by receipt handle instead of by offset (RocketMQ 5's POP).

A receive pops up to ``batch_size`` messages of a group from one queue or from any queue of
the topic, each invisible to the group for ``invisible_ms`` and returned with a receipt
handle (:mod:`.handles`); an ack by handle ends it; a change of invisibility gives a new
handle (the old one stops working).  A message whose invisibility ends unacknowledged is
delivered again from where it is stored, with its delivery attempt + 1 (RocketMQ re-puts it
to a retry topic instead); after ``max_reconsume_times`` + 1 deliveries (RocketMQ's
retryMaxTimes + 1, the max attempts the gRPC settings tell consumers) it is put to
``%DLQ%<group>``.

FIFO receives take a queue only when none of its in-flight messages is invisible: the queue
(and so every message group hashed to it) is locked from a pop until each of its messages is
acknowledged or visible again, and visible ones go out again first, in offset order.  The lock
is the in-flight state itself, so it holds across restarts.

Every change is a record of the POP log (:mod:`.log`), appended in the same loop step as it is
applied in memory, before the request is answered; the state is rebuilt from the log on start
and on promotion.  The queue's frontier (everything below acknowledged) is written to the
store's consumer offset of the group, so offsets, lag and the admin tools see POP groups.

Only a master serves POP (:meth:`start` / :meth:`suspend` follow the role like scheduled
delivery).  A receive waits for messages (long polling) on the store's put listener, on
invisibility ending and on FIFO queues unlocking; held receives are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from txbroker.config import BrokerConfig
from txbroker.service.pop import handles
from txbroker.service.pop import state as records
from txbroker.service.pop.log import PopLog
from txbroker.service.pop.state import (
    InFlight,
    Key,
    PopError,
    PopErrorKind,
    PopState,
    QueueState,
)
from txbroker.service.topics import PERM_READ, is_system_topic
from txbroker.store.record import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    Message,
    StoredMessage,
    tag_hash,
)

log = logging.getLogger(__name__)

#: How often invisibility ends are looked for, and snapshots considered (real time).
REVIVE_INTERVAL = 0.05
#: A renewal's invisible time (the proxy's ``renewSliceTimeMillis``).
RENEW_SLICE_MS = 60_000


@dataclass(frozen=True, slots=True)
class _Receive:
    """What one receive asked for."""

    group: str
    topic: str
    invisible_ms: int
    fifo: bool
    tag_filter: _TagFilter | None
    attempt_id: str
    renew_ms: int
    owner: str


@dataclass(frozen=True, slots=True)
class Popped:
    """One delivered message: the stored record, its handle and delivery attempt."""

    message: StoredMessage
    handle: str
    attempt: int
    invisible_until: int


class PopService:
    def __init__(self, config: BrokerConfig, store, topics, registry=None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.registry = registry
        self.clock = clock
        self.state = PopState()
        self.log = PopLog(store, reserved_time=config.file_reserved_time, clock=clock)
        #: (visible_at ms, serial, key, offset): in-flight entries by when they turn visible;
        #: an item whose entry changed since is dropped when it comes up.
        self._due: list[tuple[int, int, Key, int]] = []
        #: Held receives per topic, woken by a put, an invisibility end or an unlock.
        self._waiters: dict[str, set[asyncio.Future]] = {}
        self._held = 0
        #: Where an any-queue receive starts: one further each time (no state per group).
        self._rotation = 0
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self.active = False
        #: Whether a client id is still connected (its messages' invisibility is renewed);
        #: the gRPC endpoint sets it, without it nothing is renewed.
        self.owner_alive: Callable[[str], bool] = _nobody
        #: Set at shutdown: held receives answer now and no new one waits.
        self.closing = False

    # --- lifecycle ----------------------------------------------------------------------------
    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen to the store's puts (long polling), from ``loop``."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.store.add_listener(self.on_put)

    def recover(self) -> None:
        """Rebuild the state from the POP log (becoming the master, still fenced)."""
        count = self.log.replay(self.state)
        self._due = [(e.visible_at, e.serial, key, e.offset)
                     for key, qs in self.state.queues.items() for e in qs.inflight.values()]
        heapq.heapify(self._due)
        for key, qs in self.state.queues.items():
            if qs.cursor >= 0:
                self.store.offsets.set(key[0], key[1], key[2], qs.frontier())
        if count:
            log.info("POP state recovered from %d records: %d messages in flight", count,
                     sum(self.state.inflight_by_group.values()))

    async def start(self) -> None:
        self.active = True
        self._task = asyncio.create_task(self._run(), name="txbroker-pop-revive")

    async def suspend(self) -> None:
        """No longer the master: no POP served, no state kept (the next master has the log)."""
        self.active = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.state.clear()
        self._due.clear()
        self._wake_waiters()

    close = suspend

    # --- long polling -------------------------------------------------------------------------
    def on_put(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """Store listener: called for every dispatched message, so it must stay cheap."""
        if topic not in self._waiters:
            return
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._wake, topic)
        else:
            self._wake(topic)

    def _wake(self, topic: str) -> None:
        for fut in self._waiters.pop(topic, ()):
            if not fut.done():
                fut.set_result(True)

    def _wake_waiters(self) -> None:
        for topic in list(self._waiters):
            self._wake(topic)

    def wake_all(self) -> None:
        """Shutdown: every held receive answers now (with what it has: nothing)."""
        self.closing = True
        self._wake_waiters()

    def held(self) -> int:
        return self._held

    # --- receive ------------------------------------------------------------------------------
    async def pop(self, group: str, topic: str, *, queue_id: int = -1, batch_size: int = 1,
                  invisible_ms: int, fifo: bool = False, tags: frozenset[str] | None = None,
                  attempt_id: str = "", poll_ms: int = 0, renew_ms: int = 0,
                  owner: str = "") -> list[Popped]:
        """Up to ``batch_size`` messages of ``topic`` for ``group`` (``queue_id`` -1: any
        queue), waiting up to ``poll_ms`` (capped by ``pop_max_poll``) for some to arrive.
        ``tags``: the tags selected (None: every message).  With ``renew_ms`` and ``owner``
        (a client id), the messages' invisibility is renewed when it ends, by up to
        :data:`RENEW_SLICE_MS` at a time, until ``renew_ms`` from now, while
        :attr:`owner_alive` says that client is connected.  Raises :class:`PopError`."""
        cfg = self.config
        if not 1 <= batch_size <= cfg.pop_max_batch:
            raise PopError(PopErrorKind.BAD_REQUEST,
                           f"batch size {batch_size} is not in 1..{cfg.pop_max_batch}")
        self._check_invisible(invisible_ms, cfg.pop_min_invisible_ms)
        queue_ids = self._queues(group, topic, queue_id)
        r = _Receive(group, topic, invisible_ms, fifo, None if tags is None else _TagFilter(tags),
                     attempt_id, max(renew_ms, 0) if owner else 0, owner)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(poll_ms, 0) / 1000.0, cfg.pop_max_poll)
        while True:
            got = await self._pop_once(r, queue_ids, batch_size)
            remaining = deadline - loop.time()
            if got or remaining <= 0 or not self.active or self.closing:
                return got
            if self._held >= cfg.pop_max_waiters:
                raise PopError(PopErrorKind.TOO_MANY,
                               f"{self._held} POP receives are already waiting on this broker")
            fut = loop.create_future()
            self._waiters.setdefault(topic, set()).add(fut)
            timer = loop.call_later(remaining, _expire, fut)
            self._held += 1
            try:
                await fut
            finally:
                self._held -= 1
                timer.cancel()
                waiting = self._waiters.get(topic)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self._waiters[topic]

    def _check_invisible(self, invisible_ms: int, minimum: int) -> None:
        cfg = self.config
        if not minimum <= invisible_ms <= cfg.pop_max_invisible_ms:
            raise PopError(PopErrorKind.BAD_REQUEST,
                           f"invisible time {invisible_ms} ms is not in "
                           f"{minimum}..{cfg.pop_max_invisible_ms} ms")

    def _queues(self, group: str, topic: str, queue_id: int) -> list[int]:
        """The queue ids to pop from, after checking the request may pop at all."""
        if not self.active:
            raise PopError(PopErrorKind.NOT_SERVING, "this broker is not a master: no POP here")
        if not group:
            raise PopError(PopErrorKind.BAD_REQUEST, "consumer group is empty")
        if is_system_topic(topic):
            raise PopError(PopErrorKind.BAD_REQUEST,
                           f"topic {topic} is a system topic and cannot be consumed")
        tc = self.topics.get(topic)
        if tc is None:
            raise PopError(PopErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if not tc.perm & PERM_READ:
            raise PopError(PopErrorKind.BAD_REQUEST, f"topic {topic} is not readable")
        if self.registry is not None and self.registry.consumer_ids(group):
            raise PopError(PopErrorKind.BAD_REQUEST,
                           f"group {group} has 4.x pull consumers connected: a group consumes "
                           "either by POP or by pull, not both")
        if queue_id >= tc.read_queue_nums:
            raise PopError(PopErrorKind.BAD_REQUEST,
                           f"queue {queue_id} of topic {topic} does not exist "
                           f"({tc.read_queue_nums} read queues)")
        if queue_id >= 0:
            return [queue_id]
        # Any queue: start one further on each receive, so one busy queue starves no other.
        n = tc.read_queue_nums
        self._rotation += 1
        return [(self._rotation + i) % n for i in range(n)]

    async def _pop_once(self, r: _Receive, queue_ids: list[int], batch_size: int) -> list[Popped]:
        group = r.group
        limit = self.config.pop_max_inflight - self.state.inflight(group)
        if limit <= 0:
            raise PopError(PopErrorKind.TOO_MANY,
                           f"group {group} has {self.state.inflight(group)} messages in flight "
                           f"(pop_max_inflight {self.config.pop_max_inflight}): ack some first")
        want = min(batch_size, limit)
        popped: list[Popped] = []
        for qid in queue_ids:
            if len(popped) >= want:
                break
            popped += await self._pop_queue(r, (group, r.topic, qid), want - len(popped))
        return popped

    async def _pop_queue(self, r: _Receive, key: Key, n: int) -> list[Popped]:
        # A queue's state exists once something was popped from it: a receive that finds
        # nothing (any group name a client makes up) leaves nothing behind.
        qs = self.state.queues.get(key) or QueueState()
        if r.fifo and qs.locked():
            return self._same_attempt(key, qs, r.attempt_id)
        # Picking and applying run without an await: no other receive sees the queue between.
        picked: list[tuple[int, int, int, StoredMessage]] = []
        gone: list[InFlight] = []
        for off in sorted(qs.ready)[:n]:
            entry = qs.inflight[off]
            msg = self.store.read(entry.phys)
            if msg is None or msg.queue_offset != off:
                gone.append(entry)  # deleted by retention: nothing left to deliver
                continue
            picked.append((off, entry.phys, entry.attempt + 1, msg))
        if len(picked) < n:
            picked += self._read_new(key, qs, n - len(picked), r.tag_filter)
        if not picked:
            for entry in gone:
                await self._finish(key, entry, "gone")
            return []
        now = int(self.clock() * 1000)
        visible_at = now + r.invisible_ms
        entries = [(off, phys, attempt, secrets.randbits(63)) for off, phys, attempt, _ in picked]
        doc = records.checkpoint(key, entries, visible_at, r.attempt_id,
                                 now + r.renew_ms if r.renew_ms else 0, r.owner)
        self.state.queues.setdefault(key, qs)
        for k, entry in self.state.apply(doc):
            heapq.heappush(self._due, (entry.visible_at, entry.serial, k, entry.offset))
        self._note_frontier(key, qs)
        result = await self.log.append(doc)
        for entry in gone:
            await self._finish(key, entry, "gone")
        if not result.ok:
            # The messages stay in flight in memory and come back when their invisibility
            # ends: nothing is lost, and the log never says more than was delivered.
            raise PopError(PopErrorKind.STORE_REFUSED,
                           f"POP checkpoint not stored: {result.reason or result.status.name}")
        return [Popped(msg, handles.Handle(key[1], key[2], off, serial).encode(), attempt,
                       visible_at)
                for (off, _, attempt, serial), (_, _, _, msg) in zip(entries, picked)]

    def _read_new(self, key: Key, qs: QueueState, n: int,
                  tag_filter) -> list[tuple[int, int, int, StoredMessage]]:
        group, topic, qid = key
        if qs.cursor < 0:
            committed = self.store.offsets.get(group, topic, qid)
            qs.cursor = committed if committed is not None else self.store.min_offset(topic, qid)
        res = self.store.get(topic, qid, qs.cursor, n,
                             tag_filter=None if tag_filter is None else tag_filter.hashes)
        msgs = res.messages() if res.raw else []
        if tag_filter is not None:  # the queue filters by hash: a colliding tag is not one
            msgs = [m for m in msgs if m.tags in tag_filter.tags]
        if res.next_offset > qs.cursor:
            # Past what was read, filtered out or expired too (in memory until the next
            # checkpoint; a replay reads the skipped ones again and skips them again).
            qs.cursor = res.next_offset
            if key in self.state.queues:
                self._note_frontier(key, qs)
        return [(m.queue_offset, m.physical_offset, 1, m) for m in msgs]

    def _same_attempt(self, key: Key, qs: QueueState, attempt_id: str) -> list[Popped]:
        """A FIFO receive retried with the attempt id of the one that locked the queue (its
        answer was lost): the same messages again, same handles, instead of nothing."""
        if not attempt_id:
            return []
        entries = sorted(qs.inflight.values(), key=lambda e: e.offset)
        if any(e.attempt_id != attempt_id or e.dead for e in entries):
            return []
        out = []
        for e in entries:
            msg = self.store.read(e.phys)
            if msg is not None:
                out.append(Popped(msg, handles.Handle(key[1], key[2], e.offset, e.serial).encode(),
                                  e.attempt, e.visible_at))
        return out

    # --- ack and change invisible -------------------------------------------------------------
    def _entry(self, group: str, handle: str, topic: str | None) -> tuple[Key, InFlight]:
        if not self.active:
            raise PopError(PopErrorKind.NOT_SERVING, "this broker is not a master: no POP here")
        h = handles.decode(handle)
        if topic is not None and topic != h.topic:
            raise PopError(PopErrorKind.INVALID_HANDLE,
                           f"receipt handle is for topic {h.topic}, not {topic}")
        key = (group, h.topic, h.queue_id)
        qs = self.state.queues.get(key)
        entry = qs.inflight.get(h.offset) if qs is not None else None
        if entry is None:
            raise PopError(PopErrorKind.INVALID_HANDLE,
                           f"message {h.topic}:{h.queue_id}:{h.offset} of group {group} is not in "
                           "flight (already acknowledged, moved to the dead-letter topic, or "
                           "never popped by this group)")
        if entry.serial != h.serial:
            raise PopError(PopErrorKind.INVALID_HANDLE,
                           f"receipt handle of {h.topic}:{h.queue_id}:{h.offset} is stale (the "
                           "message was delivered again or its invisible time changed since)")
        if entry.dead:
            raise PopError(PopErrorKind.INVALID_HANDLE,
                           f"message {h.topic}:{h.queue_id}:{h.offset} is being moved to the "
                           "dead-letter topic")
        return key, entry

    async def ack(self, group: str, handle: str, topic: str | None = None) -> None:
        """Acknowledge the delivery ``handle`` names; :class:`PopError` if it is not current."""
        key, entry = self._entry(group, handle, topic)
        await self._finish(key, entry, "ack")

    async def change_invisible(self, group: str, handle: str, invisible_ms: int,
                               topic: str | None = None) -> Popped:
        """Make the message invisible for ``invisible_ms`` from now, under a new handle.

        0 is allowed (``pop_min_invisible_ms`` bounds receives only, as the proxy's 10 s minimum
        does): it makes the message visible again now, which is how a PushConsumer that has no
        back-off of its own gives a failed message back."""
        self._check_invisible(invisible_ms, 0)
        key, entry = self._entry(group, handle, topic)
        visible_at = int(self.clock() * 1000) + invisible_ms
        serial = secrets.randbits(63)
        doc = records.checkpoint(key, [(entry.offset, entry.phys, entry.attempt, serial)],
                                 visible_at, entry.attempt_id)  # the client's time: no renewal
        for k, e in self.state.apply(doc):
            heapq.heappush(self._due, (e.visible_at, e.serial, k, e.offset))
        result = await self.log.append(doc)
        if not result.ok:
            raise PopError(PopErrorKind.STORE_REFUSED,
                           f"POP checkpoint not stored: {result.reason or result.status.name}")
        msg = self.store.read(entry.phys)
        if msg is None:
            raise PopError(PopErrorKind.INVALID_HANDLE, "the message is no longer stored")
        return Popped(msg, handles.Handle(key[1], key[2], entry.offset, serial).encode(),
                      entry.attempt, visible_at)

    async def to_dead_letters(self, group: str, handle: str, topic: str | None = None) -> None:
        """The client gives up on the message (a PushConsumer past its max attempts): put it
        to ``%DLQ%<group>`` now and end it."""
        key, entry = self._entry(group, handle, topic)
        entry.dead = True
        if not await self._to_dead_letters(key, entry):
            entry.dead = False
            raise PopError(PopErrorKind.STORE_REFUSED,
                           f"message {key[1]}:{key[2]}:{entry.offset} not moved to the "
                           "dead-letter topic: the store refused it")

    async def _finish(self, key: Key, entry: InFlight, reason: str) -> None:
        qs = self.state.queues.get(key)
        if qs is None:
            return  # suspended meanwhile (no longer the master): the next master has the log
        doc = records.ack(key, entry.offset, entry.serial, reason)
        was_locked = qs.locked()
        self.state.apply(doc)
        self._note_frontier(key, qs)
        if was_locked and not qs.locked():
            self._wake(key[1])  # a FIFO receive may take the queue now
        result = await self.log.append(doc)
        if not result.ok:
            raise PopError(PopErrorKind.STORE_REFUSED,
                           f"acknowledgement not stored: {result.reason or result.status.name}")

    def _note_frontier(self, key: Key, qs: QueueState) -> None:
        frontier = qs.frontier()
        if frontier >= 0:
            self.store.offsets.set(key[0], key[1], key[2], frontier)

    # --- revive: invisibility ends, dead letters, snapshots -------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self.revive()
                if self.log.snapshot_due(sum(self.state.inflight_by_group.values())):
                    await self.log.snapshot(self.state)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("POP revive pass failed; retrying")
            await asyncio.sleep(REVIVE_INTERVAL)

    async def revive(self) -> int:
        """Entries whose invisibility ended become ready to pop again, or go to the
        dead-letter topic after their last attempt; returns how many changed."""
        now = int(self.clock() * 1000)
        due = self._due
        dead: list[tuple[Key, InFlight]] = []
        renewed: list[dict] = []
        woken: set[str] = set()
        changed = 0
        while due and due[0][0] <= now:
            visible_at, serial, key, offset = heapq.heappop(due)
            qs = self.state.queues.get(key)
            entry = qs.inflight.get(offset) if qs is not None else None
            if entry is None or entry.serial != serial or entry.visible_at != visible_at:
                continue  # acknowledged or changed since
            changed += 1
            if entry.renew_until > now and self.owner_alive(entry.owner):
                # Still worked on by a connected consumer: invisible for another slice,
                # same serial (its handle stays valid).  Applied now, logged below.
                doc = records.checkpoint(
                    key, [(offset, entry.phys, entry.attempt, entry.serial)],
                    now + min(RENEW_SLICE_MS, entry.renew_until - now), entry.attempt_id,
                    entry.renew_until, entry.owner)
                for k, e in self.state.apply(doc):
                    heapq.heappush(due, (e.visible_at, e.serial, k, e.offset))
                renewed.append(doc)
            elif entry.attempt > self.config.max_reconsume_times:
                entry.dead = True
                dead.append((key, entry))
            else:
                qs.ready.add(offset)
                woken.add(key[1])
        for topic in woken:
            self._wake(topic)
        if len(due) > 4 * sum(self.state.inflight_by_group.values()) + 1024:
            self._due = [(e.visible_at, e.serial, k, e.offset)
                         for k, q in self.state.queues.items() for e in q.inflight.values()]
            heapq.heapify(self._due)
        for doc in renewed:
            result = await self.log.append(doc)
            if not result.ok:  # a crash now makes it visible at its old time: no loss
                log.warning("POP: renewal not stored (%s)", result.reason or result.status.name)
        for key, entry in dead:
            await self._to_dead_letters(key, entry)
        return changed

    async def _to_dead_letters(self, key: Key, entry: InFlight) -> bool:
        """Put the message to ``%DLQ%<group>``, then end it; False if the store refused.  A
        crash between the two delivers it once more (then it goes to the dead-letter topic
        again): never lost."""
        group, topic, _ = key
        msg = self.store.read(entry.phys)
        if msg is not None:
            dlq = DLQ_GROUP_TOPIC_PREFIX + group
            await self.topics.get_or_create(dlq)
            props = dict(msg.properties)
            props.setdefault(PROPERTY_RETRY_TOPIC, topic)
            props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, msg.uniq_key or msg.msg_id)
            result = await self.store.put(Message(
                topic=dlq, queue_id=0, body=msg.body, flag=msg.flag, properties=props,
                sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
                born_host=msg.born_host, reconsume_times=entry.attempt))
            if not result.in_log:  # in the dead-letter topic, even unacknowledged: not again
                entry.dead = False  # tried again on the next pass
                heapq.heappush(self._due, (entry.visible_at, entry.serial, key, entry.offset))
                log.warning("POP: message %s:%d of group %s not moved to %s (%s); retried",
                            topic, entry.offset, group, dlq, result.reason or result.status.name)
                return False
            log.info("POP: message %s:%d of group %s moved to %s after %d deliveries", topic,
                     entry.offset, group, dlq, entry.attempt)
        await self._finish(key, entry, "dlq")
        return True


class _TagFilter:
    """The tags a receive selects, and their hashes (what the consume queue filters by)."""

    __slots__ = ("hashes", "tags")

    def __init__(self, tags: frozenset[str]) -> None:
        self.tags = tags
        self.hashes = {tag_hash(t) for t in tags}


def _nobody(_client_id: str) -> bool:
    return False


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
