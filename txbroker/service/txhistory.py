"""The history of decided transactions: what ``txbroker txn show`` answers after a decision.

Once a half is decided the pending index forgets it, and :class:`ResolvedStates` keeps one
byte per half: enough to refuse a contradicting END_TRANSACTION, not enough to tell an
operator *who* decided, *when*, or to find the half again by its transaction id (UNIQ_KEY).
:class:`TxHistory` keeps exactly that for the most recent decisions, bounded in count
(``BrokerConfig.transaction_history_size``, oldest evicted first):

* the half queue offset (the half's identity in the half queue; topic, keys, producer group
  and prepare time are read from the half record when asked, so they cost no memory here);
* the transaction id, so an id the pending index no longer holds still resolves;
* the state (committed, rolled back, discarded), the decision source (``producer`` = the
  producer's END_TRANSACTION, ``check`` = an answer to a check-back or the check service
  giving up, ``operator``, or ``unknown`` when a record written without it was replayed) and
  the operator's name, and the decision time.

An entry costs about 370 bytes (measured with ``tracemalloc``: the entry, its two dict
slots, two ints and the 32-character id string), so the default 100,000 entries hold ~37 MB;
a busy broker that wants a longer memory of ids raises the bound, a small one lowers it.  Recovery rebuilds it from the op records
(which carry the source, operator and transaction id) or from the clean-close snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from txbroker.service.txstate import HalfState

#: Decision sources, as op records and TXN_SHOW spell them.
SOURCES = ("producer", "check", "operator", "unknown")


@dataclass(slots=True, frozen=True)
class Decided:
    """One decided half, as the history remembers it."""

    queue_offset: int
    state: HalfState
    source: str
    operator: str | None
    decided_at: int             # ms, the broker's clock
    txn_id: str | None          # UNIQ_KEY of the half

    def row(self) -> list[Any]:
        """The snapshot form (see :meth:`TxHistory.export`)."""
        return [self.queue_offset, self.state.value, self.source, self.operator,
                self.decided_at, self.txn_id]

    @classmethod
    def from_row(cls, row: list[Any]) -> Decided:
        """Inverse of :meth:`row`; ValueError or TypeError on a malformed row."""
        qo, state, source, operator, at, txn_id = row
        if not isinstance(qo, int) or not isinstance(at, int) or source not in SOURCES:
            raise ValueError(f"bad history row {row!r}")
        return cls(qo, HalfState(state), source, operator, at, txn_id)


class TxHistory:
    """The newest ``capacity`` decisions, by half queue offset and by transaction id."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_offset: OrderedDict[int, Decided] = OrderedDict()
        self._by_id: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_offset)

    def record(self, entry: Decided) -> None:
        """Remember ``entry`` as the newest decision, replacing one about the same half
        (an operator deciding a discarded half); the oldest go beyond ``capacity``."""
        self.drop(entry.queue_offset)
        if self.capacity <= 0:
            return
        self._by_offset[entry.queue_offset] = entry
        if entry.txn_id:
            self._by_id[entry.txn_id] = entry.queue_offset
        while len(self._by_offset) > self.capacity:
            _, old = self._by_offset.popitem(last=False)
            self._unindex(old)

    def drop(self, queue_offset: int) -> None:
        """Forget the half at ``queue_offset`` (resumed: it is pending again)."""
        old = self._by_offset.pop(queue_offset, None)
        if old is not None:
            self._unindex(old)

    def _unindex(self, old: Decided) -> None:
        if old.txn_id and self._by_id.get(old.txn_id) == old.queue_offset:
            del self._by_id[old.txn_id]

    def get(self, queue_offset: int) -> Decided | None:
        return self._by_offset.get(queue_offset)

    def by_txn_id(self, txn_id: str) -> Decided | None:
        qo = self._by_id.get(txn_id)
        return None if qo is None else self._by_offset.get(qo)

    def trim_below(self, queue_offset: int) -> None:
        """Forget the oldest decisions about halves below ``queue_offset`` (deleted by
        retention).  Stops at the first newer one: decisions come roughly in half order, and a
        straggler costs only its entry until it is evicted."""
        while self._by_offset:
            qo, old = next(iter(self._by_offset.items()))
            if qo >= queue_offset:
                return
            del self._by_offset[qo]
            self._unindex(old)

    def export(self) -> list[list[Any]]:
        """Oldest first, as rows ``[queue offset, state, source, operator, decided at, id]``."""
        return [e.row() for e in self._by_offset.values()]
