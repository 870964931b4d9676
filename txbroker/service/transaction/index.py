"""What the service keeps in memory about decided halves: :class:`ResolvedStates` (one byte
per decided one); and a half's immunity (:func:`immunity_ms`).  The undecided halves are in
:mod:`.pending`.  Pure: no I/O."""

from __future__ import annotations

import re
from collections.abc import Iterator

from txbroker.service.transaction.oplog import is_uint
from txbroker.service.transaction.state import HalfState
from txbroker.store.record import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, StoredMessage

_ZERO_RUNS = re.compile(rb"\x00+")
_STATE_CODES = {HalfState.COMMITTED: 1, HalfState.ROLLED_BACK: 2}
_CODE_STATES = {code: state for state, code in _STATE_CODES.items()}


def immunity_ms(props: dict[str, str], default_ms: int) -> int:
    """The half's CHECK_IMMUNITY_TIME_IN_SECONDS in ms, or ``default_ms`` (the broker's
    ``transaction_timeout``) when it has none."""
    raw = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    if raw is not None and is_uint(raw.strip()):
        return int(raw) * 1000
    return default_ms


def stored_immunity_ms(m: StoredMessage, default_ms: int) -> int:
    """:func:`immunity_ms` of a half read back from the store (a bad value means the default)."""
    try:
        return immunity_ms(m.properties, default_ms)
    except ValueError:
        return default_ms


class ResolvedStates:
    """Final state of every decided half, one byte per half-queue offset.

    Half-queue offsets are dense and increase with time, so a ``bytearray`` indexed from the
    oldest half seen holds the decision of every retained transaction at one byte each (a dict
    would cost ~100 bytes per entry).  0 means "not decided here".
    """

    def __init__(self) -> None:
        self._base: int | None = None
        self._buf = bytearray()

    def set(self, queue_offset: int, state: HalfState) -> None:
        if self._base is None:
            self._base = queue_offset
        i = queue_offset - self._base
        if i < 0:
            # older than anything seen (only after a store that lost its head): grow downwards
            self._buf[0:0] = bytes(-i)
            self._base, i = queue_offset, 0
        if i >= len(self._buf):
            self._buf.extend(bytes(i + 1 - len(self._buf)))
        self._buf[i] = _STATE_CODES[state]

    def get(self, queue_offset: int) -> HalfState | None:
        if self._base is None:
            return None
        i = queue_offset - self._base
        if 0 <= i < len(self._buf):
            return _CODE_STATES.get(self._buf[i])
        return None

    def export(self) -> tuple[int | None, bytes]:
        return self._base, bytes(self._buf)

    @classmethod
    def restore(cls, base: int | None, data: bytes) -> ResolvedStates:
        rs = cls()
        if base is not None:
            rs._base, rs._buf = base, bytearray(data)
        return rs

    def trim_below(self, queue_offset: int) -> None:
        """Forget decisions about halves below ``queue_offset`` (deleted by retention)."""
        if self._base is None or queue_offset <= self._base:
            return
        n = min(queue_offset - self._base, len(self._buf))
        del self._buf[:n]
        self._base = queue_offset if not self._buf else self._base + n

    def undecided_runs(self, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Runs ``[start, end)`` of queue offsets in ``[lo, hi)`` with no decision recorded.

        Found with a regular expression over the byte array (C speed), so finding the few
        undecided halves among millions of decided ones does not loop in Python per half.
        """
        if self._base is None:
            if lo < hi:
                yield lo, hi
            return
        base, end = self._base, self._base + len(self._buf)
        if lo < min(base, hi):
            yield lo, min(base, hi)
        first, last = max(lo, base), min(hi, end)
        if first < last:
            for m in _ZERO_RUNS.finditer(self._buf, first - base, last - base):
                yield base + m.start(), base + m.end()
        if max(lo, end) < hi:
            yield max(lo, end), hi
