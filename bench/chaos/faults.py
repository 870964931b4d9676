"""A cluster of real processes, one network namespace per node, and the faults injected on it.

Nodes (:mod:`txbroker.bench.chaos.netns` gives each its namespace and address): ``ctl`` (one
``txbroker controller``) or, with :attr:`ClusterSettings.etcd`, ``e1``/``e2``/``e3`` (a
three-member etcd, :class:`NsEtcd`: each member a real ``etcd`` in its own namespace, on its
own address), ``ns1`` and ``ns2`` (two ``txbroker namesrv``), ``a0``/``a1`` (group
``broker-a``, SYNC_MASTER, cluster ``SyncCluster``), ``b0``/``b1`` (group ``broker-b``,
ASYNC_MASTER, cluster ``AsyncCluster``) and ``cli`` (the load and the checker, which enter it
with ``setns``).  Every node is started as ``ip netns exec <ns> python -P -m txbroker ...``,
binds and advertises its own namespace address on fixed ports (each namespace has its own
port space), so a restarted broker comes back at the same address.

Faults: cuts between any two nodes (:class:`~txbroker.bench.chaos.netns.Network`), each proved
silent before it counts; pauses (SIGSTOP / SIGCONT: sockets stay open, nothing is answered);
SIGKILL; the same for an etcd member (:class:`NsEtcd` kills, pauses and restarts members).
Each group's master is whichever broker the controller names now or, on etcd, whichever holds
the group's ``leader`` key (:meth:`NsCluster.masters` reads the group's keys, linearizable).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from txbroker.bench.chaos.cluster import ServiceProcess, etcd_range_http, replica_info
from txbroker.bench.chaos.driver import broker_settings
from txbroker.bench.chaos.lifeline import spawn
from txbroker.bench.chaos.netns import Network, Node
from txbroker.bench.chaos.process import BrokerProcess
from txbroker.cluster.controller_link import ControllerError, MasterInfo
from txbroker.cluster.etcd import KV
from txbroker.cluster.leadership import GroupKeys, GroupState
from txbroker.cluster.local_etcd import LocalEtcd, Member, etcd_binary

BROKER_PORT, HA_PORT, NAMESRV_PORT, CONTROLLER_PORT = 10911, 10912, 9876, 9878
#: The Kafka listener of every broker when :attr:`ClusterSettings.kafka` is on.
KAFKA_PORT = 9092
#: With Kafka on, both groups join one cluster: a Kafka view spans the groups of its broker's
#: cluster only (docs/kafka.md, "Kafka on a cluster").
KAFKA_CLUSTER = "KafkaCluster"
#: etcd's client and peer ports (each member has a namespace, hence a port space, of its own).
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
SERVICES = ("ctl", "ns1", "ns2")
#: The etcd members' nodes (member ``i`` on ``ETCD_NODES[i]``).
ETCD_NODES = ("e1", "e2", "e3")
ETCD_SERVICES = (*ETCD_NODES, "ns1", "ns2")
CLIENT = "cli"


@dataclass(frozen=True)
class GroupSpec:
    name: str
    role: str
    cluster: str
    nodes: tuple[str, str]  # broker ids 0 and 1
    #: The group's Kafka node id (the same on both replicas, so it survives a failover).
    kafka_node_id: int


GROUPS = (GroupSpec("broker-a", "SYNC_MASTER", "SyncCluster", ("a0", "a1"), 1),
          GroupSpec("broker-b", "ASYNC_MASTER", "AsyncCluster", ("b0", "b1"), 2))
NODES = [*SERVICES, *(n for g in GROUPS for n in g.nodes), CLIENT]
ETCD_CLUSTER_NODES = [*ETCD_SERVICES, *(n for g in GROUPS for n in g.nodes), CLIENT]


def services_for(etcd: bool) -> tuple[str, ...]:
    """The control plane's nodes and the name servers: what a cut-off master loses."""
    return ETCD_SERVICES if etcd else SERVICES


def nodes_for(etcd: bool) -> list[str]:
    """Every node of the cluster, controller mode or etcd mode."""
    return ETCD_CLUSTER_NODES if etcd else NODES


@dataclass
class NsMember(Member):
    """An etcd member on its node's address (client and peer ports fixed: the port space is
    the namespace's own)."""

    node: Node | None = None

    @property
    def endpoint(self) -> str:
        assert self.node is not None
        return f"{self.node.addr}:{self.client_port}"


