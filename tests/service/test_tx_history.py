"""The decision history on its own: bounded in count, oldest evicted, found by id and offset."""

from __future__ import annotations

import pytest

from txbroker.service.transaction.history import Decided, TxHistory
from txbroker.service.transaction.state import HalfState

C, R, D = HalfState.COMMITTED, HalfState.ROLLED_BACK, HalfState.DISCARDED


def decided(qo: int, state: HalfState = C, source: str = "producer", operator: str | None = None,
            at: int | None = None) -> Decided:
    return Decided(qo, state, source, operator, 1_000 + qo if at is None else at, f"ID{qo}",
                   qo % 3 or None)  # a count, or None: not known


def test_bound_evicts_the_oldest_decision_and_its_id() -> None:
    h = TxHistory(3)
    for qo in range(5):
        h.record(decided(qo))
    assert len(h) == 3
    assert [h.get(qo) for qo in (0, 1)] == [None, None]
    assert h.by_txn_id("ID0") is None and h.by_txn_id("ID1") is None
    assert h.by_txn_id("ID4") == decided(4)
    assert h.export()["qo"] == [2, 3, 4]


def test_a_new_decision_on_the_same_half_replaces_it_as_the_newest() -> None:
    h = TxHistory(3)
    for qo in range(3):
        h.record(decided(qo, D, "check"))
    # the operator commits the oldest discarded half: it is now the newest entry...
    h.record(decided(0, C, "operator", "alice", at=9_999))
    assert h.get(0) == decided(0, C, "operator", "alice", at=9_999) and len(h) == 3
    # ...so the next eviction takes half 1, not the one just decided
    h.record(decided(3))
    assert h.get(1) is None and h.get(0) is not None and h.by_txn_id("ID0").state is C


def test_drop_and_trim_forget_entries_and_ids() -> None:
    h = TxHistory(10)
    for qo in range(6):
        h.record(decided(qo, R))
    h.drop(5)  # resumed: pending again
    assert h.get(5) is None and h.by_txn_id("ID5") is None
    h.trim_below(3)  # retention deleted halves 0..2
    assert h.export()["qo"] == [3, 4]
    assert h.by_txn_id("ID2") is None and h.by_txn_id("ID3") is not None


def test_zero_capacity_keeps_nothing() -> None:
    h = TxHistory(0)
    h.record(decided(1))
    assert len(h) == 0 and h.by_txn_id("ID1") is None


def test_export_load_round_trip_and_bad_exports_are_refused() -> None:
    h = TxHistory(10)
    for qo, state, source, operator in ((3, D, "check", None), (1, C, "operator", "bob"),
                                        (2, R, "unknown", None)):
        h.record(decided(qo, state, source, operator))
    doc = h.export()
    loaded = TxHistory(10)
    loaded.load(doc)
    assert loaded.export() == doc and loaded.by_txn_id("ID1") == decided(1, C, "operator", "bob")
    smaller = TxHistory(2)  # the bound was lowered between runs: the oldest go
    smaller.load(doc)
    assert smaller.export()["qo"] == [1, 2]
    for key, bad in (("state", "cx?"), ("source", "cz!"), ("qo", [3, 1]), ("at", ["1", 2, 3]),
                     ("id", [1, None, None]), ("operator", None)):
        with pytest.raises(ValueError):
            loaded.load({**doc, key: bad})
    with pytest.raises(ValueError):
        loaded.load({"qo": []})
    with pytest.raises(ValueError):
        loaded.load({**doc, "checks": [1, "2", None]})
    # a snapshot from before counts were kept: every count is not known (never 0)
    old = TxHistory(10)
    old.load({k: v for k, v in doc.items() if k != "checks"})
    assert [old.get(qo).checks for qo in (3, 1, 2)] == [None, None, None]
    assert old.get(1)._replace(checks=1) == decided(1, C, "operator", "bob")
    assert loaded.export() == doc  # unchanged by the refused loads
