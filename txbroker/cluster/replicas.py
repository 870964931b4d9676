"""The controller's state machine: per broker group, its replicas, master, master epoch and
in-sync replica set (RocketMQ 5.x ``ReplicasInfoManager`` + ``DefaultBrokerHeartbeatManager``
+ ``DefaultElectPolicy``, without Raft; docs/cluster.md "Controller and failover").

Pure: no I/O and no wall clock.  Time comes from the injected ``clock`` (seconds, any origin),
so the lease rules are tested by moving a fake clock.  The controller process
(``txbroker/controller.py``) owns one :class:`ReplicasInfo`, persists :meth:`to_json` after
every change and pushes role changes to the brokers.

Why the two halves are kept apart: the group table (who the replicas are, master, epochs, set)
is durable, because a controller that forgot an epoch could hand out one already used and let
two masters write under it; heartbeats (time, epoch, offsets) are not, because a time taken by
a previous process means nothing to this one.  A loaded state therefore gives every replica one
lease of grace from the moment it is loaded (as RocketMQ's heartbeat manager starts empty and
its brokers re-heartbeat within a period).

Errors are :class:`ControllerError` subclasses carrying the controller response code; where
RocketMQ answers an error with the group's current master (MASTER_STILL_EXIST, a fenced
heartbeat), ``view`` carries it so the answer can say who the master is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.errors import Refusal

#: Lower is preferred, as RocketMQ's ``electionPriority``; a broker that sends none ranks
#: after every broker that does, then by broker id.
DEFAULT_PRIORITY = 1 << 31

STATE_VERSION = 1


# --- errors ------------------------------------------------------------------------------------


class ControllerError(Refusal):
    """A controller request refused with one of RocketMQ's controller codes (2000-2012)."""

    CODE = ResponseCode.SYSTEM_ERROR

    def __init__(self, remark: str, view: GroupView | None = None) -> None:
        super().__init__(self.CODE, remark)
        self.view = view


class FencedMasterEpoch(ControllerError):
    CODE = ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH


class FencedSyncStateSetEpoch(ControllerError):
    CODE = ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH


class InvalidMaster(ControllerError):
    CODE = ResponseCode.CONTROLLER_INVALID_MASTER


class InvalidReplicas(ControllerError):
    CODE = ResponseCode.CONTROLLER_INVALID_REPLICAS


class MasterNotAvailable(ControllerError):
    CODE = ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE


class BrokerNotAlive(ControllerError):
    CODE = ResponseCode.CONTROLLER_BROKER_NOT_ALIVE


class MasterStillExist(ControllerError):
    CODE = ResponseCode.CONTROLLER_MASTER_STILL_EXIST


class ElectMasterFailed(ControllerError):
    CODE = ResponseCode.CONTROLLER_ELECT_MASTER_FAILED


class BrokerIdInvalid(ControllerError):
    """(broker name, id) is held by another address that is alive: two processes started as
    the same broker would otherwise overwrite each other and both act as it."""

    CODE = ResponseCode.CONTROLLER_BROKER_ID_INVALID


# --- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupView:
    """What a broker is told about its group: every controller answer carries it."""

    cluster_name: str
    broker_name: str
    master_broker_id: int | None
    master_address: str | None
    master_ha_address: str | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int


@dataclass(slots=True)
class Heartbeat:
    """The last heartbeat of one replica (memory only)."""

    time: float
    epoch: int = 0
    max_offset: int = 0
    confirm_offset: int = 0
    #: Seconds this broker asked to be judged by (heartbeatTimeoutMills); None = the lease.
    timeout: float | None = None
    priority: int = DEFAULT_PRIORITY


