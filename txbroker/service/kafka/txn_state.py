"""A Kafka transactional id's state as one enum and a transition table: nothing else (no I/O,
no store).  The coordinator (coordinator.py) writes a state record naming the target state and
moves only through :func:`move`.
::

    EMPTY ----------> EMPTY (InitProducerId: a new epoch) | ONGOING
    ONGOING --------> ONGOING (partitions or groups added) | PREPARE_COMMIT
                      | PREPARE_ABORT (other broker groups hold parts) | COMPLETE_ABORT
    PREPARE_COMMIT -> COMPLETE_COMMIT
    PREPARE_ABORT --> COMPLETE_ABORT
    COMPLETE_* -----> EMPTY (InitProducerId) | ONGOING (the next transaction)

Why a table: with states as strings and the moves spread over if-chains, nothing stopped a
path from writing a state record its current state does not lead to (a second decision over
a decided one); here such a write is a bug and raises before anything is stored.  The values
are what the state records in the log hold (Kafka's names, shown by DescribeTransactions), so
they never change.
"""

from __future__ import annotations

import enum

from txbroker.service.kafka.transitions import TransitionError, checked


class TxnState(enum.Enum):
    #: Members are singletons compared by identity (see PutStatus).
    __hash__ = object.__hash__

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def deciding(self) -> bool:
        """A decision is written and being completed: the id takes no new request."""
        return self is TxnState.PREPARE_COMMIT or self is TxnState.PREPARE_ABORT

    @property
    def open(self) -> bool:
        """A transaction is open or being decided."""
        return self is TxnState.ONGOING or self.deciding

    @property
    def settled(self) -> bool:
        """No transaction open and none being decided: the id may expire."""
        return not self.open

    @property
    def holds_data(self) -> bool:
        """The transaction's batches and offsets are still wanted (staged in memory)."""
        return self is TxnState.ONGOING or self is TxnState.PREPARE_COMMIT


_E, _O, _PC, _PA, _CC, _CA = (TxnState.EMPTY, TxnState.ONGOING, TxnState.PREPARE_COMMIT,
                              TxnState.PREPARE_ABORT, TxnState.COMPLETE_COMMIT,
                              TxnState.COMPLETE_ABORT)

#: state -> the states a state record may move it to.
TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    _E: frozenset({_E, _O}),
    _O: frozenset({_O, _PC, _PA, _CA}),
    _PC: frozenset({_CC}),
    _PA: frozenset({_CA}),
    _CC: frozenset({_E, _O}),
    _CA: frozenset({_E, _O}),
}


class TxnTransitionError(TransitionError):
    """A state record the table does not allow: a bug in the coordinator, never a client's
    doing (a client's out-of-order request is answered with an error code before any write)."""

    what = "kafka transaction"


def move(current: TxnState, target: TxnState) -> TxnState:
    """``target`` if the table allows ``current`` -> ``target``; else TxnTransitionError."""
    return checked(TRANSITIONS, current, target, TxnTransitionError)
