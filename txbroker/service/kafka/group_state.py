"""A classic Kafka consumer group's state as one enum and a transition table: nothing else (no
I/O, no clock).  The group coordinator (groups.py) moves a group only through :func:`move`.
::

    EMPTY -----> PREPARING (a member joins) | DEAD
    PREPARING -> COMPLETING (the join phase ends with members) | EMPTY (it ends with none)
                 | DEAD
    COMPLETING > STABLE (the leader's assignment is stored) | PREPARING (a member joins,
                 leaves or lapses, or the assignment was not stored) | DEAD
    STABLE ----> PREPARING | DEAD
    DEAD ------> DEAD (final: the coordinator closed or stopped coordinating)

Kafka's own table (GroupState's valid previous states) is the same.  The values are Kafka's
names, which ListGroups and DescribeGroups answer with."""

from __future__ import annotations

import enum

from txbroker.service.kafka.transitions import TransitionError, checked


class GroupState(enum.Enum):
    #: Members are singletons compared by identity (see PutStatus).
    __hash__ = object.__hash__

    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_E, _P, _C, _S, _D = (GroupState.EMPTY, GroupState.PREPARING, GroupState.COMPLETING,
                      GroupState.STABLE, GroupState.DEAD)

#: state -> the states a group may move to.
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    _E: frozenset({_P, _D}),
    _P: frozenset({_C, _E, _D}),
    _C: frozenset({_S, _P, _D}),
    _S: frozenset({_P, _D}),
    _D: frozenset({_D}),
}


class GroupTransitionError(TransitionError):
    """A group move the table does not allow: a bug in the coordinator, never a client's doing
    (a request out of turn is answered with an error code and moves nothing)."""

    what = "kafka group"


def move(current: GroupState, target: GroupState) -> GroupState:
    """``target`` if the table allows ``current`` -> ``target``; else GroupTransitionError."""
    return checked(TRANSITIONS, current, target, GroupTransitionError)