class NsEtcd(LocalEtcd):
    """:class:`LocalEtcd` with each member in its own namespace, listening on its node's
    address, started as ``ip netns exec <ns> etcd ...`` (the pid is etcd's own: SIGKILL,
    SIGSTOP and SIGCONT reach it) and dying with this process (``lifeline.py``).  Health and
    leader checks are HTTP calls to the members' addresses: call them from a thread that stands
    in the client namespace (``asyncio.to_thread`` from the event loop does)."""

    def __init__(self, root: Path, nodes: list[Node]) -> None:
        self._nodes = nodes
        super().__init__(root, size=len(nodes))

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.members = [NsMember(f"etcd{i}", ETCD_CLIENT_PORT, ETCD_PEER_PORT, self.root / f"etcd{i}",
                                 self.root / f"etcd{i}.log", node=node)
                        for i, node in enumerate(self._nodes)]

    def _argv(self, m: Member) -> list[str]:
        assert isinstance(m, NsMember) and m.node is not None
        peer = {x.name: f"http://{x.node.addr}:{x.peer_port}" for x in self.members
                if isinstance(x, NsMember) and x.node is not None}
        state = "existing" if (m.data_dir / "member").exists() else "new"
        client_url = f"http://{m.node.addr}:{m.client_port}"
        return m.node.exec_argv([
            etcd_binary(), "--name", m.name, "--data-dir", str(m.data_dir),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer[m.name], "--initial-advertise-peer-urls", peer[m.name],
            "--initial-cluster", ",".join(f"{k}={v}" for k, v in peer.items()),
            "--initial-cluster-state", state,
            "--initial-cluster-token", f"txbroker-{self.root.parent.name}",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms), "--log-level", "warn"])

    def start_member(self, i: int, wait: bool = True) -> None:
        m = self.members[i]
        if m.running:
            return
        m.data_dir.mkdir(parents=True, exist_ok=True)
        with open(m.log_path, "ab") as log:
            m.process = spawn(self._argv(m), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
        m.paused = False
        if wait:
            self.wait_healthy([i])

    def node_of(self, i: int) -> str:
        node = self.members[i].node  # type: ignore[attr-defined]
        assert node is not None
        return node.name

    def restore(self) -> None:
        """Every member running and unpaused again (after a fault, whatever it did)."""
        for i, m in enumerate(self.members):
            if m.paused:
                with contextlib.suppress(ProcessLookupError):
                    self.resume(i)
            if not m.running:
                self.start_member(i, wait=False)


class NsBrokerProcess(BrokerProcess):
    """A broker started inside its node's namespace."""

    def __init__(self, node: Node, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.node = node

    def argv(self) -> list[str]:
        return self.node.exec_argv(super().argv())


@dataclass(frozen=True)
class ClusterSettings:
    lease: float = 2.0
    heartbeat_interval: float = 0.3
    register_interval: float = 1.0
    slave_timeout: float = 1.0
    #: Open every broker's Kafka listener on :data:`KAFKA_PORT` (node id per group), with
    #: group and transaction timings short enough for runs of seconds.
    kafka: bool = False
    #: Elect on a three-member etcd (nodes ``e1``-``e3``) instead of a controller; the etcd
    #: lease is ``lease`` rounded up to whole seconds, at least 2.
    etcd: bool = False

    @property
    def etcd_lease(self) -> int:
        return max(2, math.ceil(self.lease))


def kafka_settings(group: GroupSpec) -> dict[str, object]:
    """What a broker of ``group`` adds to serve Kafka clients in the fault runs."""
    return {"cluster_name": KAFKA_CLUSTER, "kafka_port": KAFKA_PORT,
            "kafka_node_id": group.kafka_node_id,
            "kafka_cluster_refresh_interval": 0.3, "kafka_transaction_scan_interval": 0.2,
            "kafka_group_initial_rebalance_delay": 0.2, "kafka_group_min_session_timeout": 1.0}


class NsCluster:
    """The processes of the cluster; ``net`` must be up.  Event-loop side: call the async
    helpers from the thread that entered the client namespace."""

    def __init__(self, net: Network, root: Path, settings: ClusterSettings = ClusterSettings()) -> None:
        self.net = net
        self.root = root
        self.settings = settings
        root.mkdir(parents=True, exist_ok=True)
        self.services = services_for(settings.etcd)
        self.nodes = nodes_for(settings.etcd)
        self.controller: ServiceProcess | None = None
        self.etcd: NsEtcd | None = None
        #: The member the last read of the groups' keys was answered by (tried first).
        self._etcd_member = 0
        if settings.etcd:
            self.etcd = NsEtcd(root / "etcd", [net[n] for n in ETCD_NODES])
            election: dict[str, object] = {"etcd_endpoints": self.etcd.endpoints,
                                           "etcd_lease": settings.etcd_lease}
        else:
            ctl = net["ctl"]
            self.controller = self._service(
                ctl, ["controller", "--listen-host", ctl.addr, "--port", str(CONTROLLER_PORT),
                      "--data-dir", str(root / "controller"), "--lease", str(settings.lease)],
                r"^txbroker controller ready addr=(\S+)$")
            election = {"controller_addr": self.controller_addr, "controller_lease": settings.lease,
                        "controller_heartbeat_interval": settings.heartbeat_interval}
        self.namesrvs = [self._service(net[n], ["namesrv", "--listen-host", net[n].addr, "--port",
                                                str(NAMESRV_PORT)], r"^txbroker namesrv ready addr=(\S+)$")
                         for n in ("ns1", "ns2")]
        self.brokers: dict[str, NsBrokerProcess] = {}
        for group in GROUPS:
            for broker_id, name in enumerate(group.nodes):
                node = net[name]
                cfg = {**broker_settings("async"), "listen_host": node.addr,
                       "broker_port": BROKER_PORT, "ha_port": HA_PORT,
                       "namesrv_addr": self.namesrv_addr, "broker_name": group.name,
                       "cluster_name": group.cluster, "broker_id": broker_id,
                       "broker_role": group.role, **election,
                       "metadata_sync_interval": 0.2, "register_interval": settings.register_interval,
                       "slave_timeout": settings.slave_timeout}
                if settings.kafka:
                    cfg.update(kafka_settings(group))
                self.brokers[name] = NsBrokerProcess(node, root / name, cfg, root / f"{name}.log")

    def _service(self, node: Node, args: list[str], ready: str) -> ServiceProcess:
        proc = ServiceProcess(args, ready, self.root / f"{node.name}.log")
        proc.argv = node.exec_argv(proc.argv)
        return proc

    @property
    def controller_addr(self) -> str:
        return f"{self.net['ctl'].addr}:{CONTROLLER_PORT}"

    @property
    def namesrv_addr(self) -> str:
        return ";".join(f"{self.net[n].addr}:{NAMESRV_PORT}" for n in ("ns1", "ns2"))

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka listener, masters and slaves (clients find the leaders)."""
        return ",".join(f"{self.net[n].addr}:{KAFKA_PORT}" for n in self.brokers)

    def node_of(self, addr: str) -> str | None:
        host = addr.rsplit(":", 1)[0]
        return next((n.name for n in self.net.nodes.values() if n.addr == host), None)

    @property
    def lease(self) -> float:
        """The lease a master counts (the controller's, or the etcd lease)."""
        return float(self.settings.etcd_lease) if self.etcd is not None else self.settings.lease

    def start(self) -> None:
        if self.etcd is not None:
            self.etcd.start()
        if self.controller is not None:
            self.controller.start()
        for ns in self.namesrvs:
            ns.start()
        for broker in self.brokers.values():
            broker.start()

    def stop(self) -> None:
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                if broker.alive():
                    os.kill(broker.pid, signal.SIGCONT)  # a paused broker cannot die of SIGKILL late
                broker.kill()
        for svc in (*self.namesrvs, *([self.controller] if self.controller else [])):
            with contextlib.suppress(Exception):
                if svc.proc is not None and svc.proc.poll() is None:
                    os.kill(svc.proc.pid, signal.SIGCONT)
                svc.stop()
        if self.etcd is not None:
            with contextlib.suppress(Exception):
                self.etcd.stop()

    # --- what the controller (or etcd) says ---------------------------------------------------
    async def masters(self) -> dict[str, MasterInfo | None]:
        if self.etcd is not None:
            return await asyncio.to_thread(self._etcd_views)
        infos = await asyncio.gather(*(replica_info(self.controller_addr, g.name) for g in GROUPS))
        return {g.name: i for g, i in zip(GROUPS, infos, strict=True)}

    def _etcd_views(self) -> dict[str, MasterInfo | None]:
        """Each group's master and in-sync set from its keys in etcd: one linearizable range
        read per group (None: no member answered in time, or the keys do not parse).

        Over etcd's JSON gateway, from a worker thread (it stands in the client namespace),
        not over gRPC: this process forks the cluster's processes, and a fork while gRPC's
        threads run is where gRPC's fork handlers can crash the child before it execs."""
        views: dict[str, MasterInfo | None] = {}
        for group in GROUPS:
            cluster = KAFKA_CLUSTER if self.settings.kafka else group.cluster
            keys = GroupKeys.named("/txbroker", cluster, group.name)
            read = self._etcd_range(keys.base)
            try:
                views[group.name] = None if read is None else GroupState.of(keys, *read).info()
            except ControllerError:
                views[group.name] = None
        return views

    def _etcd_range(self, prefix: bytes) -> tuple[list[KV], int] | None:
        """The keys under ``prefix`` and the revision, from the first member that answers
        (the last one that did first); None when none does."""
        assert self.etcd is not None
        size = len(self.etcd.members)
        order = [(self._etcd_member + k) % size for k in range(size)]
        for i in order:
            read = etcd_range_http([self.etcd.members[i].endpoint], prefix)
            if read is not None:
                self._etcd_member = i
                return read
        return None

    async def wait_healthy(self, timeout: float) -> dict[str, MasterInfo] | None:
        """Every group with a master and both brokers in sync (None: not within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = await self.masters()
            if all(i is not None and i.master_id is not None and len(i.sync_state_set) == 2
                   for i in infos.values()):
                return {k: v for k, v in infos.items() if v is not None}
            await asyncio.sleep(0.2)
        return None

    # --- process faults -----------------------------------------------------------------------
    def restore(self) -> None:
        """After a fault: every etcd member running and unpaused (brokers are resumed by the
        fault's own clean-up)."""
        if self.etcd is not None:
            self.etcd.restore()

    def pause(self, name: str) -> None:
        os.kill(self.brokers[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.brokers[name].pid, signal.SIGCONT)

    def kill(self, name: str) -> None:
        self.brokers[name].kill()

    def log_tail(self, name: str, n: int = 3000) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""
