"""The pending timers of one master, in memory (pure: no I/O, no clock).

Two structures, both small per timer because a long horizon may hold millions of them:

* **a wheel of one-second slots**: ``second -> array of timer queue offsets`` plus a heap of
  the slot seconds, so the delivery loop takes the timers of the next second in one step and
  a recall looks at one slot only.  8 bytes per timer (an ``array('q')`` entry).
* **a pending bit per timer queue offset** from the low-water mark :attr:`TimerIndex.base` on
  (every timer below it is settled: delivered, recalled or rolled).  A settle only clears the
  bit; slot entries whose bit is clear are skipped when their slot is taken.  The mark moves
  past settled timers (:meth:`advance`) and the bytes below it are dropped, so the bits cover
  the timers stored since the oldest pending one, which rolling keeps within
  ``timer_roll_window`` (txbroker.service.timer.service).

Event-loop only, like the service that owns it.
"""

from __future__ import annotations

import heapq
from array import array

#: Bits dropped from the front at once once the mark has passed them (whole bytes).
_TRIM_BYTES = 4096


class TimerIndex:
    """Pending timers by due second, and which timer queue offsets are still pending."""

    def __init__(self, base: int) -> None:
        #: Low-water mark: every timer queue offset below it is settled.
        self.base = base
        #: Timer queue offset of bit 0 of ``_bits`` (a multiple of 8 past the first base).
        self._origin = base
        self._bits = bytearray()
        self._slots: dict[int, array] = {}
        self._seconds: list[int] = []
        #: Timers pending (bits set).
        self.pending = 0

    def add(self, offset: int, when_ms: int, *, wheel: bool = True) -> None:
        """A timer stored at queue offset ``offset`` (at or past the mark), due at ``when_ms``;
        ``wheel=False`` marks it pending without a slot entry (the caller holds it already)."""
        if offset < self.base:
            raise ValueError(f"timer queue offset {offset} is below the mark {self.base}")
        i = offset - self._origin
        need = (i >> 3) + 1
        if need > len(self._bits):
            self._bits.extend(bytes(need - len(self._bits)))
        mask = 1 << (i & 7)
        if self._bits[i >> 3] & mask:
            return
        self._bits[i >> 3] |= mask
        self.pending += 1
        if not wheel:
            return
        second = when_ms // 1000
        slot = self._slots.get(second)
        if slot is None:
            slot = self._slots[second] = array("q")
            heapq.heappush(self._seconds, second)
        slot.append(offset)

    def is_pending(self, offset: int) -> bool:
        i = offset - self._origin
        if offset < self.base or (i >> 3) >= len(self._bits):
            return False
        return bool(self._bits[i >> 3] & (1 << (i & 7)))

    def settle(self, offset: int) -> bool:
        """Mark ``offset`` delivered, recalled or rolled; False if it was not pending."""
        if not self.is_pending(offset):
            return False
        i = offset - self._origin
        self._bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF
        self.pending -= 1
        return True

    def next_second(self) -> int | None:
        """The earliest slot second that holds entries, None when the wheel is empty."""
        return self._seconds[0] if self._seconds else None

    def take(self, upto_second: int) -> list[int]:
        """Remove every slot up to ``upto_second``; their still-pending offsets, in order."""
        out: list[int] = []
        while self._seconds and self._seconds[0] <= upto_second:
            second = heapq.heappop(self._seconds)
            out.extend(o for o in self._slots.pop(second) if self.is_pending(o))
        out.sort()
        return out

    def in_slot(self, second: int) -> list[int]:
        """The pending offsets waiting in one slot (a recall's candidates)."""
        return [o for o in self._slots.get(second, ()) if self.is_pending(o)]

    def advance(self, end: int) -> int:
        """Move the mark past settled offsets, up to ``end`` (the next offset not yet taken
        in); returns the mark."""
        base = self.base
        bits = self._bits
        origin = self._origin
        while base < end:
            i = base - origin
            byte = i >> 3
            if byte >= len(bits):
                base = end
                break
            if bits[byte] == 0 and (i & 7) == 0:
                base += 8  # a whole settled byte
                continue
            if bits[byte] & (1 << (i & 7)):
                break
            base += 1
        self.base = max(self.base, min(base, end))
        drop = (self.base - origin) >> 3
        if drop >= _TRIM_BYTES:
            del bits[:drop]
            self._origin = origin + (drop << 3)
        return self.base
