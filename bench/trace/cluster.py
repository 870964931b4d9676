"""A controller-mode cluster the bench starts on loopback and runs fault plans against.

``EmbeddedCluster(groups=2, broker_settings=...)`` is the bench's counterpart of
:class:`~txbroker.bench.trace.embedded.EmbeddedBroker` for ``bench run --cluster GROUPS``: one
``txbroker controller``, one ``txbroker namesrv`` and ``groups`` broker groups (``broker-a``,
``broker-b``, ...) of two brokers each (ids 0 and 1, SYNC_MASTER, controller mode, so the
controller promotes the slave when a master dies), every broker with its Kafka listener
(``kafka_node_id`` 1, 2, ... per group, one cluster name, so the Kafka view spans the groups).
The processes are the chaos harness's (:class:`~txbroker.bench.chaos.cluster.ServiceProcess`,
:class:`~txbroker.bench.chaos.process.BrokerProcess`) on fixed free ports, so a killed process
restarts at the same addresses; the trace's transaction settings are given to every broker,
because each one may become the master whose checks a ``never`` row counts.

**Partitions need proxies.**  Loopback cannot be cut for one process without touching the
host's network, so with ``partitionable=True`` every broker is started behind
:class:`~txbroker.bench.chaos.faultproxy.FaultProxy` instances run on a thread of this process:
the broker listens on a loopback address of its own (``127.0.0.11``, ``127.0.0.12``, ...) and
advertises ``127.0.0.1``, where proxies on the same ports (broker, HA, Kafka) forward to it, so
clients and the other brokers reach it only through them; its own links to the controller and
the name server go through two more proxies of its own.  :meth:`partition` holds all five
(nothing forwarded either way, connections stalled, not closed) and :meth:`heal` releases them.
What stays open: connections the partitioned broker opens itself to another broker (a slave's
HA link to its master, a coordinator's markers, the Kafka view's reads) pass that broker's
proxies, which cannot tell them from clients.  Every byte then crosses this process twice, so
figures of a run with proxies are not comparable with one without; without
``partitionable`` there are no proxies.

The cluster's own questions (who is a group's master now, is every group healthy) go straight
to the controller.  The methods here block: a fault plan runs them on its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Self

from txbroker.bench.chaos.cluster import ServiceProcess, replica_info
from txbroker.bench.chaos.driver import broker_settings as chaos_broker_settings
from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.bench.trace.spec import BrokerSettings
from txbroker.cluster.controller_link import MasterInfo

#: One cluster name for every group: a Kafka view spans the groups of its broker's cluster.
CLUSTER_NAME = "BenchCluster"
#: The controller's lease (brokers use the same): a dead master is replaced within about this.
LEASE = 2.0
#: Broker ``i`` (0-based over the cluster) listens on ``127.0.0.<BASE + i>`` behind proxies.
PRIVATE_HOST_BASE = 11
#: Bound on waiting for every group to have a master with both brokers in sync.
HEALTHY_TIMEOUT = 60.0
#: Settings the cluster decides for each broker: dropped from the ``broker_settings`` given
#: (which may be an :func:`~txbroker.bench.trace.embedded.serve_settings` mapping, made for a
#: single broker on ephemeral ports with its own name server).
CLUSTER_OWNED = frozenset({
    "listen_host", "advertised_host", "broker_port", "ha_port", "namesrv_port", "kafka_port",
    "kafka_node_id", "namesrv_addr", "controller_addr", "broker_name", "broker_id",
    "broker_role", "cluster_name"})
#: Most groups a cluster can have (one letter each, ``broker-a`` .. ``broker-z``).
MAX_GROUPS = 26


class ClusterError(RuntimeError):
    """The cluster did not start or cannot do what was asked; the first line says why."""


def group_name(index: int) -> str:
    return f"broker-{chr(ord('a') + index)}"


def base_settings() -> dict[str, object]:
    """What every broker of the cluster runs with before the trace's settings: the chaos
    harness's fast timings, larger segments (a long replay), quieter logs."""
    return {**chaos_broker_settings("async"), "segment_size": 64 * 1024 * 1024,
            "log_level": "WARNING", "cluster_name": CLUSTER_NAME,
            "controller_lease": LEASE, "controller_heartbeat_interval": 0.3,
            "metadata_sync_interval": 0.2, "register_interval": 1.0, "slave_timeout": 1.0}


def kafka_settings(node_id: int) -> dict[str, object]:
    """A broker's Kafka listener on a cluster: the group's node id, short refresh timings."""
    return {"kafka_port": free_port(), "kafka_node_id": node_id,
            "kafka_cluster_refresh_interval": 0.3, "kafka_transaction_scan_interval": 0.2,
            "kafka_group_initial_rebalance_delay": 0.2, "kafka_group_min_session_timeout": 1.0}


