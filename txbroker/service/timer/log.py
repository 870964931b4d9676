"""The timer topic in the store: the timer records of queue 0 read back, and the settle
records of queue 1 written and replayed (the timer service's only door to the store's reads).

A settle record names timers that are finished: body = their timer queue offsets
(``"17,18,"``), tag ``d`` (delivered), ``r`` (recalled) or ``l`` (rolled: written again at the
head), property ``TIMER_LOW`` = the low-water mark when it was written (every timer below it is
settled).  Recovery needs only the newest settle record's mark and the settle records written
since the oldest timer at or above it was stored, since a timer is always stored before it is
settled.  Reads go through ``store.get``, so a SYNC_MASTER's visibility limit applies to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from txbroker.service.timer.props import SETTLE_QUEUE, TIMER_QUEUE
from txbroker.service.topics import TIMER_TOPIC
from txbroker.store.record import PROPERTY_TAGS, Message, StoredMessage

PROPERTY_TIMER_LOW = "TIMER_LOW"
TAG_DELIVERED = "d"
TAG_RECALLED = "r"
TAG_ROLLED = "l"
#: Records read per store.get (intake, recovery, wheel slots).
READ_BATCH = 256
#: Recovery reads settle records from this long before the oldest pending timer was stored
#: (store clocks of one broker; the margin only makes the read start earlier).
SETTLE_MARGIN_MS = 1000


class TimerLog:
    """Reads of both timer queues and the settle records to write (event-loop only)."""

    def __init__(self, store, clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.clock_ms = clock_ms

    def end(self) -> int:
        """The next timer queue offset to be written."""
        return self.store.max_offset(TIMER_TOPIC, TIMER_QUEUE)

    def read(self, offset: int) -> StoredMessage | None:
        """The timer record at ``offset``, None if the store cannot show it."""
        return next(self.records(TIMER_QUEUE, offset, offset + 1), None)

    def records(self, queue: int, start: int, end: int) -> Iterator[StoredMessage]:
        """The records of a timer topic queue in [start, end) the store shows, in batches."""
        offset = start
        while offset < end:
            res = self.store.get(TIMER_TOPIC, queue, offset, min(READ_BATCH, end - offset))
            msgs = res.messages() if res.raw else []
            if not msgs:
                if res.next_offset > offset:  # entries the store can no longer read
                    offset = res.next_offset
                    continue
                return
            for m in msgs:
                if m.queue_offset >= end:
                    return
                yield m
            offset = msgs[-1].queue_offset + 1

    def read_runs(self, offsets: list[int]) -> Iterator[StoredMessage]:
        """The timer records at ``offsets`` (sorted), read a run of consecutive offsets at a
        time (timers sent together sit together)."""
        i = 0
        while i < len(offsets):
            j = i + 1
            while j < len(offsets) and offsets[j] == offsets[j - 1] + 1:
                j += 1
            wanted = set(offsets[i:j])
            for m in self.records(TIMER_QUEUE, offsets[i], offsets[j - 1] + 1):
                if m.queue_offset in wanted:
                    yield m
            i = j

    def settle_record(self, offsets: list[int], tag: str, mark: int) -> Message:
        """A settle record naming ``offsets``; ``mark`` must be at or below every pending
        timer (the mark before these are settled is: recovery then reads a little more)."""
        body = "".join(f"{o}," for o in offsets).encode()
        return Message(topic=TIMER_TOPIC, queue_id=SETTLE_QUEUE, body=body,
                       properties={PROPERTY_TAGS: tag, PROPERTY_TIMER_LOW: str(mark)},
                       born_timestamp=self.clock_ms())

    def recovery_mark(self) -> int:
        """Where recovery starts reading timers: the newest settle record's mark, or the
        timer queue's first offset (no settle record, or one the store cannot show)."""
        base = self.store.min_offset(TIMER_TOPIC, TIMER_QUEUE)
        end = self.store.max_offset(TIMER_TOPIC, SETTLE_QUEUE)
        last = next(self.records(SETTLE_QUEUE, end - 1, end), None) if end > 0 else None
        low = last.properties.get(PROPERTY_TIMER_LOW, "") if last is not None else ""
        return max(base, int(low)) if low.isascii() and low.isdigit() else base

    def settled_since(self, mark: int, cursor: int) -> Iterator[int]:
        """The timer offsets the settle records name, from those written since the oldest
        timer record at or above ``mark`` (below ``cursor``) was stored."""
        first = next(self.records(TIMER_QUEUE, mark, cursor), None)
        if first is None:
            return
        start = self.store.offset_by_time(TIMER_TOPIC, SETTLE_QUEUE,
                                          first.store_timestamp - SETTLE_MARGIN_MS)
        for m in self.records(SETTLE_QUEUE, start, self.store.max_offset(TIMER_TOPIC, SETTLE_QUEUE)):
            for piece in m.body.split(b","):
                if piece.isascii() and piece.isdigit():
                    yield int(piece)
