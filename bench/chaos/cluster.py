"""Cluster chaos: a SYNC_MASTER broker group whose master is SIGKILLed again and again.

``python -m txbroker.bench.chaos --cluster --kills 10``.  One ``txbroker controller``, one
``txbroker namesrv`` and one group of two brokers (``broker-a`` ids 0 and 1, both
SYNC_MASTER, controller mode) run as subprocesses on loopback, each broker on fixed ports and
its own data dir so that a restarted broker comes back on the same addresses.  The
transactional load of :mod:`txbroker.bench.chaos.driver` (the seeded commit / rollback /
unknown mix, a consumer group, the :class:`Ledger`) runs against the name server while a killer:

1. waits until the group is healthy (the controller names a master and both brokers are in
   its in-sync set: only then can a kill be survived without losing acknowledged bytes);
2. SIGKILLs whichever broker is the master now (the controller's GET_REPLICA_INFO says which);
3. waits until the name server routes id 0 to the other broker ("time to promotion");
4. restarts the killed broker after a short pause: it must rejoin as a slave, truncating
   whatever it had past the new master's epoch start.

Per kill it reports the time to promotion and the client-visible gap (from the last
successful send before the kill to the first one after it); the Ledger gives the verdict.

``--etcd``: the group elects its master on a three-member etcd (docs/cluster.md, "Consensus on
etcd") instead of a controller, and each round first SIGKILLs the etcd *leader* (restarted
with the broker), so every master kill lands on an etcd that has just lost its leader: the
group's view comes from etcd's keys instead of GET_REPLICA_INFO.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import itertools
import math
import os
import random
import re
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from txbroker.bench.chaos.driver import LedgerListener, _settle, broker_settings
from txbroker.bench.chaos.ledger import KINDS, Ledger, Report
from txbroker.bench.chaos.lifeline import spawn
from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.client import Consumer, Message, TransactionProducer
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError
from txbroker.cluster.controller_link import ControllerError, MasterInfo
from txbroker.cluster.etcd import KV, prefix_end
from txbroker.cluster.leadership import GroupKeys, GroupState
from txbroker.cluster.local_etcd import LocalEtcd
from txbroker.remoting.bodies import TopicRouteData
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import GetReplicaInfoRequestHeader
from txbroker.remoting.headers import GetRouteInfoRequestHeader

GROUP = "broker-a"
POLL = 0.05


@dataclass(frozen=True)
class ClusterChaosConfig:
    seed: int = 1
    kills: int = 10
    producers: int = 4
    max_txns_per_producer: int = 20000
    #: The controller's lease (brokers use the same) and the brokers' heartbeat interval.
    lease: float = 2.0
    heartbeat_interval: float = 0.3
    #: Load between a healthy group and the next kill (seeded uniform draw).
    min_kill_interval: float = 0.5
    max_kill_interval: float = 1.5
    #: How long the killed broker stays down after the other one was promoted.
    down_pause: float = 0.5
    promotion_timeout: float = 30.0
    rejoin_timeout: float = 60.0
    settle_timeout: float = 60.0
    topic: str = "ChaosTopic"
    producer_group: str = "chaos_pg"
    consumer_group: str = "chaos_cg"
    data_dir: str | None = None
    #: Elect on etcd (a three-member LocalEtcd, its leader killed each round) instead of a
    #: controller; the etcd lease is ``lease`` rounded up to whole seconds, at least 2.
    etcd: bool = False


@dataclass
class KillRecord:
    victim: int
    #: SIGKILL -> the other broker routed as id 0 by the name server; None: never.
    promotion_s: float | None
    t_kill: float = 0.0
    #: The longest gap between successful sends from the kill to the first send after the
    #: promotion (filled in at the end).
    gap_s: float | None = None
    #: The killed broker restarted and back in the in-sync set (None: it did not rejoin).
    rejoin_s: float | None = None


@dataclass
class ClusterReport:
    ledger: Report
    kills: list[KillRecord] = field(default_factory=list)
    sends_ok: int = 0
    longest_gap_s: float = 0.0

    @property
    def promotions(self) -> list[float]:
        return [k.promotion_s for k in self.kills if k.promotion_s is not None]

    @property
    def ok(self) -> bool:
        return self.ledger.ok and len(self.promotions) == len(self.kills) \
            and all(k.rejoin_s is not None for k in self.kills)

    def table(self) -> str:
        lines = ["kill  victim  promotion s  client gap s  rejoin s"]
        for i, k in enumerate(self.kills, 1):
            lines.append(f"{i:>4}  id {k.victim:<4}{_fmt(k.promotion_s):>11}  {_fmt(k.gap_s):>12}"
                         f"  {_fmt(k.rejoin_s):>8}")
        prom = self.promotions
        gaps = [k.gap_s for k in self.kills if k.gap_s is not None]
        lines.append("")
        rows = [("time to promotion s (median / max)",
                 f"{_fmt(_median(prom))} / {_fmt(max(prom, default=None))}"),
                ("client gap at a kill s (median / max)",
                 f"{_fmt(_median(gaps))} / {_fmt(max(gaps, default=None))}"),
                ("longest gap between successful sends s", _fmt(self.longest_gap_s)),
                ("successful sends", str(self.sends_ok)),
                ("kills without promotion", str(len(self.kills) - len(prom))),
                ("kills without rejoin", str(sum(k.rejoin_s is None for k in self.kills)))]
        width = max(len(k) for k, _ in rows)
        lines += [f"{k:<{width}}  {v}" for k, v in rows]
        lines.append("")
        ledger = self.ledger.table().splitlines()
        lines += [line for line in ledger if not line.startswith(("RESULT", "recovery"))]
        lines.append("RESULT: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class ServiceProcess:
    """``txbroker namesrv`` or ``txbroker controller`` in a subprocess: started (dying with
    this process, ``lifeline.py``), its address read from the ready line, stopped."""

    def __init__(self, args: list[str], ready: str, log_path: Path) -> None:
        self.argv = [sys.executable, "-P", "-m", "txbroker", *args]
        self.ready_re = re.compile(ready)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.addr = ""

    def start(self, timeout: float = 30.0) -> ServiceProcess:
        with open(self.log_path, "ab") as log:
            self.proc = spawn(self.argv, stdout=subprocess.PIPE, stderr=log,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        buf = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
        m = self.ready_re.match(buf.split(b"\n", 1)[0].decode(errors="replace").strip())
        if not m:
            self.stop()
            raise RuntimeError(f"{self.argv[3]} not ready: {buf!r}\n{self.log_path.read_text()[-4000:]}")
        self.addr = m.group(1)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


async def _call(addr: str, cmd: RemotingCommand) -> RemotingCommand | None:
    """One request on a fresh connection; None when the peer cannot be reached."""
    client = RemotingClient(addr, reconnect=False)
    try:
        return await client.invoke(cmd, 2.0)
    except (OSError, TimeoutError):
        return None
    finally:
        await client.close()


async def replica_info(controller: str, broker_name: str = GROUP) -> MasterInfo | None:
    """The controller's view of a group (GET_REPLICA_INFO); None when it does not answer."""
    cmd = RemotingCommand.request(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                  GetReplicaInfoRequestHeader(broker_name=broker_name).to_ext())
    resp = await _call(controller, cmd)
    if resp is None or resp.code != ResponseCode.SUCCESS:
        return None
    try:
        return MasterInfo.from_command(resp)
    except ControllerError:
        return None


