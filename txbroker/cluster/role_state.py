"""A clustered broker's role as one state and a transition table: nothing else (no I/O, no
clock, no store).  :class:`~txbroker.cluster.roles.Roles` drives it; this module only says which
moves are legal and which fence each state puts on the store.

::

    STARTING --> SLAVE | PROMOTING
    SLAVE ----> SLAVE (another master or epoch) | PROMOTING
    PROMOTING -> MASTER | SLAVE (refused: the log holds a newer epoch; demoted meanwhile)
    MASTER ---> PROMOTING (named again under a newer epoch) | DEMOTING
    DEMOTING --> SLAVE
    any of the above --> STOPPING --> STOPPED (final)

Why a table: a role kept as a boolean plus optional parts lets a half-done switch look like a
finished one (a master whose fence is lifted before its transaction state is recovered, a
stopping broker that still acknowledges).  Here every switch names its state first, and the
state alone decides the fence (:attr:`Role.fence`): only MASTER takes client writes, and then
only while its lease holds (the roles' write gate adds that).
"""

from __future__ import annotations

import enum

from txbroker.store.results import Fence


class Role(enum.Enum):
    STARTING = "starting"
    SLAVE = "slave"
    PROMOTING = "promoting"
    MASTER = "master"
    DEMOTING = "demoting"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def fence(self) -> Fence | None:
        """The fence this state puts on client writes (None: MASTER, lease permitting)."""
        return _FENCES[self]

    @property
    def serving(self) -> bool:
        """Whether this state runs a master's services (HA for slaves, the in-sync set)."""
        return self in (Role.MASTER, Role.PROMOTING)


_FENCES: dict[Role, Fence | None] = {
    Role.STARTING: Fence.STARTING,
    Role.SLAVE: Fence.SLAVE,
    Role.PROMOTING: Fence.PROMOTING,
    Role.MASTER: None,
    Role.DEMOTING: Fence.SLAVE,
    Role.STOPPING: Fence.STOPPING,
    Role.STOPPED: Fence.STOPPING,
}

_S, _SL, _P, _M, _D, _X, _XX = (Role.STARTING, Role.SLAVE, Role.PROMOTING, Role.MASTER,
                                Role.DEMOTING, Role.STOPPING, Role.STOPPED)

#: state -> the states it may move to.
TRANSITIONS: dict[Role, frozenset[Role]] = {
    _S: frozenset({_SL, _P, _X}),
    _SL: frozenset({_SL, _P, _X}),
    _P: frozenset({_M, _SL, _X}),
    _M: frozenset({_P, _D, _X}),
    _D: frozenset({_SL, _X}),
    _X: frozenset({_XX}),
    _XX: frozenset(),
}


class RoleTransitionError(RuntimeError):
    """A role switch the table does not allow: a bug in the caller, never a peer's doing."""

    def __init__(self, current: Role, target: Role) -> None:
        super().__init__(f"role cannot move from {current.value} to {target.value}")
        self.current = current
        self.target = target


def move(current: Role, target: Role) -> Role:
    """``target`` if the table allows ``current`` -> ``target``; else RoleTransitionError."""
    if target not in TRANSITIONS[current]:
        raise RoleTransitionError(current, target)
    return target
