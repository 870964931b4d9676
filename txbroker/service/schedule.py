"""Delayed delivery by RocketMQ delay level (the ``DELAY`` property and consumer send-back).

A delayed message is stored in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with its real topic
and queue in ``REAL_TOPIC``/``REAL_QID`` (RocketMQ's layout).  Because every message in one
level's queue waits the same time, each queue is due in order: the service only looks at the
head of each queue, re-puts due messages to their real topic and advances a cursor kept in the
consumer-offset store (group ``CID_RMQ_SYS_SCHEDULE``).  The cursor is persisted with the other
offsets, so after a crash a message may be delivered twice, never lost.  Due time is measured
with the broker's injected clock against the scheduled record's store timestamp.
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

log = logging.getLogger(__name__)

#: RocketMQ's default ``messageDelayLevel``.
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
SCHEDULE_GROUP = "CID_RMQ_SYS_SCHEDULE"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: How often the queue heads are looked at (real time).
POLL_INTERVAL = 0.1


def parse_levels(text: str) -> list[float]:
    return [float(item[:-1]) * _UNITS[item[-1]] for item in text.split()]


class ScheduleService:
    def __init__(self, store, *, clock: Callable[[], float] = time.time,
                 levels: str = DELAY_LEVELS) -> None:
        self.store = store
        self.clock = clock
        self.delays = parse_levels(levels)
        self._task: asyncio.Task | None = None

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
        """Re-put every due message; returns how many were delivered."""
        delivered = 0
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
                        self.store.offsets.set(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, cursor)
                        continue
                    break
                due_stop = False
                for m in msgs:
                    if m.store_timestamp + delay * 1000.0 > now_ms:
                        due_stop = True
                        break
                    await self.store.put(self._unwrap(m))
                    cursor = m.queue_offset + 1
                    delivered += 1
                    self.store.offsets.set(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, cursor)
                if due_stop:
                    break
        return delivered

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