async def routed_master(namesrv: str, topic: str, broker_name: str = GROUP) -> str | None:
    """The address the name server routes as the group's id 0 now (None: no master)."""
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                  GetRouteInfoRequestHeader(topic=topic).to_ext())
    resp = await _call(namesrv, cmd)
    if resp is None or resp.code != ResponseCode.SUCCESS:
        return None
    route = TopicRouteData.decode(resp.body)
    return next((b.master_addr() for b in route.broker_datas if b.broker_name == broker_name), None)


class ClusterProcesses:
    """The controller (or etcd), the name server and the two brokers of ``broker-a``."""

    def __init__(self, root: Path, cfg: ClusterChaosConfig) -> None:
        self.root = root
        self.cfg = cfg
        self.controller: ServiceProcess | None = None
        self.etcd: LocalEtcd | None = None
        if cfg.etcd:
            self.etcd = LocalEtcd(root / "etcd")
        else:
            self.controller = ServiceProcess(
                ["controller", "--port", "0", "--data-dir", str(root / "controller"),
                 "--lease", str(cfg.lease)],
                r"^txbroker controller ready addr=(\S+)$", root / "controller.log")
        self.namesrv = ServiceProcess(["namesrv", "--port", "0"],
                                      r"^txbroker namesrv ready addr=(\S+)$", root / "namesrv.log")
        self.brokers: list[BrokerProcess] = []

    def start(self) -> None:
        if self.etcd is not None:
            self.etcd.start()
            election = {"etcd_endpoints": self.etcd.endpoints,
                        "etcd_lease": max(2, math.ceil(self.cfg.lease))}
        else:
            assert self.controller is not None
            self.controller.start()
            election = {"controller_addr": self.controller.addr,
                        "controller_lease": self.cfg.lease,
                        "controller_heartbeat_interval": self.cfg.heartbeat_interval}
        self.namesrv.start()
        for broker_id in (0, 1):
            settings = {**broker_settings("async"), "broker_port": free_port(),
                        "ha_port": free_port(), "namesrv_addr": self.namesrv.addr,
                        "broker_name": GROUP, "broker_id": broker_id, "broker_role": "SYNC_MASTER",
                        **election,
                        "metadata_sync_interval": 0.2, "register_interval": 1.0,
                        "slave_timeout": 1.0}
            broker = BrokerProcess(self.root / f"broker-{broker_id}", settings,
                                   self.root / f"broker-{broker_id}.log")
            self.brokers.append(broker)
            broker.start()

    def stop(self) -> None:
        """The mirror of :meth:`start`: brokers, name server, then the controller or etcd."""
        for broker in self.brokers:
            broker.kill()
        self.namesrv.stop()
        if self.controller is not None:
            self.controller.stop()
        if self.etcd is not None:
            self.etcd.stop()

    async def view(self) -> MasterInfo | None:
        """The group's master and in-sync set, from the controller or from etcd's keys."""
        if self.controller is not None:
            return await replica_info(self.controller.addr)
        assert self.etcd is not None
        keys = GroupKeys.named("/txbroker", "DefaultCluster", GROUP)
        endpoints = [m.endpoint for m in self.etcd.members]
        read = await asyncio.to_thread(etcd_range_http, endpoints, keys.base)
        try:
            return None if read is None else GroupState.of(keys, *read).info()
        except ControllerError:
            return None


