"""The check every transition-table test makes: the table allows exactly the legal moves, and
every other move raises the table's error naming both states."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Mapping

import pytest


def assert_table(states: type[enum.Enum], legal: set[tuple], table: Mapping,
                 move: Callable, error: type[Exception]) -> None:
    assert {(a, b) for a, targets in table.items() for b in targets} == legal
    for current, target in legal:
        assert move(current, target) is target
    illegal = [(a, b) for a, b in itertools.product(states, states) if (a, b) not in legal]
    assert len(illegal) == len(states) ** 2 - len(legal)
    for current, target in illegal:
        with pytest.raises(error) as err:
            move(current, target)
        assert (err.value.current, err.value.target) == (current, target)
        assert current.value in str(err.value) and target.value in str(err.value)