@dataclass(slots=True)
class _Group:
    """One broker group's durable state."""

    cluster_name: str
    broker_name: str
    #: broker id -> (address, HA address)
    replicas: dict[int, tuple[str, str]] = field(default_factory=dict)
    master_broker_id: int | None = None
    master_epoch: int = 0
    sync_state_set: set[int] = field(default_factory=set)
    sync_state_set_epoch: int = 0

    def view(self) -> GroupView:
        addr, ha = self.replicas.get(self.master_broker_id, (None, None)) \
            if self.master_broker_id is not None else (None, None)
        return GroupView(self.cluster_name, self.broker_name, self.master_broker_id, addr, ha,
                         self.master_epoch, frozenset(self.sync_state_set),
                         self.sync_state_set_epoch)

    def to_json(self) -> dict[str, Any]:
        return {
            "clusterName": self.cluster_name,
            "brokerName": self.broker_name,
            "replicas": {str(i): {"address": a, "haAddress": h}
                         for i, (a, h) in sorted(self.replicas.items())},
            "masterBrokerId": self.master_broker_id,
            "masterEpoch": self.master_epoch,
            "syncStateSet": sorted(self.sync_state_set),
            "syncStateSetEpoch": self.sync_state_set_epoch,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> _Group:
        master = doc["masterBrokerId"]
        return cls(
            cluster_name=str(doc["clusterName"]),
            broker_name=str(doc["brokerName"]),
            replicas={int(i): (str(r["address"]), str(r["haAddress"]))
                      for i, r in doc["replicas"].items()},
            master_broker_id=None if master is None else int(master),
            master_epoch=int(doc["masterEpoch"]),
            sync_state_set={int(i) for i in doc["syncStateSet"]},
            sync_state_set_epoch=int(doc["syncStateSetEpoch"]),
        )


# --- the state machine -------------------------------------------------------------------------


class ReplicasInfo:
    """Every group's replicas, master, epochs and in-sync set, and the replicas' heartbeats.

    ``lease`` (seconds): a replica is alive while its last heartbeat (or registration) is
    younger than ``max(lease, the heartbeatTimeoutMills it sent)``.  Groups are keyed by broker
    name, as in RocketMQ (ALTER_SYNC_STATE_SET and GET_REPLICA_INFO name no cluster).
    """

    def __init__(self, *, lease: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        if lease <= 0:
            raise ValueError(f"lease must be positive, got {lease}")
        self.lease = lease
        self.clock = clock
        self._groups: dict[str, _Group] = {}
        self._beats: dict[tuple[str, int], Heartbeat] = {}

    # --- reads ---------------------------------------------------------------------------
    def groups(self) -> list[str]:
        return sorted(self._groups)

    def replica_info(self, broker_name: str) -> GroupView:
        """GET_REPLICA_INFO: the group's master and set; INVALID_REPLICAS for an unknown group."""
        return self._group(broker_name).view()

    def replicas(self, broker_name: str) -> dict[int, tuple[str, str]]:
        """broker id -> (address, HA address) of a group's registered replicas."""
        return dict(self._group(broker_name).replicas)

    def heartbeat_of(self, broker_name: str, broker_id: int) -> Heartbeat | None:
        return self._beats.get((broker_name, broker_id))

    def is_alive(self, broker_name: str, broker_id: int) -> bool:
        beat = self._beats.get((broker_name, broker_id))
        if beat is None:
            return False
        lease = self.lease if beat.timeout is None else max(self.lease, beat.timeout)
        return self.clock() - beat.time < lease

    # --- requests ------------------------------------------------------------------------
    def register(self, cluster_name: str, broker_name: str, broker_id: int, address: str,
                 ha_address: str) -> GroupView:
        """CONTROLLER_REGISTER_BROKER: add (or re-address) a replica; it counts as alive from
        now.  The answer names the current master: a returning old master learns from it that
        it must follow someone else.  A group is created by its first registration.

        An id held by another address whose heartbeats are still within the lease is refused
        (:class:`BrokerIdInvalid`); the same address (a restart) is always accepted, and so is
        a new address once the old holder's lease ran out (the broker moved)."""
        if broker_id < 0:
            raise InvalidReplicas(f"broker {broker_name}: broker id {broker_id} must be >= 0")
        group = self._groups.get(broker_name)
        if group is None:
            group = self._groups[broker_name] = _Group(cluster_name, broker_name)
        elif group.cluster_name != cluster_name:
            raise InvalidReplicas(f"broker {broker_name} is registered in cluster "
                                  f"{group.cluster_name}, not {cluster_name}")
        held = group.replicas.get(broker_id)
        if held is not None and held[0] != address and self.is_alive(broker_name, broker_id):
            raise BrokerIdInvalid(f"broker {broker_name} id {broker_id} is held by {held[0]}, "
                                  f"which is alive")
        group.replicas[broker_id] = (address, ha_address)
        self._touch(broker_name, broker_id)
        return group.view()

    def heartbeat(self, broker_name: str, broker_id: int, *, epoch: int = 0, max_offset: int = 0,
                  confirm_offset: int = 0, timeout: float | None = None,
                  priority: int | None = None, address: str | None = None) -> GroupView:
        """BROKER_HEARTBEAT: record liveness and the replica's epoch and offsets.

        Recorded even when fenced (the broker is alive); an ``epoch`` older than the group's
        master epoch then raises :class:`FencedMasterEpoch` carrying the current view, which is
        how an old master learns it is no longer master.  A heartbeat from another
        ``address`` than the one registered under this id renews nothing: refused
        (:class:`BrokerIdInvalid`) while the holder is alive, else INVALID_REPLICAS (register
        again to take the id over).
        """
        group = self._registered(broker_name, broker_id)
        held = group.replicas[broker_id][0]
        if address and address != held:
            if self.is_alive(broker_name, broker_id):
                raise BrokerIdInvalid(f"broker {broker_name} id {broker_id} is held by {held}, "
                                      f"which is alive")
            raise InvalidReplicas(f"broker {broker_name} id {broker_id} is registered at "
                                  f"{held}, not {address}; register again")
        self._touch(broker_name, broker_id, epoch=epoch, max_offset=max_offset,
                    confirm_offset=confirm_offset, timeout=timeout,
                    priority=DEFAULT_PRIORITY if priority is None else priority)
        view = group.view()
        if epoch < group.master_epoch:
            raise FencedMasterEpoch(f"broker {broker_name} id {broker_id}: epoch {epoch} is older "
                                    f"than the group's master epoch {group.master_epoch}", view)
        return view

    def elect(self, broker_name: str, broker_id: int, *, designate: bool = False) -> GroupView:
        """CONTROLLER_ELECT_MASTER from a broker (or, with ``designate``, an operator).

        The first election of a group (master epoch 0) is won by the asking broker: brokers
        configured as master ask at start-up, so the configured master starts as master.
        Later, with a live master in place, nothing changes (MASTER_STILL_EXIST); without one
        the election rules of :meth:`_elect` apply, and a failed election is
        ELECT_MASTER_FAILED.  ``designate`` makes ``broker_id`` the master if it is alive and
        in the in-sync set, and only once the master's lease has run out: promoting it while
        the master may still acknowledge writes would make two masters.  (A safe hand-over
        from a live master is etcd mode's switch-over, docs/cluster.md.)
        """
        group = self._registered(broker_name, broker_id)
        if group.master_epoch == 0:
            self._promote(group, broker_id)
            return group.view()
        master = group.master_broker_id
        if designate:
            if master == broker_id:
                raise MasterStillExist(f"broker {broker_name}: id {broker_id} is already master",
                                       group.view())
            if master is not None and self.is_alive(broker_name, master):
                raise MasterStillExist(f"broker {broker_name}: master id {master} is alive; a "
                                       f"designated election waits until its lease has run "
                                       f"out (stop it first), so two masters never write",
                                       group.view())
            if broker_id not in group.sync_state_set or not self.is_alive(broker_name, broker_id):
                raise ElectMasterFailed(f"broker {broker_name}: id {broker_id} cannot be "
                                        f"designated: it must be alive and in the in-sync set "
                                        f"{sorted(group.sync_state_set)}", group.view())
            self._promote(group, broker_id)
            return group.view()
        if master is not None and self.is_alive(broker_name, master):
            raise MasterStillExist(f"broker {broker_name}: master id {master} is alive",
                                   group.view())
        new = self._candidate(group)
        if new is None:
            raise ElectMasterFailed(f"broker {broker_name}: no alive member of the in-sync set "
                                    f"{sorted(group.sync_state_set)} to elect", group.view())
        self._promote(group, new)
        return group.view()

    def alter_sync_state_set(self, broker_name: str, master_broker_id: int, master_epoch: int,
                             new_set: Iterable[int], sync_state_set_epoch: int) -> int:
        """CONTROLLER_ALTER_SYNC_STATE_SET from the master: the new set's epoch.

        Fenced by the master epoch (an old master's request) and by the set epoch (a request
        built on a set that has changed since); the sender must be the master, every member
        registered and alive, and the master itself in the set.
        """
        group = self._group(broker_name)
        members = set(new_set)
        if master_epoch != group.master_epoch:
            raise FencedMasterEpoch(f"broker {broker_name}: master epoch {master_epoch} is not "
                                    f"the current {group.master_epoch}", group.view())
        if group.master_broker_id is None or group.master_broker_id != master_broker_id:
            raise InvalidMaster(f"broker {broker_name}: id {master_broker_id} is not the master "
                                f"(master: {group.master_broker_id})", group.view())
        if sync_state_set_epoch != group.sync_state_set_epoch:
            raise FencedSyncStateSetEpoch(f"broker {broker_name}: sync state set epoch "
                                          f"{sync_state_set_epoch} is not the current "
                                          f"{group.sync_state_set_epoch}", group.view())
        for member in sorted(members):
            if member not in group.replicas:
                raise InvalidReplicas(f"broker {broker_name}: id {member} is not registered")
            if not self.is_alive(broker_name, member):
                raise BrokerNotAlive(f"broker {broker_name}: id {member} is not alive")
        if group.master_broker_id not in members:
            raise InvalidReplicas(f"broker {broker_name}: the sync state set "
                                  f"{sorted(members)} must contain the master "
                                  f"{group.master_broker_id}")
        group.sync_state_set = members
        group.sync_state_set_epoch += 1
        return group.sync_state_set_epoch

    # --- the controller's own elections --------------------------------------------------
    def scan(self) -> list[GroupView]:
        """The periodic check: a group whose master's lease expired gets an election when a
        live in-sync member can win it.  Returns the groups whose master changed.

        With no candidate, nothing changes: the master keeps its id and epoch (RocketMQ
        clears it and moves the epoch; docs/cluster.md says why we do not).  Nobody else
        could have been elected, so the silent master, once its heartbeats reach the
        controller again, simply renews its lease and carries on, and a controller cut off
        from every broker causes no change of master at all when the cut heals.  A group
        without a master (a state written by an older version) elects the first in-sync
        member that is alive.
        """
        changed = []
        for name in sorted(self._groups):
            group = self._groups[name]
            if group.master_epoch == 0:
                continue  # never elected: the configured master asks for the first election
            master = group.master_broker_id
            if master is not None and self.is_alive(name, master):
                continue
            new = self._candidate(group)
            if new is None:
                continue
            self._promote(group, new)
            changed.append(group.view())
        return changed

    # --- persistence ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The durable part (groups), JSON-ready; heartbeats are left out (module docstring)."""
        return {"version": STATE_VERSION,
                "groups": [self._groups[name].to_json() for name in sorted(self._groups)]}

    @classmethod
    def from_json(cls, doc: dict[str, Any], *, lease: float = 3.0,
                  clock: Callable[[], float] = time.monotonic) -> ReplicasInfo:
        """A state loaded from :meth:`to_json`'s output; every registered replica gets one
        lease of grace from now.  Raises ValueError naming what is wrong."""
        state = cls(lease=lease, clock=clock)
        state.restore(doc)
        return state

    def restore(self, doc: dict[str, Any]) -> None:
        """Replace the groups by ``doc`` (the output of :meth:`to_json`); heartbeats already
        recorded are kept, replicas without one get a lease of grace from now."""
        try:
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            groups = {g.broker_name: g for g in map(_Group.from_json, doc["groups"])}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed controller state: {exc!r}") from None
        self._groups = groups
        now = self.clock()
        for name, group in groups.items():
            for broker_id in group.replicas:
                self._beats.setdefault((name, broker_id), Heartbeat(now))

    # --- internals -----------------------------------------------------------------------
    def _group(self, broker_name: str) -> _Group:
        group = self._groups.get(broker_name)
        if group is None:
            raise InvalidReplicas(f"broker {broker_name} is not registered with this controller")
        return group

    def _registered(self, broker_name: str, broker_id: int) -> _Group:
        group = self._group(broker_name)
        if broker_id not in group.replicas:
            raise InvalidReplicas(f"broker {broker_name} id {broker_id} is not registered; "
                                  f"send CONTROLLER_REGISTER_BROKER first")
        return group

    def _touch(self, broker_name: str, broker_id: int, **values: Any) -> None:
        beat = self._beats.get((broker_name, broker_id))
        if beat is None:
            beat = self._beats[(broker_name, broker_id)] = Heartbeat(self.clock())
        beat.time = self.clock()
        for key, value in values.items():
            setattr(beat, key, value)

    def _candidate(self, group: _Group) -> int | None:
        """DefaultElectPolicy: alive members of the in-sync set, best first by (heartbeat epoch
        desc, max offset desc, election priority asc, broker id asc); None when there is none.
        An unclean election (a replica outside the set) is never made: it could lose
        acknowledged writes."""
        name = group.broker_name
        alive = [i for i in group.sync_state_set
                 if i in group.replicas and self.is_alive(name, i)]
        if not alive:
            return None

        def rank(broker_id: int) -> tuple[int, int, int, int]:
            beat = self._beats[(name, broker_id)]
            return (-beat.epoch, -beat.max_offset, beat.priority, broker_id)
        return min(alive, key=rank)

    def _promote(self, group: _Group, broker_id: int) -> None:
        group.master_broker_id = broker_id
        group.master_epoch += 1
        group.sync_state_set = {broker_id}
        group.sync_state_set_epoch += 1
