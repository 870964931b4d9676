"""A controller-mode cluster of real processes, one network namespace per node, and the faults
injected on it.

Nodes (:mod:`txbroker.bench.chaos.netns` gives each its namespace and address): ``ctl`` (one
``txbroker controller``), ``ns1`` and ``ns2`` (two ``txbroker namesrv``), ``a0``/``a1`` (group
``broker-a``, SYNC_MASTER, cluster ``SyncCluster``), ``b0``/``b1`` (group ``broker-b``,
ASYNC_MASTER, cluster ``AsyncCluster``) and ``cli`` (the load and the checker, which enter it
with ``setns``).  Every node is started as ``ip netns exec <ns> python -P -m txbroker ...``,
binds and advertises its own namespace address on fixed ports (each namespace has its own
port space), so a restarted broker comes back at the same address.

Faults: cuts between any two nodes (:class:`~txbroker.bench.chaos.netns.Network`), each proved
silent before it counts; pauses (SIGSTOP / SIGCONT: sockets stay open, nothing is answered);
SIGKILL.  Each group's master is whichever broker the controller names now.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from txbroker.bench.chaos.cluster import ServiceProcess, replica_info
from txbroker.bench.chaos.driver import broker_settings
from txbroker.bench.chaos.netns import Network, Node
from txbroker.bench.chaos.process import BrokerProcess
from txbroker.cluster.controller_link import MasterInfo

BROKER_PORT, HA_PORT, NAMESRV_PORT, CONTROLLER_PORT = 10911, 10912, 9876, 9878
#: The Kafka listener of every broker when :attr:`ClusterSettings.kafka` is on.
KAFKA_PORT = 9092
#: With Kafka on, both groups join one cluster: a Kafka view spans the groups of its broker's
#: cluster only (docs/kafka.md, "Kafka on a cluster").
KAFKA_CLUSTER = "KafkaCluster"
SERVICES = ("ctl", "ns1", "ns2")
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
        ctl = net["ctl"]
        self.controller = self._service(ctl, ["controller", "--listen-host", ctl.addr, "--port",
                                              str(CONTROLLER_PORT), "--data-dir", str(root / "controller"),
                                              "--lease", str(settings.lease)],
                                        r"^txbroker controller ready addr=(\S+)$")
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
                       "broker_role": group.role, "controller_addr": self.controller_addr,
                       "controller_lease": settings.lease,
                       "controller_heartbeat_interval": settings.heartbeat_interval,
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

    def start(self) -> None:
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
        for svc in (*self.namesrvs, self.controller):
            with contextlib.suppress(Exception):
                if svc.proc is not None and svc.proc.poll() is None:
                    os.kill(svc.proc.pid, signal.SIGCONT)
                svc.stop()

    # --- what the controller says -------------------------------------------------------------
    async def masters(self) -> dict[str, MasterInfo | None]:
        infos = await asyncio.gather(*(replica_info(self.controller_addr, g.name) for g in GROUPS))
        return {g.name: i for g, i in zip(GROUPS, infos, strict=True)}

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
