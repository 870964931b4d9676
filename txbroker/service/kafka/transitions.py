"""What the Kafka coordinators' transition tables share (txn_state.py, group_state.py): the
check of one move against a table, and the error a move the table does not allow raises."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import ClassVar, TypeVar

S = TypeVar("S", bound=enum.Enum)


class TransitionError(RuntimeError):
    """A move the table does not allow: a bug in the caller, never a peer's doing (a request
    out of turn is answered with an error code before anything moves)."""

    #: What moves, for the message (each table's subclass names it).
    what: ClassVar[str] = "state"

    def __init__(self, current: enum.Enum, target: enum.Enum) -> None:
        super().__init__(f"{self.what} cannot move from {current.value} to {target.value}")
        self.current = current
        self.target = target


def checked(table: Mapping[S, frozenset[S]], current: S, target: S,
            error: type[TransitionError]) -> S:
    """``target`` if ``table`` allows ``current`` -> ``target``; else ``error``."""
    if target not in table[current]:
        raise error(current, target)
    return target
