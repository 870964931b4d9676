"""The role's transition table on its own: no socket, no store."""

from __future__ import annotations

import itertools

import pytest

from txbroker.cluster.role_state import TRANSITIONS, Role, RoleTransitionError, move
from txbroker.store.results import Fence

LEGAL = {
    (Role.STARTING, Role.SLAVE), (Role.STARTING, Role.PROMOTING), (Role.STARTING, Role.STOPPING),
    (Role.SLAVE, Role.SLAVE), (Role.SLAVE, Role.PROMOTING), (Role.SLAVE, Role.STOPPING),
    (Role.PROMOTING, Role.MASTER), (Role.PROMOTING, Role.SLAVE), (Role.PROMOTING, Role.STOPPING),
    (Role.MASTER, Role.PROMOTING), (Role.MASTER, Role.DEMOTING), (Role.MASTER, Role.STOPPING),
    (Role.DEMOTING, Role.SLAVE), (Role.DEMOTING, Role.STOPPING),
    (Role.STOPPING, Role.STOPPED),
}


@pytest.mark.parametrize("current, target", sorted(LEGAL, key=lambda p: (p[0].value, p[1].value)))
def test_every_legal_move(current: Role, target: Role) -> None:
    assert move(current, target) is target


def test_every_other_move_raises() -> None:
    illegal = [(a, b) for a, b in itertools.product(Role, Role) if (a, b) not in LEGAL]
    assert len(illegal) == len(Role) ** 2 - len(LEGAL)
    for current, target in illegal:
        with pytest.raises(RoleTransitionError) as err:
            move(current, target)
        assert (err.value.current, err.value.target) == (current, target)
        assert current.value in str(err.value) and target.value in str(err.value)
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL


def test_only_a_master_takes_writes_and_each_fence_says_why() -> None:
    assert [r for r in Role if r.fence is None] == [Role.MASTER]
    assert Role.SLAVE.fence is Role.DEMOTING.fence is Fence.SLAVE
    assert Role.STARTING.fence is Fence.STARTING and Role.PROMOTING.fence is Fence.PROMOTING
    assert Role.STOPPING.fence is Role.STOPPED.fence is Fence.STOPPING
    assert "slave" in Fence.SLAVE.text and "lease" in Fence.LEASE_NOT_VALID.text
    # Only a stopping master may still acknowledge what it took before the fence went up.
    assert [f for f in Fence if not f.revokes_acks] == [Fence.STOPPING]
    assert TRANSITIONS[Role.STOPPED] == frozenset()
