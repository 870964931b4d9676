"""The consumer group's transition table on its own (no socket, no store), and a group moved
only through it."""

from __future__ import annotations

import itertools

import pytest

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


@pytest.mark.parametrize("current, target", sorted(LEGAL, key=lambda p: (p[0].value, p[1].value)))
def test_every_legal_move(current: GroupState, target: GroupState) -> None:
    assert move(current, target) is target


def test_every_other_move_raises() -> None:
    illegal = [(a, b) for a, b in itertools.product(S, S) if (a, b) not in LEGAL]
    assert len(illegal) == len(S) ** 2 - len(LEGAL)
    for current, target in illegal:
        with pytest.raises(GroupTransitionError) as err:
            move(current, target)
        assert (err.value.current, err.value.target) == (current, target)
        assert current.value in str(err.value) and target.value in str(err.value)
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL


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