class _ProxyThread:
    """An event loop on a daemon thread running the proxies; callers block on each step."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="cluster-proxies",
                                       daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args) -> None:
        async def step() -> None:
            fn(*args)
        self.run(step())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class EmbeddedCluster:
    """The controller, the name server and ``groups`` groups of two brokers, under ``root``
    (a temp dir removed at exit when None).  Process names: ``controller``, ``namesrv``,
    ``broker-a-0``, ``broker-a-1``, ``broker-b-0``, ...

    ``broker_settings``: the trace's :class:`BrokerSettings`, or BrokerConfig field names ->
    values given to every broker (except the :data:`CLUSTER_OWNED` ones)."""

    def __init__(self, groups: int = 2,
                 broker_settings: BrokerSettings | Mapping[str, object] | None = None,
                 root: str | os.PathLike[str] | None = None, kafka: bool = True,
                 partitionable: bool = False) -> None:
        if not 1 <= groups <= MAX_GROUPS:
            raise ClusterError(f"--cluster {groups}: a cluster has 1 to {MAX_GROUPS} broker groups")
        self.partitionable = partitionable
        self._tmp = None if root is not None else tempfile.mkdtemp(prefix="txbroker-bench-cluster-")
        self.root = Path(root if root is not None else self._tmp)
        self.root.mkdir(parents=True, exist_ok=True)
        self.group_names = [group_name(i) for i in range(groups)]
        self.controller_addr = f"127.0.0.1:{free_port()}"
        self._namesrv_port = free_port()
        self.controller = ServiceProcess(
            ["controller", "--port", self.controller_addr.rsplit(":", 1)[1],
             "--data-dir", str(self.root / "controller"), "--lease", str(LEASE)],
            r"^txbroker controller ready addr=(\S+)$", self.root / "controller.log")
        self.namesrv = ServiceProcess(["namesrv", "--port", str(self._namesrv_port)],
                                      r"^txbroker namesrv ready addr=(\S+)$", self.root / "namesrv.log")
        self.brokers: dict[str, BrokerProcess] = {}
        #: Per broker, the proxies a partition holds (empty without ``partitionable``).
        self.proxies: dict[str, list[FaultProxy]] = {}
        self._proxy_thread = _ProxyThread() if partitionable else None
        if isinstance(broker_settings, BrokerSettings):
            broker_settings = asdict(broker_settings)
        trace_settings = {k: v for k, v in (broker_settings or {}).items() if k not in CLUSTER_OWNED}
        for g, group in enumerate(self.group_names):
            for broker_id in (0, 1):
                name = f"{group}-{broker_id}"
                settings = {**base_settings(), **trace_settings,
                            "broker_port": free_port(), "ha_port": free_port(),
                            "namesrv_addr": self.namesrv_addr, "controller_addr": self.controller_addr,
                            "broker_name": group, "broker_id": broker_id,
                            "broker_role": "SYNC_MASTER"}
                if kafka:
                    settings.update(kafka_settings(g + 1))
                self.brokers[name] = BrokerProcess(self.root / name, settings, self.root / f"{name}.log")
        if self._proxy_thread is not None:
            for i, (name, broker) in enumerate(self.brokers.items()):
                self.proxies[name] = self._put_behind_proxies(broker, f"127.0.0.{PRIVATE_HOST_BASE + i}")

    def _put_behind_proxies(self, broker: BrokerProcess, private: str) -> list[FaultProxy]:
        """Listen on ``private``, advertise 127.0.0.1, and open the proxies in between."""
        assert self._proxy_thread is not None
        s = broker.settings
        inbound = [int(s[k]) for k in ("broker_port", "ha_port", "kafka_port") if k in s]
        proxies = [FaultProxy(private, port, listen_port=port) for port in inbound]
        for addr in (self.controller_addr, self.namesrv_addr):
            host, port = addr.rsplit(":", 1)
            proxies.append(FaultProxy(host, int(port)))
        for proxy in proxies:
            self._proxy_thread.run(proxy.start())
        s.update(listen_host=private, advertised_host="127.0.0.1",
                 controller_addr=proxies[-2].addr, namesrv_addr=proxies[-1].addr)
        return proxies

    # --- what the bench reads -----------------------------------------------------------------
    @property
    def namesrv_addr(self) -> str:
        """The name server, ``127.0.0.1:PORT`` (what ``--namesrv`` would name)."""
        return f"127.0.0.1:{self._namesrv_port}"

    @property
    def bootstrap(self) -> str:
        """Every broker's Kafka listener, ``h:p,h:p`` (clients find each partition's leader)."""
        return ",".join(f"127.0.0.1:{b.settings['kafka_port']}"
                        for b in self.brokers.values() if "kafka_port" in b.settings)

    def broker_pids(self) -> list[int]:
        """The pids of the brokers running now (a restarted broker has a new one)."""
        return [b.pid for b in self.brokers.values() if b.alive()]

    def processes(self) -> dict[str, ServiceProcess | BrokerProcess]:
        return {"controller": self.controller, "namesrv": self.namesrv, **self.brokers}

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout: float = HEALTHY_TIMEOUT) -> float:
        """Start every process and wait until each group has a master with both brokers in
        sync and the name server routes it; returns the seconds that took."""
        t0 = time.monotonic()
        try:
            self.controller.start()
            self.namesrv.start()
            for broker in self.brokers.values():
                broker.start()
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise ClusterError(f"cluster did not start: {str(exc).splitlines()[0]} (logs in {self.root})") from None
        if not self.wait_healthy(timeout):
            states = self.masters()
            self.stop()
            raise ClusterError(f"cluster not healthy within {timeout:g} s: {states} (logs in {self.root})")
        return time.monotonic() - t0

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self) -> None:
        """Stop everything (a paused process is resumed first, a partition healed)."""
        for name in self.proxies:
            self.heal(name)
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                if broker.alive():
                    os.kill(broker.pid, signal.SIGCONT)
                    broker.stop(15)
            with contextlib.suppress(Exception):
                broker.kill()
        for svc in (self.namesrv, self.controller):
            with contextlib.suppress(Exception):
                if svc.proc is not None and svc.proc.poll() is None:
                    os.kill(svc.proc.pid, signal.SIGCONT)
                svc.stop()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._proxy_thread is not None:
                for proxies in self.proxies.values():
                    for proxy in proxies:
                        with contextlib.suppress(Exception):
                            self._proxy_thread.run(proxy.close(), 10)
                self._proxy_thread.close()
                self._proxy_thread = None
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the controller says -------------------------------------------------------------
    def masters(self) -> dict[str, MasterInfo | None]:
        """Each group's replica info from the controller (None: no answer)."""
        async def ask() -> list[MasterInfo | None]:
            return list(await asyncio.gather(*(replica_info(self.controller_addr, g)
                                               for g in self.group_names)))
        return dict(zip(self.group_names, asyncio.run(ask()), strict=True))

    def master_of(self, group: str) -> str | None:
        """The process name of ``group``'s master now (None: the controller names none)."""
        info = self.masters()[group]
        if info is None or info.master_id is None:
            return None
        return f"{group}-{info.master_id}"

    def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT) -> bool:
        """Until every group has a master with both brokers in its in-sync set (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = self.masters().values()
            if all(i is not None and i.master_id is not None and len(i.sync_state_set) == 2
                   for i in infos):
                return True
            time.sleep(0.2)
        return False

    # --- faults -------------------------------------------------------------------------------
    def resolve(self, target: str) -> str:
        """A process name for ``target``: a name as such, ``<group>-master`` / ``<group>-slave``
        the group's broker in that role now.  Raises ClusterError when there is none."""
        group, _, role = target.rpartition("-")
        if role in ("master", "slave") and group in self.group_names:
            master = self.master_of(group)
            if master is None:
                raise ClusterError(f"{target}: the controller names no master of {group} now")
            if role == "master":
                return master
            return next(n for n in (f"{group}-0", f"{group}-1") if n != master)
        if target not in self.processes():
            raise ClusterError(f"{target}: no such process in the cluster")
        return target

    def kill(self, name: str) -> None:
        """SIGKILL the process (a paused one dies too)."""
        proc = self.processes()[name]
        if isinstance(proc, BrokerProcess):
            proc.kill()
        elif proc.proc is not None and proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait(10)

    def restart(self, name: str) -> None:
        """Start a killed process again on its data dir and ports."""
        proc = self.processes()[name]
        if isinstance(proc, BrokerProcess):
            proc.start()
        else:
            if proc.proc is not None and proc.proc.stdout is not None:
                proc.proc.stdout.close()
            proc.start()

    def pause(self, name: str) -> None:
        os.kill(self._pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError, ClusterError):
            os.kill(self._pid(name), signal.SIGCONT)

    def partition(self, name: str) -> None:
        """Cut broker ``name`` off from the clients, the other brokers' connections to it, the
        controller and the name server (its proxies hold)."""
        self._proxy_step(name, FaultProxy.hold)

    def heal(self, name: str) -> None:
        self._proxy_step(name, FaultProxy.release)

    def _proxy_step(self, name: str, step) -> None:
        if self._proxy_thread is None:
            raise ClusterError("partitions need a cluster started with partitionable=True")
        if name not in self.proxies:
            raise ClusterError(f"{name}: only a broker can be partitioned")
        for proxy in self.proxies[name]:
            self._proxy_thread.call(step, proxy)

    def _pid(self, name: str) -> int:
        proc = self.processes()[name]
        popen = proc.proc
        if popen is None or popen.poll() is not None:
            raise ClusterError(f"{name} is not running")
        return popen.pid

