"""The consumer group's transition table on its own (no socket, no store), and a group moved
only through it."""

from __future__ import annotations

import pytest
from support.transitions import assert_table

from txbroker.service.kafka.group_record import Group
from txbroker.service.kafka.group_state import (
    TRANSITIONS,
    GroupState,
    GroupTransitionError,
    move,
)

S = GroupState
LEGAL = {
    (S.EMPTY, S.PREPARING), (S.EMPTY, S.DEAD),
    (S.PREPARING, S.COMPLETING), (S.PREPARING, S.EMPTY), (S.PREPARING, S.DEAD),
    (S.COMPLETING, S.STABLE), (S.COMPLETING, S.PREPARING), (S.COMPLETING, S.DEAD),
    (S.STABLE, S.PREPARING), (S.STABLE, S.DEAD),
    (S.DEAD, S.DEAD),
}


def test_the_table_allows_the_legal_moves_only() -> None:
    assert_table(GroupState, LEGAL, TRANSITIONS, move, GroupTransitionError)


def test_the_names_are_kafkas() -> None:
    assert [s.value for s in S] == ["Empty", "PreparingRebalance", "CompletingRebalance",
                                    "Stable", "Dead"]


def test_a_group_moves_through_the_table_only() -> None:
    g = Group("g")
    assert g.state is S.EMPTY
    with pytest.raises(GroupTransitionError):
        g.move_to(S.STABLE)  # a group never becomes Stable without a rebalance
    assert g.state is S.EMPTY
    for step in (S.PREPARING, S.COMPLETING, S.STABLE, S.DEAD):
        g.move_to(step)
        assert g.state is step
    with pytest.raises(GroupTransitionError):
        g.move_to(S.PREPARING)  # Dead is final


def test_a_loaded_group_is_stable_with_members_or_empty() -> None:
    doc = {"group": "g", "generation": 3, "protocol_type": "consumer", "protocol": "range",
           "leader": "m1", "state_since": 1.0,
           "members": [{"id": "m1", "instance": None, "client_id": "c", "client_host": "/h",
                        "session": 10.0, "rebalance": 30.0, "metadata": "", "assignment": ""}]}
    assert Group.from_doc(doc, 5.0).state is S.STABLE
    assert Group.from_doc(doc, 5.0).doc() == doc  # the log's document, unchanged
    assert Group.from_doc({**doc, "members": []}, 5.0).state is S.EMPTY
