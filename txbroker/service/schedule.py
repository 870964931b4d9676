"""Delayed delivery by RocketMQ delay level (the ``DELAY`` property and consumer send-back).

A delayed message is stored in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with its real topic
and queue in ``REAL_TOPIC``/``REAL_QID`` (RocketMQ's layout).  Because every message in one
level's queue waits the same time, each queue is due in order: the service only looks at the
head of each queue, re-puts due messages to their real topic and advances a cursor kept in the
consumer-offset store (group ``CID_RMQ_SYS_SCHEDULE``).  The cursor moves past a message only
once its re-put was stored: when the store refuses the put (a fenced master, a demotion, the
disk guard) that level's pass stops on the message and the next pass tries it again, so a
refusal delays delivery, keeps each level's order, and loses nothing.  The cursor is persisted
with the other offsets, so after a crash a message may be delivered twice, never lost.  Due
time is measured with the broker's injected clock against the scheduled record's store
timestamp.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from txbroker.service.topics import SCHEDULE_TOPIC
from txbroker.store.record import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    Message,
)
from txbroker.store.results import PutStatus

log = logging.getLogger(__name__)

#: RocketMQ's default ``messageDelayLevel``.
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
SCHEDULE_GROUP = "CID_RMQ_SYS_SCHEDULE"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: How often the queue heads are looked at (real time).
POLL_INTERVAL = 0.1
#: Put statuses no retry can turn into a stored message: such a message is skipped (logged),
#: or it would hold back its whole level for ever.  Every other refusal is retried.
_NEVER_STORABLE = frozenset({PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED})


def parse_levels(text: str) -> list[float]:
    return [float(item[:-1]) * _UNITS[item[-1]] for item in text.split()]


class ScheduleService:
    def __init__(self, store, *, clock: Callable[[], float] = time.time,
                 levels: str = DELAY_LEVELS) -> None:
        self.store = store
        self.clock = clock
        self.delays = parse_levels(levels)
        self._task: asyncio.Task | None = None
        #: Why the store refused the last re-put ('' = delivering): logged once per cause,
        #: not once per message every poll.
        self._held = ""

    @property
    def max_level(self) -> int:
        return len(self.delays)

    def wrap(self, msg: Message, level: int) -> Message:
        """The message as stored while it waits: schedule topic, real topic in properties."""
        level = max(1, min(level, self.max_level))
        props = dict(msg.properties)
        props[PROPERTY_REAL_TOPIC] = msg.topic
        props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        return Message(topic=SCHEDULE_TOPIC, queue_id=level - 1, body=msg.body, flag=msg.flag,
                       properties=props, sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
                       born_host=msg.born_host, reconsume_times=msg.reconsume_times)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="txbroker-schedule")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.deliver_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delayed delivery pass failed; retrying")
            await asyncio.sleep(POLL_INTERVAL)

    async def deliver_due(self) -> int:
        """Re-put every due message; returns how many were delivered.  A level whose head
        the store refuses stops there, its cursor on that message, until the next pass."""
        delivered = 0
        refused = ""
        now_ms = self.clock() * 1000.0
        for qid, delay in enumerate(self.delays):
            max_off = self.store.max_offset(SCHEDULE_TOPIC, qid)
            cursor = self.store.offsets.get(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid)
            if cursor is None:
                cursor = self.store.min_offset(SCHEDULE_TOPIC, qid)
            while cursor < max_off:
                res = self.store.get(SCHEDULE_TOPIC, qid, cursor, 32)
                msgs = res.messages() if res.raw else []
                if not msgs:
                    if res.next_offset > cursor:  # skip entries the store can no longer read
                        cursor = res.next_offset
                        self._save_cursor(qid, cursor)
                        continue
                    break
                stop = False
                before = cursor
                for m in msgs:
                    if m.store_timestamp + delay * 1000.0 > now_ms:
                        stop = True
                        break
                    result = await self.store.put(self._unwrap(m))
                    if result.ok:
                        delivered += 1
                    elif result.status in _NEVER_STORABLE:
                        log.error("delayed message at level %d offset %d cannot be stored in %s "
                                  "(%s %s): skipped", qid + 1, m.queue_offset,
                                  m.properties.get(PROPERTY_REAL_TOPIC), result.status.name,
                                  result.reason)
                    else:
                        refused = refused or result.reason or result.status.name
                        stop = True
                        break
                    cursor = m.queue_offset + 1
                if cursor != before:
                    self._save_cursor(qid, cursor)  # once per batch read, not per message
                if stop:
                    break
        self._note_refusal(refused)
        return delivered

    def _save_cursor(self, qid: int, cursor: int) -> None:
        """A level's cursor goes through the offset log (txbroker/store/offset_log.py), so a
        promoted slave resumes where this master stopped; refused (the disk, a fence), the
        batch is delivered again at the next pass: at least once, never lost."""
        self.store.commit_offsets_now([(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, cursor, None)])

    def _note_refusal(self, refused: str) -> None:
        """Log a refusal when its cause first holds delivery back, and once when it ends."""
        if refused and refused != self._held:
            log.warning("delayed delivery held back: the store refuses writes (%s); retried "
                        "every %.1f s, nothing is lost", refused, POLL_INTERVAL)
        elif not refused and self._held:
            log.info("delayed delivery resumed (the store accepts writes again)")
        self._held = refused

    @staticmethod
    def _unwrap(m) -> Message:
        props = dict(m.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, m.topic)
        try:
            qid = int(props.pop(PROPERTY_REAL_QUEUE_ID, "0"))
        except ValueError:
            qid = 0
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        return Message(topic=topic, queue_id=qid, body=m.body, flag=m.flag, properties=props,
                       sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=m.born_host,
                       reconsume_times=m.reconsume_times)