def etcd_range_http(endpoints: list[str], prefix: bytes,
                    timeout: float = 1.0) -> tuple[list[KV], int] | None:
    """The keys under ``prefix`` and the revision (a linearizable read), from the first of
    ``endpoints`` that answers within ``timeout``; None when none does.

    Over etcd's JSON gateway, blocking (call it from a worker thread), not over gRPC: the
    harness forks the cluster's processes, and a fork while gRPC's threads run is where
    gRPC's fork handlers can crash the child before it execs."""
    body = orjson.dumps({"key": base64.b64encode(prefix).decode(),
                         "range_end": base64.b64encode(prefix_end(prefix)).decode()})
    for endpoint in endpoints:
        req = urllib.request.Request(f"http://{endpoint}/v3/kv/range", data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                doc = orjson.loads(r.read())
        except (OSError, ValueError):
            continue
        kvs = [KV(base64.b64decode(kv["key"]), base64.b64decode(kv.get("value", "")),
                  int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                  int(kv.get("version", 0)), int(kv.get("lease", 0)))
               for kv in doc.get("kvs", ())]
        return kvs, int(doc["header"]["revision"])
    return None


async def _wait_healthy(procs: ClusterProcesses, timeout: float) -> MasterInfo | None:
    """The group's view once it names a master and both brokers are in sync."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await procs.view()
        if info is not None and info.master_id is not None and len(info.sync_state_set) == 2:
            return info
        await asyncio.sleep(POLL * 4)
    return None


async def _wait_routed(namesrv: str, topic: str, addr: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await routed_master(namesrv, topic) == addr:
            return True
        await asyncio.sleep(POLL)
    return False


async def run_cluster_chaos(cfg: ClusterChaosConfig) -> ClusterReport:
    tmp = None
    if cfg.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="txbroker-cluster-chaos-")
        root = Path(tmp.name)
    else:
        root = Path(cfg.data_dir)
        root.mkdir(parents=True, exist_ok=True)
    procs = ClusterProcesses(root, cfg)
    try:
        await asyncio.to_thread(procs.start)
        info = await _wait_healthy(procs, cfg.rejoin_timeout)
        if info is None:
            raise RuntimeError(f"the group never had a master with both brokers in sync; logs in {root}")
        async with AdminClient(procs.namesrv.addr) as admin:
            await admin.create_topic(cfg.topic, 4)
        # The name server learns the topic at the master's next registration.
        if not await _wait_routed(procs.namesrv.addr, cfg.topic, info.master_addr, cfg.rejoin_timeout):
            raise RuntimeError(f"the name server never routed {cfg.topic}; logs in {root}")
        return await _run(cfg, procs)
    finally:
        await asyncio.to_thread(procs.stop)
        if tmp is not None:
            tmp.cleanup()


async def _run(cfg: ClusterChaosConfig, procs: ClusterProcesses) -> ClusterReport:
    rng = random.Random(cfg.seed)
    namesrv = procs.namesrv.addr
    ledger = Ledger()
    ok_times: list[float] = []
    kills: list[KillRecord] = []
    stop_load = asyncio.Event()
    stop_consume = asyncio.Event()

    consumer = Consumer(cfg.consumer_group, namesrv, from_where="first", long_poll_timeout=1.0,
                        rebalance_interval=1.0, persist_interval=0.2, pull_error_backoff=0.2,
                        request_timeout=2.0)
    consumer.subscribe(cfg.topic)
    await consumer.start()

    async def consume() -> None:
        while not stop_consume.is_set():
            msg = await consumer.poll(0.3)
            if msg is not None:
                ledger.delivered(msg.keys or "", msg.queue_id, msg.queue_offset)

    producers = [TransactionProducer(cfg.producer_group, namesrv, listener=LedgerListener(ledger),
                                     send_timeout=2.0, retries=2) for _ in range(cfg.producers)]
    for p in producers:
        await p.start()
    seeds = [rng.random() for _ in producers]

    async def produce(idx: int, producer: TransactionProducer) -> None:
        prng = random.Random(seeds[idx])
        for i in range(cfg.max_txns_per_producer):
            if stop_load.is_set():
                return
            key = f"k{cfg.seed}-p{idx}-{i}"
            ledger.begin(key, prng.choice(KINDS))
            try:
                await producer.send_message_in_transaction(Message(cfg.topic, key.encode(), keys=key), key)
            except (ClientError, OSError, TimeoutError):  # the half was not acknowledged
                ledger.send_failed(key)
                await asyncio.sleep(0.1)
            else:
                ok_times.append(time.monotonic())

    async def killer() -> None:
        for _ in range(cfg.kills):
            await asyncio.sleep(rng.uniform(cfg.min_kill_interval, cfg.max_kill_interval))
            info = await _wait_healthy(procs, cfg.rejoin_timeout)
            if info is None or info.master_id is None:
                break  # the previous kill's broker never rejoined: recorded there
            victim, other = procs.brokers[info.master_id], procs.brokers[1 - info.master_id]
            etcd_victim = None
            if procs.etcd is not None:  # etcd loses its leader, then the group its master
                etcd_victim = await asyncio.to_thread(procs.etcd.leader)
                await asyncio.to_thread(procs.etcd.kill, etcd_victim)
                await asyncio.sleep(0.5)
            t_kill = time.monotonic()
            await asyncio.to_thread(victim.kill)
            ledger.kills += 1
            promoted = await _wait_routed(namesrv, cfg.topic, other.broker_addr, cfg.promotion_timeout)
            rec = KillRecord(info.master_id, time.monotonic() - t_kill if promoted else None, t_kill)
            kills.append(rec)
            if not promoted:
                break
            await asyncio.sleep(cfg.down_pause)
            t_restart = time.monotonic()
            if procs.etcd is not None and etcd_victim is not None:
                await asyncio.to_thread(procs.etcd.start_member, etcd_victim)
            await asyncio.to_thread(victim.start)
            if await _wait_healthy(procs, cfg.rejoin_timeout) is not None:
                rec.rejoin_s = time.monotonic() - t_restart
            else:
                break
        stop_load.set()

    consume_task = asyncio.ensure_future(consume())
    tasks = [asyncio.ensure_future(produce(i, p)) for i, p in enumerate(producers)]
    try:
        await killer()
        await asyncio.gather(*tasks)
        pending = await _settle(cfg, namesrv, ledger)
    finally:
        stop_load.set()
        for t in tasks:
            t.cancel()
        stop_consume.set()
        await asyncio.gather(consume_task, *tasks, return_exceptions=True)
        for p in producers:
            await p.shutdown()
        await consumer.shutdown()
    report = ClusterReport(ledger.verify(pending_at_end=pending), kills, sends_ok=len(ok_times))
    ok_times.sort()
    report.longest_gap_s = max((b - a for a, b in itertools.pairwise(ok_times)), default=0.0)
    for rec in kills:
        rec.gap_s = _kill_gap(ok_times, rec)
    return report


def _kill_gap(ok_times: list[float], rec: KillRecord) -> float | None:
    """The longest gap between successive successful sends from the last one before the
    kill to the first one after the promotion (a send the dying master answered can land
    just after the SIGKILL was sent, so the gap is not simply the one around the kill)."""
    if rec.promotion_s is None:
        return None
    promoted = rec.t_kill + rec.promotion_s
    start = bisect.bisect_right(ok_times, rec.t_kill) - 1
    end = bisect.bisect_right(ok_times, promoted)
    if start < 0 or end >= len(ok_times):
        return None
    return max(b - a for a, b in itertools.pairwise(ok_times[start:end + 1]))
