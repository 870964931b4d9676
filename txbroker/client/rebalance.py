"""Pure parts of consumption: queue allocation and per-queue offset bookkeeping.

Allocation is RocketMQ's ``AllocateMessageQueueAveragely``: every member sorts the same queue
list and the same member list, so each computes its own share without talking to the others,
and the shares are contiguous, disjoint and cover every queue.

Offsets follow RocketMQ's ``ProcessQueue``: a queue's committable offset is the smallest offset
still pulled-but-not-acknowledged, or, when nothing is outstanding, the next offset to pull.
Committing that value is what makes consumption at-least-once: a crash re-delivers whatever was
in flight, never skips it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (sort order = RocketMQ's MessageQueue order)."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


def allocate_average(queues: list[MessageQueue], members: list[str], me: str) -> list[MessageQueue]:
    """The queues ``me`` owns when ``queues`` are split evenly across ``members``.

    Members and queues are sorted here, so callers may pass them in any order.  A client that
    is not (yet) in the member list owns nothing: it must not steal queues before the broker
    has seen its heartbeat.
    """
    mq_all = sorted(queues)
    cid_all = sorted(set(members))
    if not mq_all or me not in cid_all:
        return []
    index = cid_all.index(me)
    n_mq, n_cid = len(mq_all), len(cid_all)
    mod = n_mq % n_cid
    if n_mq <= n_cid:
        average = 1
    elif mod > 0 and index < mod:
        average = n_mq // n_cid + 1
    else:
        average = n_mq // n_cid
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n_mq - start)
    return [mq_all[(start + i) % n_mq] for i in range(max(count, 0))]


class OffsetTracker:
    """Offsets of one owned queue: what was pulled, what is still in flight, what to commit.

    Not thread-safe; the consumer uses it from its event loop only.
    """

    __slots__ = ("_in_flight", "committed", "dropped", "next_pull")

    def __init__(self, start: int) -> None:
        #: Next offset to pull (the broker's ``nextBeginOffset`` of the last pull).
        self.next_pull = start
        self._in_flight: list[int] = []
        #: Last offset successfully committed to the broker (-1 = never).
        self.committed = -1
        self.dropped = False

    def pulled(self, offsets: list[int], next_begin: int) -> None:
        """A pull returned ``offsets`` (delivered to the user later) and moved to ``next_begin``."""
        in_flight = self._in_flight
        if offsets and (not in_flight or offsets[0] > in_flight[-1]) and offsets == sorted(offsets):
            in_flight += offsets  # a pull's offsets ascend past those in flight: no search
        else:
            for off in offsets:
                bisect.insort(in_flight, off)
        self.next_pull = next_begin

    def moved(self, next_begin: int) -> None:
        """Nothing (matching) was there; the queue position moves on."""
        self.next_pull = next_begin

    def ack(self, offset: int) -> None:
        """The user finished the message at ``offset``."""
        in_flight = self._in_flight
        if in_flight and in_flight[0] == offset:  # delivery in queue order: the oldest
            del in_flight[0]
            return
        i = bisect.bisect_left(in_flight, offset)
        if i < len(in_flight) and in_flight[i] == offset:
            del in_flight[i]

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def committable(self) -> int:
        return self._in_flight[0] if self._in_flight else self.next_pull

    def reset(self, offset: int) -> None:
        """The broker moved us (PULL_OFFSET_MOVED): forget in-flight messages below it."""
        self._in_flight = [o for o in self._in_flight if o >= offset]
        self.next_pull = offset
