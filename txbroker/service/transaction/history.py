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
  the operator's name, and the decision time;
* the number of check-backs sent before the decision (None when it is not known: a commit
  whose op record a crash prevented, an op record written without it), so ``txn show`` can
  say how many check-backs a check answer or a discard took rather than print a wrong 0.

An entry costs 400-500 bytes (measured with ``tracemalloc``: the tuple, its two dict slots,
two ints, the count (a small int, shared) and the 32-character id string; the upper figure once eviction has churned the
dicts), so the default 100,000 entries hold 40-50 MB;
a busy broker that wants a longer memory of ids raises the bound, a small one lowers it.  Recovery rebuilds it from the op records
(which carry the source, operator and transaction id) or from the clean-close snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

from txbroker.service.transaction.state import HalfState

#: Decision sources, as op records and TXN_SHOW spell them, and their one-letter snapshot codes.
SOURCES = {"producer": "p", "check": "c", "operator": "o", "unknown": "u"}
_SOURCE_OF = {code: name for name, code in SOURCES.items()}
_STATE_CODES = {HalfState.COMMITTED: "c", HalfState.ROLLED_BACK: "r", HalfState.DISCARDED: "d"}
_STATE_OF = {code: state for state, code in _STATE_CODES.items()}


class Decided(NamedTuple):
    """One decided half, as the history remembers it.

    A tuple: recovery loads up to ``capacity`` entries, and the history stores the plain tuples
    it is given (built at C speed by ``zip``) instead of building an object per entry; lookups
    return a :class:`Decided` view of them.
    """

    queue_offset: int
    state: HalfState
    source: str
    operator: str | None
    decided_at: int             # ms, the broker's clock
    txn_id: str | None          # UNIQ_KEY of the half
    checks: int | None          # check-backs sent before the decision; None: not known


_QO, _ID = 0, 5  # field positions, for the plain tuples stored


class TxHistory:
    """The newest ``capacity`` decisions, by half queue offset and by transaction id."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_offset: OrderedDict[int, tuple] = OrderedDict()
        self._by_id: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_offset)

    def record(self, entry: Decided) -> None:
        """Remember ``entry`` as the newest decision, replacing one about the same half
        (an operator deciding a discarded half); the oldest go beyond ``capacity``."""
        self.replay((entry,))

    def replay(self, events: Iterable[tuple]) -> None:
        """Apply events oldest first: a tuple of :class:`Decided`'s fields is recorded, a
        1-tuple ``(queue offset,)`` forgets that half (resumed: it is pending again)."""
        by_offset, by_id = self._by_offset, self._by_id
        for event in events:
            qo = event[_QO]
            old = by_offset.pop(qo, None)
            if old is not None:
                self._unindex(old)
            if len(event) == 1 or self.capacity <= 0:
                continue
            by_offset[qo] = event
            if event[_ID]:
                by_id[event[_ID]] = qo
        self._evict()

    def drop(self, queue_offset: int) -> None:
        """Forget the half at ``queue_offset`` (resumed: it is pending again)."""
        self.replay(((queue_offset,),))

    def _evict(self) -> None:
        while len(self._by_offset) > max(self.capacity, 0):
            _, old = self._by_offset.popitem(last=False)
            self._unindex(old)

    def _unindex(self, old: tuple) -> None:
        if old[_ID] and self._by_id.get(old[_ID]) == old[_QO]:
            del self._by_id[old[_ID]]

    def get(self, queue_offset: int) -> Decided | None:
        found = self._by_offset.get(queue_offset)
        return None if found is None else Decided._make(found)

    def by_txn_id(self, txn_id: str) -> Decided | None:
        qo = self._by_id.get(txn_id)
        return None if qo is None else self.get(qo)

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

    def export(self) -> dict[str, Any]:
        """The snapshot form, oldest first, one list per field (``state`` and ``source`` as
        one-letter codes in a string): loading columns is several times faster than rows."""
        entries = list(map(Decided._make, self._by_offset.values()))
        return {"qo": [e.queue_offset for e in entries],
                "state": "".join(_STATE_CODES[e.state] for e in entries),
                "source": "".join(SOURCES[e.source] for e in entries),
                "operator": [e.operator for e in entries],
                "at": [e.decided_at for e in entries],
                "id": [e.txn_id for e in entries],
                "checks": [e.checks for e in entries]}

    def load(self, doc: dict[str, Any]) -> None:
        """Replace the content with an :meth:`export`; ValueError if it is malformed (then the
        content is unchanged).  A snapshot written before counts were kept has no ``checks``
        column: its counts load as not known."""
        try:
            qos, ats, operators, ids = doc["qo"], doc["at"], doc["operator"], doc["id"]
            checks = doc.get("checks", [None] * len(qos) if isinstance(qos, list) else None)
            states = [_STATE_OF[c] for c in doc["state"]]
            sources = [_SOURCE_OF[c] for c in doc["source"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"history: {exc!r}") from None
        columns = (qos, ats, operators, ids, states, sources, checks)
        if (not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1
                or not all(type(x) is int for x in qos) or not all(type(x) is int for x in ats)
                or not all(x is None or type(x) is str for x in (*operators, *ids))
                or not all(x is None or type(x) is int for x in checks)):
            raise ValueError("history: columns of different lengths or types")
        self._by_offset = OrderedDict(zip(qos, zip(qos, states, sources, operators, ats, ids,
                                                   checks, strict=True), strict=True))
        self._by_id = {txn_id: qo for qo, txn_id in zip(qos, ids, strict=True) if txn_id}
        self._evict()
