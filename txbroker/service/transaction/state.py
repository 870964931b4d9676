"""The half-message state machine: a transition table and nothing else (no I/O, no clock).

Every half message is in exactly one state::

    PENDING --commit--> COMMITTED        (final)
    PENDING --rollback--> ROLLED_BACK    (final)
    PENDING --discard--> DISCARDED       (checked transaction_check_max times, no answer)
    DISCARDED --resume--> PENDING        (operator: check it again, counts reset)
    DISCARDED --commit/rollback--> ...   (operator only: resolving a hanging half by hand)

Why a table: RocketMQ lets a second commit append a second message (apache/rocketmq #8158,
#10199) because nothing remembers that a half was already decided.  Here every decision is
looked up first, with three possible outcomes:

* ``APPLY`` — the transition is legal; the caller writes the records and moves the state.
* ``DUPLICATE`` — the half is already in the state this decision leads to (a retried commit,
  a check answer racing the producer's own commit): answer success, write nothing.
* ``CONFLICT`` — the decision contradicts the recorded one (rollback after commit, commit after
  rollback, a producer deciding a discarded half): refuse with a clear error, change nothing.
"""

from __future__ import annotations

import enum

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.errors import Refusal


class HalfState(enum.Enum):
    #: Members are singletons compared by identity, so the identity hash will do (Enum's own
    #: hashes the name in Python, a measurable share of a transaction's dict lookups).
    __hash__ = object.__hash__

    PENDING = "pending"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    DISCARDED = "discarded"

    @property
    def final(self) -> bool:
        """No producer decision can move a half out of these states."""
        return self in (HalfState.COMMITTED, HalfState.ROLLED_BACK)


class Decision(enum.Enum):
    #: Members are singletons compared by identity, so the identity hash will do (Enum's own
    #: hashes the name in Python, a measurable share of a transaction's dict lookups).
    __hash__ = object.__hash__

    COMMIT = "commit"
    ROLLBACK = "rollback"
    #: The check service gave up after transaction_check_max checks.
    DISCARD = "discard"
    #: An operator asks for a discarded half to be checked again.
    RESUME = "resume"


class Outcome(enum.Enum):
    #: Members are singletons compared by identity, so the identity hash will do (Enum's own
    #: hashes the name in Python, a measurable share of a transaction's dict lookups).
    __hash__ = object.__hash__

    APPLY = "apply"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


_P, _C, _R, _D = HalfState.PENDING, HalfState.COMMITTED, HalfState.ROLLED_BACK, HalfState.DISCARDED

#: (state, decision) -> state after the decision, for decisions anyone may make.
TRANSITIONS: dict[tuple[HalfState, Decision], HalfState] = {
    (_P, Decision.COMMIT): _C,
    (_P, Decision.ROLLBACK): _R,
    (_P, Decision.DISCARD): _D,
    (_D, Decision.RESUME): _P,
}

#: Extra transitions only an operator may make: deciding a half the check service gave up on.
OPERATOR_TRANSITIONS: dict[tuple[HalfState, Decision], HalfState] = {
    (_D, Decision.COMMIT): _C,
    (_D, Decision.ROLLBACK): _R,
}

#: (state, decision) pairs that repeat what already happened.
DUPLICATES: frozenset[tuple[HalfState, Decision]] = frozenset({
    (_C, Decision.COMMIT),
    (_R, Decision.ROLLBACK),
    (_D, Decision.DISCARD),
    (_P, Decision.RESUME),
})


def decide(state: HalfState, decision: Decision, *, operator: bool = False) -> tuple[Outcome, HalfState]:
    """The outcome of ``decision`` on a half in ``state`` and the state it leaves behind.

    A DUPLICATE or CONFLICT leaves the state unchanged.
    """
    target = TRANSITIONS.get((state, decision))
    if target is None and operator:
        target = OPERATOR_TRANSITIONS.get((state, decision))
    if target is not None:
        return Outcome.APPLY, target
    if (state, decision) in DUPLICATES:
        return Outcome.DUPLICATE, state
    return Outcome.CONFLICT, state


class TransactionError(Refusal):
    """A transactional request the broker refuses: a :class:`Refusal`, so the transport answers
    it with ``code`` and ``remark`` like every other refusal."""


class ConflictError(TransactionError):
    """A decision that contradicts the half's recorded state (never applied).

    Answered with RocketMQ's TRANSACTION_FAILED (4), for a producer's END_TRANSACTION and an
    operator's decision alike; the remark reads ``transaction <id> is already committed;
    rollback refused``.
    """

    def __init__(self, state: HalfState, decision: Decision, half: str) -> None:
        super().__init__(ResponseCode.TRANSACTION_FAILED,
                         f"transaction {half} is already {state.value.replace('_', ' ')}; "
                         f"{decision.value} refused")
        self.state = state
        self.decision = decision


class UnknownTransactionError(TransactionError):
    """An operator request naming no half this broker knows: QUERY_NOT_FOUND, as RocketMQ
    answers a lookup that finds nothing (neither pending nor in the decision history)."""

    def __init__(self, txn_id: str) -> None:
        super().__init__(ResponseCode.QUERY_NOT_FOUND, f"no transaction {txn_id}")
        self.txn_id = txn_id
