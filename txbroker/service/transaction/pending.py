"""What the service keeps in memory about each undecided half (pending or discarded):
:class:`PendingIndex`, and :class:`HalfEntry` views of its slots.  Pure: no I/O.

Why columns: a broker may hold a million pending halves (producers gone, a check storm), and
one object per half with its strings and ints costs ~600 bytes.  :class:`PendingIndex` keeps
each field in an ``array`` column (or a ``bytearray``, or one list of connection references),
one slot per half in commitlog order, and derives what it can: the group and real topic are
interned (one small id per half), the offsetMsgId is the store's host prefix plus the commitlog
offset, a 32-hex-character UNIQ_KEY is two 64-bit integers, and keys and tags are read from
the half record when a TXN_LIST row needs them.  ``python -m txbroker.bench.pending`` measures
it: ~150 bytes per pending half at a million (tracemalloc), the UNIQ_KEY set included.

Slots are kept in commitlog order, which is store-time order, so a check pass finds the due
halves with one binary search on the store times (everything after the first half younger than
the smallest immunity is not due) instead of looking at every pending half.  A decided half
leaves a tombstone (its final state, so a :class:`HalfEntry` still reads it); tombstones at the
tail are dropped at once and the rest are compacted away once they outnumber a quarter of the
live halves, so the columns hold at most 1.25 slots per undecided half.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import compress
from typing import Any

from txbroker.service.transaction.index import stored_immunity_ms
from txbroker.service.transaction.oplog import is_uint
from txbroker.service.transaction.state import HalfState
from txbroker.store.record import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
)

# PendingIndex slot states: 1 and 2 are live (undecided), the others tombstones.
_PENDING, _DISCARDED, _COMMITTED, _ROLLED_BACK, _GONE = 1, 2, 3, 4, 5
_SLOT_CODES = {HalfState.PENDING: _PENDING, HalfState.DISCARDED: _DISCARDED,
               HalfState.COMMITTED: _COMMITTED, HalfState.ROLLED_BACK: _ROLLED_BACK}
_SLOT_STATES: dict[int, HalfState | None] = {code: s for s, code in _SLOT_CODES.items()}
_SLOT_STATES[_GONE] = None
#: bytes.translate table: 1 for a live slot, 0 for a tombstone (compaction's selectors).
_LIVE = bytes(1 if code in (_PENDING, _DISCARDED) else 0 for code in range(256))
_PENDING_RUNS = re.compile(rb"\x01+")
_U64 = (1 << 64) - 1
_MAX_IMMUNITY_MS = (1 << 31) - 1
#: Tombstones are compacted away when more than this many and more than a quarter of the live.
_MIN_COMPACT = 1024



def _uniq_int(uniq: str | None) -> int | None:
    """A UNIQ_KEY of 32 uppercase hex characters (every RocketMQ client's) as an int, else None."""
    if uniq is None or len(uniq) != 32:
        return None
    try:
        n = int(uniq, 16)
    except ValueError:
        return None
    return n if f"{n:032X}" == uniq else None


class HalfEntry:
    """One undecided half of a :class:`PendingIndex`, as a small view.

    The fields that never change are copied when the view is made, so they stay readable after
    the half is decided; ``state``, ``checks`` and ``conn`` read and write the index, so every
    view of a half sees the same values (``state`` is None once the index dropped the half).
    """

    __slots__ = (
        "_checks",
        "_ix",
        "_prefix",
        "_slot",
        "body_size",
        "group",
        "immunity_ms",
        "phys",
        "queue_id",
        "queue_offset",
        "store_ts",
        "topic",
        "uniq",
    )

    def __init__(self, ix: PendingIndex, slot: int) -> None:
        self._ix, self._slot = ix, slot
        self.phys = ix._phys[slot]
        self.queue_offset = ix._qo[slot]
        self.store_ts = ix._ts[slot]
        self.immunity_ms = ix._imm[slot]
        self.group, self.topic, prefix = ix._kinds[ix._kind[slot]]
        self.queue_id = ix._qid[slot]
        self.body_size = ix._size[slot]
        self._prefix = prefix
        self.uniq = ix._uniq_at(slot, self.phys)
        self._checks = ix._checks[slot]

    @property
    def msg_id(self) -> str:
        """The offsetMsgId: the store's host prefix and the commitlog offset (made when read)."""
        return f"{self._prefix}{self.phys:016X}"

    def _at(self) -> int:
        """This half's slot now (slots move when the index compacts), -1 if it is gone."""
        ix, slot = self._ix, self._slot
        if slot >= len(ix._phys) or ix._phys[slot] != self.phys:
            self._slot = slot = ix.slot_of(self.phys)
        return slot

    @property
    def state(self) -> HalfState | None:
        slot = self._at()
        return _SLOT_STATES[self._ix._state[slot]] if slot >= 0 else None

    @property
    def checks(self) -> int:
        slot = self._at()
        if slot >= 0:
            self._checks = self._ix._checks[slot]
        return self._checks

    @checks.setter
    def checks(self, value: int) -> None:
        self._checks = value
        slot = self._at()
        if slot >= 0:
            self._ix._checks[slot] = value

    @property
    def conn(self) -> Any:
        """The connection that sent the half (asked first on a check); None after a restart."""
        slot = self._at()
        return self._ix._conn[slot] if slot >= 0 else None

    @conn.setter
    def conn(self, value: Any) -> None:
        slot = self._at()
        if slot >= 0:
            self._ix._conn[slot] = value

    def row(self, now_ms: int, half: StoredMessage | None) -> dict[str, Any]:
        """The TXN_LIST row; keys and tags come from the stored ``half`` (None: unreadable)."""
        state = self.state
        return half_row(self.phys, self.queue_offset, self.msg_id, self.uniq, self.topic,
                        self.queue_id, self.group, self.store_ts, self.checks,
                        state.value if state is not None else "unknown", half, now_ms)


def half_row(phys: int, queue_offset: int, msg_id: str, uniq: str | None, topic: str,
             queue_id: int, group: str, store_ts: int, checks: int, state: str,
             half: StoredMessage | None, now_ms: int) -> dict[str, Any]:
    """A TXN_LIST row."""
    return {
        "id": uniq or msg_id, "offset_msg_id": msg_id, "commit_log_offset": phys,
        "queue_offset": queue_offset, "topic": topic, "queue_id": queue_id,
        "keys": half.keys if half is not None else None,
        "tags": half.tags if half is not None else None,
        "producer_group": group, "age_s": round(max(0, now_ms - store_ts) / 1000, 3),
        "checks": checks, "state": state,
    }


def stored_row(m: StoredMessage, now_ms: int) -> dict[str, Any]:
    """The TXN_LIST row of a half that is not in the index, from its record alone."""
    props = m.properties
    qid = props.get(PROPERTY_REAL_QUEUE_ID, "0")
    return half_row(m.physical_offset, m.queue_offset, m.msg_id, props.get(PROPERTY_UNIQ_KEY),
                    props.get(PROPERTY_REAL_TOPIC, ""), int(qid) if is_uint(qid) else 0,
                    props.get(PROPERTY_PRODUCER_GROUP, ""), m.store_timestamp, 0, "pending", m,
                    now_ms)


class PendingIndex:
    """The undecided halves (pending and discarded), one slot per half in commitlog order,
    each field in its own column (see the module docstring for why and what it costs).

    Lookups: by commitlog offset (binary search), by UNIQ_KEY (a set of 128-bit ints says
    whether one is here, then a search of the UNIQ_KEY column finds it: only a producer's retry
    or an operator's lookup gets that far), and the due halves of a check pass
    (:meth:`due`).  Event-loop only, like the service that owns it.
    """

    def __init__(self) -> None:
        self._phys = array("q")
        self._qo = array("q")
        self._ts = array("q")       # store time, ms (the broker's clock)
        self._imm = array("i")      # immunity, ms
        self._kind = array("I")     # -> _kinds: (group, real topic, offsetMsgId host prefix)
        self._qid = array("i")      # real queue id
        self._size = array("i")     # body bytes (a retry must match it)
        self._checks = array("I")
        self._hi = array("Q")       # UNIQ_KEY as two 64-bit halves (0, 0 when in _odd_uniq)
        self._lo = array("Q")
        self._state = bytearray()
        self._conn: list[Any] = []
        self._kinds: list[tuple[str, str, str]] = []
        self._kind_ids: dict[tuple[str, str, str], int] = {}
        #: Live UNIQ_KEYs in the hex form, as ints.
        self._uniqs: set[int] = set()
        #: commitlog offset -> UNIQ_KEY for halves whose key is missing or not 32 uppercase hex.
        self._odd_uniq: dict[int, str | None] = {}
        self._odd_by_uniq: dict[str, int] = {}
        #: immunity ms -> live halves with it: the smallest bounds what a check pass looks at.
        self._immunities: Counter[int] = Counter()
        self._live = [0, 0, 0]      # [-, pending, discarded]
        self._dead = 0

    # --- size ------------------------------------------------------------------------------
    def count(self, state: HalfState) -> int:
        return self._live[_SLOT_CODES[state]]

    def __len__(self) -> int:
        return self._live[_PENDING] + self._live[_DISCARDED]

    # --- adding and removing ---------------------------------------------------------------
    def add(self, *, phys: int, queue_offset: int, store_ts: int, immunity_ms: int, group: str,
            topic: str, queue_id: int, body_size: int, msg_id: str, uniq: str | None,
            conn: Any = None, checks: int = 0,
            state: HalfState = HalfState.PENDING) -> None:
        """Index an undecided half (pending or discarded); no view is made (the prepare path
        pays for no more than the columns)."""
        prefix = msg_id[:-16] if msg_id.endswith(f"{phys:016X}") else msg_id
        kind_key = (group, topic, prefix)
        kind = self._kind_ids.get(kind_key)
        if kind is None:
            kind = self._kind_ids[kind_key] = len(self._kinds)
            self._kinds.append(kind_key)
        n = _uniq_int(uniq)
        hi, lo = (0, 0) if n is None else (n >> 64, n & _U64)
        imm = min(max(immunity_ms, 0), _MAX_IMMUNITY_MS)
        code = _SLOT_CODES[state]
        phys_col = self._phys
        if not phys_col or phys_col[-1] < phys:  # the prepare path: one append per column
            phys_col.append(phys)
            self._qo.append(queue_offset)
            self._ts.append(store_ts)
            self._imm.append(imm)
            self._kind.append(kind)
            self._qid.append(queue_id)
            self._size.append(body_size)
            self._checks.append(checks)
            self._hi.append(hi)
            self._lo.append(lo)
            self._state.append(code)
            self._conn.append(conn)
        else:  # prepared concurrently and stored earlier, or resumed: still in log order
            values = (phys, queue_offset, store_ts, imm, kind, queue_id, body_size, checks, hi, lo)
            slot = bisect_left(phys_col, phys)
            if slot < len(phys_col) and phys_col[slot] == phys:
                raise ValueError(f"half {phys} is already indexed")
            for col, v in zip(self._columns(), values, strict=True):
                col.insert(slot, v)
            self._state.insert(slot, code)
            self._conn.insert(slot, conn)
        if n is None:
            self._odd_uniq[phys] = uniq
            if uniq:
                self._odd_by_uniq[uniq] = phys
        else:
            self._uniqs.add(n)
        self._immunities[imm] += 1
        self._live[code] += 1

    def remove(self, phys: int, final: HalfState | None) -> None:
        """Drop a half: decided (``final`` stays readable through existing views until the
        slot is compacted away) or forgotten (None)."""
        slot = self.slot_of(phys)
        if slot < 0:
            return
        code = self._state[slot]
        if code not in (_PENDING, _DISCARDED):
            return
        self._live[code] -= 1
        self._dead += 1
        self._state[slot] = _GONE if final is None else _SLOT_CODES[final]
        self._conn[slot] = None
        imm = self._imm[slot]
        self._immunities[imm] -= 1
        if not self._immunities[imm]:
            del self._immunities[imm]
        if phys in self._odd_uniq:
            uniq = self._odd_uniq.pop(phys)
            if uniq and self._odd_by_uniq.get(uniq) == phys:
                del self._odd_by_uniq[uniq]
        else:
            self._uniqs.discard((self._hi[slot] << 64) | self._lo[slot])
        self._drop_tombstones()

    def set_state(self, phys: int, state: HalfState) -> None:
        """Move a live half between pending and discarded."""
        slot = self.slot_of(phys)
        code = self._state[slot] if slot >= 0 else _GONE
        if code not in (_PENDING, _DISCARDED):
            raise KeyError(phys)
        new = _SLOT_CODES[state]
        self._live[code] -= 1
        self._live[new] += 1
        self._state[slot] = new

    # --- lookups ---------------------------------------------------------------------------
    def slot_of(self, phys: int) -> int:
        """The slot of the half at ``phys`` (a tombstone included), -1 if none."""
        slot = bisect_left(self._phys, phys)
        return slot if slot < len(self._phys) and self._phys[slot] == phys else -1

    def get(self, phys: int) -> HalfEntry | None:
        """The undecided half at ``phys`` (pending or discarded), None if it is not here."""
        slot = self.slot_of(phys)
        if slot < 0 or self._state[slot] not in (_PENDING, _DISCARDED):
            return None
        return HalfEntry(self, slot)

    def find_uniq(self, uniq: str) -> int | None:
        """The commitlog offset of the undecided half with this UNIQ_KEY, None if none."""
        n = _uniq_int(uniq)
        if n is None:
            return self._odd_by_uniq.get(uniq)
        if n not in self._uniqs:
            return None
        hi, lo = n >> 64, n & _U64
        haystack = self._lo.tobytes()   # one copy, then a C search: rare (retries, operators)
        needle = array("Q", (lo,)).tobytes()
        pos = haystack.find(needle)
        while pos >= 0:
            slot = pos // 8
            if pos % 8 == 0 and self._hi[slot] == hi and self._state[slot] in (_PENDING, _DISCARDED):
                return self._phys[slot]
            pos = haystack.find(needle, pos + 1)
        return None

    def oldest_phys(self) -> int | None:
        """The smallest commitlog offset indexed (None if empty)."""
        return self._phys[0] if self._phys else None

    def entries(self, state: HalfState) -> list[HalfEntry]:
        """Every half in ``state`` (pending or discarded), in commitlog order."""
        code = bytes((_SLOT_CODES[state],))
        out, pos = [], self._state.find(code)
        while pos >= 0:
            out.append(HalfEntry(self, pos))
            pos = self._state.find(code, pos + 1)
        return out

    def select(self, states: Iterable[HalfState], *, topic: str | None = None,
               group: str | None = None, limit: int) -> list[HalfEntry]:
        """Up to ``limit`` halves in ``states``, optionally of one topic and group, in
        commitlog order (TXN_LIST)."""
        codes = {_SLOT_CODES[s] for s in states}
        kinds = {i for i, (g, t, _) in enumerate(self._kinds)
                 if (topic is None or t == topic) and (group is None or g == group)}
        out: list[HalfEntry] = []
        for slot, code in enumerate(self._state):
            if len(out) >= limit:
                break
            if code in codes and self._kind[slot] in kinds:
                out.append(HalfEntry(self, slot))
        return out

    def due(self, now_ms: int) -> list[HalfEntry]:
        """Pending halves older than their immunity at ``now_ms``, oldest first.

        Slots are in store-time order, so every half stored after ``now_ms - smallest
        immunity`` is not due: one binary search bounds the walk, and the runs of pending
        slots before it are found by a regular expression over the state bytes.  (If the
        broker's clock stepped back, halves stored after the step are found once the ones
        stored before it are due: late by at most the step.)
        """
        if not self._immunities:
            return []
        stop = bisect_right(self._ts, now_ms - min(self._immunities))
        ts, imm = self._ts, self._imm
        return [HalfEntry(self, slot)
                for run in _PENDING_RUNS.finditer(self._state, 0, stop)
                for slot in range(run.start(), run.end())
                if now_ms - ts[slot] >= imm[slot]]

    def open_states(self) -> Iterator[tuple[int, int, str]]:
        """(queue offset, checks, state) of every undecided half (the clean-close snapshot)."""
        for slot, code in enumerate(self._state):
            if code in (_PENDING, _DISCARDED):
                yield self._qo[slot], self._checks[slot], _SLOT_STATES[code].value

    # --- internals -------------------------------------------------------------------------
    def _columns(self) -> tuple[array, ...]:
        return (self._phys, self._qo, self._ts, self._imm, self._kind, self._qid, self._size,
                self._checks, self._hi, self._lo)

    def _uniq_at(self, slot: int, phys: int) -> str | None:
        if phys in self._odd_uniq:
            return self._odd_uniq[phys]
        return f"{(self._hi[slot] << 64) | self._lo[slot]:032X}"

    def _drop_tombstones(self) -> None:
        """Pop tombstones at the tail (the usual case: recent halves decided first); compact
        when the others outnumber a quarter of the live halves."""
        state = self._state
        while state and state[-1] not in (_PENDING, _DISCARDED):
            for col in self._columns():
                col.pop()
            state.pop()
            self._conn.pop()
            self._dead -= 1
        if self._dead > _MIN_COMPACT and self._dead * 4 > len(self):
            self._compact()

    def _compact(self) -> None:
        keep = bytes(self._state).translate(_LIVE)
        (self._phys, self._qo, self._ts, self._imm, self._kind, self._qid, self._size,
         self._checks, self._hi, self._lo) = (array(col.typecode, compress(col, keep))
                                              for col in self._columns())
        self._state = bytearray(compress(self._state, keep))
        self._conn = list(compress(self._conn, keep))
        self._dead = 0


def index_stored(ix: PendingIndex, m: StoredMessage, default_immunity_ms: int, *,
                 checks: int = 0, state: HalfState = HalfState.PENDING) -> None:
    """Index a half read back from the store (recovery)."""
    props = m.properties
    qid = props.get(PROPERTY_REAL_QUEUE_ID, "0")
    ix.add(phys=m.physical_offset, queue_offset=m.queue_offset,
                  store_ts=m.store_timestamp, immunity_ms=stored_immunity_ms(m, default_immunity_ms),
                  group=props.get(PROPERTY_PRODUCER_GROUP, ""),
                  topic=props.get(PROPERTY_REAL_TOPIC, ""),
                  queue_id=int(qid) if is_uint(qid) else 0, body_size=len(m.body),
                  msg_id=m.msg_id, uniq=props.get(PROPERTY_UNIQ_KEY), checks=checks, state=state)
