"""The Kafka transaction state's transition table on its own (no socket, no store), and the
state record's document: the names in the log never change, and a record written before the
states were an enum loads as it did."""

from __future__ import annotations

import pytest
from support.transitions import assert_table

from txbroker.service.kafka.txn_record import TxnMeta
from txbroker.service.kafka.txn_state import (
    TRANSITIONS,
    TxnState,
    TxnTransitionError,
    move,
)

S = TxnState
LEGAL = {
    (S.EMPTY, S.EMPTY), (S.EMPTY, S.ONGOING),
    (S.ONGOING, S.ONGOING), (S.ONGOING, S.PREPARE_COMMIT), (S.ONGOING, S.PREPARE_ABORT),
    (S.ONGOING, S.COMPLETE_ABORT),
    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT),
    (S.PREPARE_ABORT, S.COMPLETE_ABORT),
    (S.COMPLETE_COMMIT, S.EMPTY), (S.COMPLETE_COMMIT, S.ONGOING),
    (S.COMPLETE_ABORT, S.EMPTY), (S.COMPLETE_ABORT, S.ONGOING),
}


def test_the_table_allows_the_legal_moves_only() -> None:
    assert_table(TxnState, LEGAL, TRANSITIONS, move, TxnTransitionError)


def test_a_decision_is_final_until_completed() -> None:
    # a decided commit can neither be aborted nor decided again, and the other way round
    for decided in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
        assert TRANSITIONS[decided] == {S.COMPLETE_COMMIT if decided is S.PREPARE_COMMIT
                                        else S.COMPLETE_ABORT}
    assert [s for s in S if s.deciding] == [S.PREPARE_COMMIT, S.PREPARE_ABORT]
    assert [s for s in S if s.open] == [S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT]
    assert [s for s in S if s.settled] == [S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT]
    assert [s for s in S if s.holds_data] == [S.ONGOING, S.PREPARE_COMMIT]


def test_the_names_in_the_log_are_kafkas() -> None:
    assert [s.value for s in S] == ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort",
                                    "CompleteCommit", "CompleteAbort"]


def test_a_state_record_round_trips_and_an_older_one_loads() -> None:
    t = TxnMeta("app", 5, 2, state=S.ONGOING, partitions=[("orders", 1)], groups=["g"],
                offsets={("g", "orders", 1): 42}, started_ms=10, updated_ms=11)
    doc = t.doc()
    assert doc["state"] == "Ongoing"
    assert t.doc(S.PREPARE_COMMIT)["state"] == "PrepareCommit"
    again = TxnMeta("app", -1, -1)
    again.load(doc)
    assert again.doc() == doc and again.state is S.ONGOING
    # as an older version wrote it: no participants key
    old = {k: v for k, v in doc.items() if k != "participants"} | {"state": "CompleteCommit"}
    loaded = TxnMeta("app", -1, -1)
    loaded.load(old)
    assert loaded.state is S.COMPLETE_COMMIT and loaded.participants == {}
    assert loaded.view().state == "CompleteCommit" and not loaded.view().open


def test_a_transition_in_progress_names_its_target_and_takes_no_second() -> None:
    t = TxnMeta("app", 5, 0, state=S.ONGOING)
    assert not t.busy
    with t.transition(S.PREPARE_COMMIT):
        assert t.busy and t.pending is S.PREPARE_COMMIT
        with pytest.raises(TxnTransitionError), t.transition(S.COMPLETE_ABORT):
            pass  # a second one at once is a bug
        assert t.pending is S.PREPARE_COMMIT
    assert not t.busy and t.pending is None
    with pytest.raises(TxnTransitionError), t.transition(S.COMPLETE_COMMIT):
        pass  # Ongoing cannot complete a commit never decided
    assert t.pending is None
    with pytest.raises(RuntimeError), t.transition(S.COMPLETE_ABORT):  # a failed write
        raise RuntimeError("the store refused it")
    assert t.pending is None and t.state is S.ONGOING  # memory follows the log only
