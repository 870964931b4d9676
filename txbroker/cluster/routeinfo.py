"""The name server's tables: which brokers are alive, which groups they form, which topics each
group holds (RocketMQ's ``RouteInfoManager``; the rules are in docs/cluster.md, "Name servers
and membership").

Pure: no sockets, no tasks.  The clock is injected, and a broker's connection is an opaque
``channel`` key the caller hands in with a registration and back when that connection closes,
so every rule here is tested without a network or a wait.

The rules that matter, as RocketMQ applies them:

* Only a master's (broker id 0) registration sets its group's queue data, and only when its
  DataVersion changed or the address is new.  Topics missing from a later registration are
  kept (a deleted topic disappears with the group or the name server's restart).
* A registration whose address is listed under another id of the same group replaces that
  entry: a slave promoted to master (or the reverse) is one broker, not two.  It removes only
  entries that hold its own address, never another broker's.
* An id-0 registration carrying an older master epoch (the body's ``stateVersion``, RocketMQ
  5's field) than the live broker holding id 0 is ignored: a demoted master that has not yet
  heard of its demotion cannot replace its successor.
* A group (brokerName) disappears, with its queue data, only when its last address does; a
  dead master leaves a route listing the group's slaves, which clients still pull from.
* A broker is dropped when its connection closes or when it has not registered for
  ``expiry`` seconds.

Beyond RocketMQ: a dropped broker is remembered as *down* (since when, and why) until it
registers again, for a day at most and 256 brokers at most, so that ``txbroker status`` lists a
dead member of a group as ``down since ...`` instead of forgetting it was ever there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from txbroker.remoting.bodies import (
    MASTER_ID,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    TopicConfigSerializeWrapper,
    TopicRouteData,
)

log = logging.getLogger(__name__)

#: RocketMQ's BROKER_CHANNEL_EXPIRED_TIME: a broker silent this long is dropped.
DEFAULT_BROKER_EXPIRY = 120.0


@dataclass(slots=True)
class BrokerLiveInfo:
    """One registered address: when it last registered, with which table version, over which
    connection, and where its HA listener is."""

    last_update: float
    data_version: DataVersion
    ha_server_addr: str
    channel: Hashable | None = None


#: How long, and for how many brokers, a dropped broker is remembered as down.
DOWN_MEMORY_SECONDS = 24 * 3600.0
DOWN_MEMORY_BROKERS = 256


@dataclass(slots=True)
class DownBroker:
    """A broker the name server dropped: where it was, since when (wall-clock seconds, for
    people) and why."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str
    since: float
    why: str

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "brokerName": self.broker_name,
                "brokerId": self.broker_id, "address": self.address,
                "since": int(self.since * 1000), "why": self.why}


@dataclass(slots=True)
class RegisterResult:
    """What a slave's registration learns: its master's address and HA address (both None
    for a master, or while the group has no live master)."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


@dataclass(slots=True)
class _Group:
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)


class RouteInfoManager:
    """The tables of one name server.  Not thread-safe: one event loop owns it."""

    def __init__(self, *, clock: Callable[[], float], expiry: float = DEFAULT_BROKER_EXPIRY,
                 wall: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self.expiry = expiry
        #: broker address -> why and since when it is down (oldest first)
        self.down: dict[str, DownBroker] = {}
        #: clusterName -> brokerNames
        self.cluster_addr: dict[str, set[str]] = {}
        #: brokerName -> its cluster and {brokerId: address}
        self.broker_addr: dict[str, _Group] = {}
        #: broker address -> liveness
        self.live: dict[str, BrokerLiveInfo] = {}
        #: topic -> {brokerName: QueueData}
        self.topic_queue: dict[str, dict[str, QueueData]] = {}

    # --- changes ------------------------------------------------------------------------
    def register(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int,
                 ha_server_addr: str, wrapper: TopicConfigSerializeWrapper | None,
                 channel: Hashable | None = None) -> RegisterResult:
        """REGISTER_BROKER; see the module docstring for the rules."""
        version = wrapper.data_version if wrapper is not None else DataVersion()
        group = self.broker_addr.get(broker_name)
        if group is not None and broker_id == MASTER_ID and self._older_master(group, broker_addr, version):
            return RegisterResult()
        self.cluster_addr.setdefault(cluster, set()).add(broker_name)
        first = group is None
        if group is None:
            group = self.broker_addr[broker_name] = _Group(cluster)
        for other_id in [i for i, a in group.addrs.items() if a == broker_addr and i != broker_id]:
            del group.addrs[other_id]  # the same broker under a new id: a role switch
        first = group.addrs.get(broker_id) is None or first
        group.addrs[broker_id] = broker_addr
        if wrapper is not None and broker_id == MASTER_ID and (
                first or self.is_topic_config_changed(broker_addr, version)):
            for name, tc in wrapper.topic_config_table.items():
                self.topic_queue.setdefault(name, {})[broker_name] = QueueData(
                    broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm,
                    tc.topic_sys_flag)
        if broker_addr not in self.live:
            log.info("new broker registered: %s %s id %d (cluster %s, HA %s)", broker_name,
                     broker_addr, broker_id, cluster, ha_server_addr)
        self.down.pop(broker_addr, None)
        self.live[broker_addr] = BrokerLiveInfo(self.clock(), version, ha_server_addr, channel)
        result = RegisterResult()
        if broker_id != MASTER_ID:
            master = group.addrs.get(MASTER_ID)
            info = self.live.get(master) if master is not None else None
            if info is not None:
                result.master_addr = master
                result.ha_server_addr = info.ha_server_addr
        return result

    def _older_master(self, group: _Group, broker_addr: str, version: DataVersion) -> bool:
        """Whether an id-0 registration comes from an older master than the live broker that
        holds id 0 now (master epochs, carried as ``stateVersion``): a former master that has
        not yet learned of its demotion must not take its successor's place (RocketMQ 5 ignores
        such a registration the same way)."""
        holder = group.addrs.get(MASTER_ID)
        if holder is None or holder == broker_addr:
            return False
        info = self.live.get(holder)
        if info is None or info.data_version.state_version <= version.state_version:
            return False
        log.warning("ignored a master registration of %s (epoch %d): %s holds id 0 under "
                    "the newer epoch %d", broker_addr, version.state_version, holder,
                    info.data_version.state_version)
        return True

    def unregister(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        """UNREGISTER_BROKER.  The id's entry goes only if it still holds ``broker_addr`` (a
        late unregistration of a former master must not remove its successor)."""
        self.live.pop(broker_addr, None)
        group = self.broker_addr.get(broker_name)
        if group is not None and group.addrs.get(broker_id) == broker_addr:
            self._mark_down(cluster, broker_name, broker_id, broker_addr, "stopped (unregistered)")
            del group.addrs[broker_id]
            if not group.addrs:
                self._remove_group(broker_name)
        log.info("broker unregistered: %s %s id %d (cluster %s)", broker_name, broker_addr,
                 broker_id, cluster)

    def touch(self, broker_addr: str) -> None:
        """Refresh a broker's liveness (an unchanged QUERY_DATA_VERSION counts as a heartbeat)."""
        info = self.live.get(broker_addr)
        if info is not None:
            info.last_update = self.clock()

    def expire(self) -> list[Hashable]:
        """Drop every broker silent for longer than ``expiry``; returns their channels (the
        caller closes them)."""
        now = self.clock()
        stale = [a for a, info in self.live.items() if info.last_update + self.expiry < now]
        channels = []
        for addr in stale:
            info = self.live[addr]
            log.warning("broker %s silent for %.0f s: dropped", addr, now - info.last_update)
            if info.channel is not None:
                channels.append(info.channel)
            self._broker_gone(addr, f"silent for {now - info.last_update:.0f} s")
        return channels

    def on_connection_closed(self, channel: Hashable) -> str | None:
        """The connection a broker registered over closed: drop that broker (RocketMQ's
        ``onChannelDestroy``).  Returns its address, None if no broker used that connection."""
        for addr, info in self.live.items():
            if info.channel is channel:
                log.info("connection of broker %s closed: dropped", addr)
                self._broker_gone(addr, "connection closed")
                return addr
        return None

    def _broker_gone(self, addr: str, why: str) -> None:
        self.live.pop(addr, None)
        for name in list(self.broker_addr):
            group = self.broker_addr[name]
            for broker_id in [i for i, a in group.addrs.items() if a == addr]:
                self._mark_down(group.cluster, name, broker_id, addr, why)
                del group.addrs[broker_id]
            if not group.addrs:
                self._remove_group(name)

    def _mark_down(self, cluster: str, name: str, broker_id: int, addr: str, why: str) -> None:
        self.down.pop(addr, None)  # re-inserted last: the dict stays oldest first
        self.down[addr] = DownBroker(cluster, name, broker_id, addr, self.wall(), why)
        while len(self.down) > DOWN_MEMORY_BROKERS:
            del self.down[next(iter(self.down))]

    def _remove_group(self, broker_name: str) -> None:
        """A group's last address is gone: the group, its cluster entry and its queues go."""
        group = self.broker_addr.pop(broker_name)
        names = self.cluster_addr.get(group.cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.cluster_addr[group.cluster]
        for topic in list(self.topic_queue):
            queues = self.topic_queue[topic]
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queue[topic]
        log.info("broker group %s has no broker left: its routes are removed", broker_name)

    # --- queries ------------------------------------------------------------------------
    def data_version(self, broker_addr: str) -> DataVersion | None:
        info = self.live.get(broker_addr)
        return info.data_version if info is not None else None

    def is_topic_config_changed(self, broker_addr: str, version: DataVersion) -> bool:
        return self.data_version(broker_addr) != version

    def pickup_route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic`` over every group holding it; None when no group does."""
        queues = self.topic_queue.get(topic)
        if not queues:
            return None
        brokers = [BrokerData(self.broker_addr[name].cluster, name,
                              dict(sorted(self.broker_addr[name].addrs.items())))
                   for name in sorted(queues) if name in self.broker_addr]
        if not brokers:
            return None
        return TopicRouteData(queue_datas=[queues[name] for name in sorted(queues)],
                              broker_datas=brokers)

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo({name: BrokerData(g.cluster, name, dict(sorted(g.addrs.items())))
                            for name, g in sorted(self.broker_addr.items())},
                           {c: sorted(names) for c, names in sorted(self.cluster_addr.items())})

    def topic_list(self) -> list[str]:
        return sorted(self.topic_queue)

    def brokers_down(self) -> list[DownBroker]:
        """Brokers dropped in the last day and not registered since, oldest first."""
        horizon = self.wall() - DOWN_MEMORY_SECONDS
        for addr in [a for a, d in self.down.items() if d.since < horizon]:
            del self.down[addr]
        return list(self.down.values())
