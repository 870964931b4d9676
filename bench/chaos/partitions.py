"""Partitions, pauses and lost replies under transactional load, judged by the history checker.

``python -m txbroker.bench.chaos --partitions [--scenario a,b] [--runs 5] [--seed 1]``.  The
cluster of :mod:`txbroker.bench.chaos.faults` (one controller with a 2 s lease, two name
servers, a SYNC_MASTER group and an ASYNC_MASTER group of two brokers each, every node in its
own network namespace) is started afresh for each scenario; each run of a scenario then:

1. waits until both groups have a master with both brokers in sync, creates a fresh topic on
   each group (one topic per group, so each mode is judged on its own messages);
2. runs the seeded transactional load of :mod:`txbroker.bench.chaos.driver` (commit, rollback,
   unknown-then-commit, unknown-then-rollback; the SDK's TransactionProducer, two producers
   per group) recording every send as invoke / ok / fail / info, and polls the controller
   (GET_REPLICA_INFO, every 0.1 s) for each group's master and epoch;
3. after a seeded warm-up, injects the scenario's fault on both groups at once, proves every
   cut silent, holds it (seeded, past the lease), heals, keeps the load on for a while;
4. waits (bounded) for the check-backs to decide every half, then reads every queue of both
   topics from the first offset with a fresh consumer group, and hands the history to
   :func:`txbroker.bench.chaos.history.check`.

Scenarios (each on both groups; "master" = the broker the controller names at the start):

a. master cut off (both ways) from the controller, the name servers and its slave; the client
   still reaches it;
b. one-way cuts: even runs, the controller and name servers cannot reach the master; odd
   runs, the master cannot reach them;
c. master paused (SIGSTOP) past the lease, then resumed;
d. controller cut off from everything;
e. slave cut off from everything;
f. a cut during a promotion: master isolated as in (a); once the controller names the slave,
   the old master is healed and the new one is cut off from the controller;
g. lost replies: the master's packets to the client are dropped (one way) for longer than
   the client's send time-out, three times: requests arrive and are handled, their answers
   never do, the connection stays open (no FIN, no RST).  This is the lost reply of a relay
   that forwards a request and then black-holes the connection
   (:class:`~txbroker.bench.chaos.faultproxy.FaultProxy` ``silent`` mode, used on loopback),
   done at the network layer because the client dials the addresses the routes name.

**On etcd** (``--etcd``): no controller; a three-member etcd, each member a real ``etcd`` in a
namespace of its own (nodes ``e1``-``e3``), brokers with ``--etcd-endpoints`` naming all three
and an etcd lease of ``lease`` seconds; the groups' masters and epochs are read from their keys
in etcd (the ``leader`` key's holder and epoch) instead of the controller.  (a)-(g) run as above,
"controller" read as "every etcd member": (a), (b) and (f) cut the master (the new master in (f))
off from the etcd members too, and (d) cuts every etcd member off from every broker and name
server (not from each other, and not from the client, which keeps reading the keys: a control
plane nobody can reach).  The scenarios of etcd itself:

h. one etcd member isolated (both ways, from everything): the etcd leader on even runs, a
   follower on odd runs;
i. the etcd leader SIGKILLed, restarted after the hold;
j. two of three etcd members SIGKILLed (the leader among them), restarted after the hold:
   nobody can renew or be elected, so every master must stop acknowledging within one lease
   of the loss and resume once etcd is back;
k. each group's master cut off (both ways) from every etcd member, not from its clients, its
   slave or the name servers;
l. the etcd leader paused (SIGSTOP) past its election time-out, then resumed;
m. one name server isolated (both ways, from everything; controller mode too).

What each etcd scenario must show besides the modes' promises (the checker's per-fault
figures, :func:`txbroker.bench.chaos.history.check`): no write gap above :func:`gap_bound`
(one lease plus a promotion) under a minority fault of the control plane ((h), (i), (l),
(m)); in (j), no send invoked more than one lease after the loss acknowledged before etcd was
back, and writes acknowledged again after it.

Exit status 1 when any run shows an anomaly its group's mode promises against, 2 when the
machine cannot run namespaces (the reason in one line).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from txbroker.bench.chaos.cluster import routed_master
from txbroker.bench.chaos.driver import LedgerListener
from txbroker.bench.chaos.faults import (
    CLIENT,
    ETCD_NODES,
    GROUPS,
    ClusterSettings,
    NsCluster,
    nodes_for,
)
from txbroker.bench.chaos.history import GroupVerdict, check
from txbroker.bench.chaos.kafka_history import KafkaGroupVerdict
from txbroker.bench.chaos.ledger import DECIDED, KINDS, Ledger
from txbroker.bench.chaos.netns import ETCD_PREFIX, ETCD_SUBNET, PREFIX, SUBNET, Network
from txbroker.client import Consumer, Message, TransactionProducer
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError, SendError
from txbroker.store.record import decode_offset_msg_id

SCENARIOS = {
    "a": "master cut off from controller, name servers and slave",
    "b": "one-way cuts between master and controller + name servers",
    "c": "master paused past the lease",
    "d": "controller cut off from everything",
    "e": "slave cut off from everything",
    "f": "a cut during a promotion",
    "g": "lost replies (master -> client dropped)",
    "h": "one etcd member isolated (leader: even runs, follower: odd runs)",
    "i": "the etcd leader SIGKILLed, then restarted",
    "j": "two of three etcd members down, then restarted",
    "k": "master cut off from etcd (not from clients, slave, name servers)",
    "l": "the etcd leader paused past its election time-out",
    "m": "one name server isolated",
}
#: Scenarios that need etcd (``--etcd``).
ETCD_ONLY = ("h", "i", "j", "k", "l")
#: What each scenario is called on etcd, where it differs.
ETCD_NAMES = {
    "a": "master cut off from etcd, name servers and slave",
    "b": "one-way cuts between master and etcd + name servers",
    "d": "every etcd member cut off from brokers and name servers",
}
#: Minority faults of the control plane: the write gap must stay within :func:`gap_bound`.
MINORITY = ("h", "i", "l", "m")
#: Seconds an etcd election and the clients' move to the new master may add to a promotion.
ELECTION_ALLOWANCE = 1.0


def gap_bound(lease: float) -> float:
    """The longest write gap a minority fault of the control plane may cause: one lease (the
    master's own count running out) plus a promotion (etcd dropping the old lease, one more
    lease, then an election and the clients following, :data:`ELECTION_ALLOWANCE`)."""
    return 2 * lease + ELECTION_ALLOWANCE


def scenario_name(scenario: str, etcd: bool) -> str:
    return (ETCD_NAMES.get(scenario) if etcd else None) or SCENARIOS[scenario]


@dataclass(frozen=True)
class PartitionsConfig:
    scenarios: tuple[str, ...] = tuple(s for s in SCENARIOS if s not in ETCD_ONLY)
    runs: int = 5
    seed: int = 1
    lease: float = 2.0
    producers: int = 2
    warmup: tuple[float, float] = (1.0, 2.0)
    #: Load kept on after the heal (the old master rejoins meanwhile).
    after_heal: float = 2.0
    settle_timeout: float = 20.0
    healthy_timeout: float = 45.0
    #: Every run is cut short after this (its result then says so).
    run_timeout: float = 150.0
    send_timeout: float = 2.0
    work_dir: str | None = None
    #: Kafka clients instead of the RocketMQ SDK (:mod:`txbroker.bench.chaos.kafka_partitions`).
    kafka: bool = False
    #: Elect on a three-member etcd in namespaces of its own instead of a controller.
    etcd: bool = False
    #: The namespaces' name prefix and the private subnet (None: ``txbc`` / ``10.213.0``, on
    #: etcd ``txbe`` / ``10.214.0``, so a controller run and an etcd run can go side by side).
    netns_prefix: str | None = None
    subnet: str | None = None

    def __post_init__(self) -> None:
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown or not self.scenarios:
            raise ValueError(f"unknown scenario(s) {','.join(unknown) or '(none)'}; "
                             f"choose from {','.join(SCENARIOS)}")
        needs_etcd = [s for s in self.scenarios if s in ETCD_ONLY]
        if needs_etcd and not self.etcd:
            raise ValueError(f"scenario(s) {','.join(needs_etcd)} need --etcd")
        if self.etcd and self.kafka:
            raise ValueError("--etcd with --kafka is not supported yet")
        if self.runs < 1:
            raise ValueError("runs must be at least 1")

    @property
    def prefix(self) -> str:
        return self.netns_prefix or (ETCD_PREFIX if self.etcd else PREFIX)

    @property
    def net_subnet(self) -> str:
        return self.subnet or (ETCD_SUBNET if self.etcd else SUBNET)


@dataclass
class RunResult:
    scenario: str
    run: int
    detail: str = ""
    verdicts: dict[str, GroupVerdict | KafkaGroupVerdict] = field(default_factory=dict)
    cuts_proved: int = 0
    cuts_unproved: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(v.ok for v in self.verdicts.values())


class Recorder:
    """The history of one run: events in order, with both clocks."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, **ev: Any) -> None:
        ev.setdefault("mono", time.monotonic())
        ev.setdefault("wall", time.time())
        self.events.append(ev)

    def write(self, path: Path) -> None:
        path.write_bytes(b"".join(orjson.dumps(ev) + b"\n" for ev in self.events))


UNHEALTHY = "the groups never had a master with both brokers in sync"
CRASHED = "the harness failed"


# --- faults ------------------------------------------------------------------------------------
@dataclass
class FaultCtx:
    cluster: NsCluster
    net: Network
    rng: random.Random
    lease: float
    run: int
    masters: dict[str, str]
    slaves: dict[str, str]
    proved: int = 0
    unproved: int = 0
    #: Extra fields for the fault's history event (e.g. when etcd lost its majority).
    marks: dict[str, Any] = field(default_factory=dict)

    @property
    def services(self) -> tuple[str, ...]:
        """The control plane's nodes and the name servers."""
        return self.cluster.services

    @property
    def nodes(self) -> list[str]:
        return self.cluster.nodes

    @property
    def control(self) -> list[str]:
        """The control plane's nodes: the controller, or every etcd member."""
        return list(ETCD_NODES) if self.cluster.etcd is not None else ["ctl"]

    async def cut(self, pairs: list[tuple[str, str]]) -> None:
        for src, dst in pairs:
            self.net.cut(src, dst)
        proofs = await asyncio.gather(*(asyncio.to_thread(self.net.prove_cut, s, d, 0.5)
                                        for s, d in pairs))
        self.proved += sum(proofs)
        self.unproved += len(proofs) - sum(proofs)

    async def hold(self, base: float) -> None:
        await asyncio.sleep(base + self.rng.uniform(0.0, self.lease))

    def isolate(self, node: str, others: list[str]) -> list[tuple[str, str]]:
        return [p for o in others for p in ((node, o), (o, node))]


async def _isolate_master(ctx: FaultCtx) -> str:
    pairs = [p for g, m in ctx.masters.items() for p in ctx.isolate(m, [*ctx.services, ctx.slaves[g]])]
    await ctx.cut(pairs)
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    return "masters " + ",".join(ctx.masters.values())


async def _one_way(ctx: FaultCtx) -> str:
    inbound = ctx.run % 2 == 0
    pairs = [(s, m) if inbound else (m, s) for m in ctx.masters.values() for s in ctx.services]
    await ctx.cut(pairs)
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    cp = "etcd" if ctx.cluster.etcd is not None else "controller"
    return f"{cp}+namesrv -/-> master" if inbound else f"master -/-> {cp}+namesrv"


async def _pause_master(ctx: FaultCtx) -> str:
    for m in ctx.masters.values():
        ctx.cluster.pause(m)
    try:
        await ctx.hold(1.5 * ctx.lease)
    finally:
        for m in ctx.masters.values():
            ctx.cluster.resume(m)
    return "paused " + ",".join(ctx.masters.values())


async def _isolate_controller(ctx: FaultCtx) -> str:
    if ctx.cluster.etcd is not None:
        # Every member cut off from every broker and name server, not from each other (etcd
        # keeps its quorum, nobody reaches it) and not from the client, which reads the keys.
        others = [n for n in ctx.nodes if n not in ETCD_NODES and n != CLIENT]
        await ctx.cut([p for e in ETCD_NODES for p in ctx.isolate(e, others)])
        await ctx.hold(2 * ctx.lease)
        ctx.net.heal_all()
        return "etcd cut off from brokers and name servers"
    await ctx.cut(ctx.isolate("ctl", [n for n in ctx.nodes if n != "ctl"]))
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    return "controller isolated"


async def _isolate_slave(ctx: FaultCtx) -> str:
    pairs = [p for s in ctx.slaves.values() for p in ctx.isolate(s, [n for n in ctx.nodes if n != s])]
    await ctx.cut(pairs)
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    return "slaves " + ",".join(ctx.slaves.values())


async def _cut_during_promotion(ctx: FaultCtx) -> str:
    old = {g: m for g, m in ctx.masters.items()}
    await ctx.cut([p for g, m in old.items() for p in ctx.isolate(m, [*ctx.services, ctx.slaves[g]])])
    deadline = time.monotonic() + 4 * ctx.lease
    promoted: set[str] = set()
    while time.monotonic() < deadline and len(promoted) < len(old):
        infos = await ctx.cluster.masters()
        for g, info in infos.items():
            if g not in promoted and info is not None and info.master_addr \
                    and ctx.cluster.node_of(info.master_addr) == ctx.slaves[g]:
                promoted.add(g)
                for src, dst in list(ctx.net.cuts):
                    if old[g] in (src, dst):
                        ctx.net.heal(src, dst)
                await ctx.cut(ctx.isolate(ctx.slaves[g], ctx.control))
        await asyncio.sleep(0.05)
    await ctx.hold(1.5 * ctx.lease)
    ctx.net.heal_all()
    return f"promoted then cut: {','.join(sorted(promoted)) or 'none'}"


async def _lost_replies(ctx: FaultCtx) -> str:
    for _ in range(3):
        await asyncio.sleep(ctx.rng.uniform(0.3, 1.0))
        await ctx.cut([(m, CLIENT) for m in ctx.masters.values()])
        await asyncio.sleep(ctx.rng.uniform(2.5, 4.0))  # longer than the send time-out
        ctx.net.heal_all()
    return "3 reply black-outs"


# --- faults of etcd itself ----------------------------------------------------------------------
def _etcd(ctx: FaultCtx):
    assert ctx.cluster.etcd is not None, "an etcd scenario on a controller cluster"
    return ctx.cluster.etcd


async def _etcd_leader(ctx: FaultCtx) -> int:
    return await asyncio.to_thread(_etcd(ctx).leader)


async def _isolate_etcd_member(ctx: FaultCtx) -> str:
    etcd = _etcd(ctx)
    leader = await _etcd_leader(ctx)
    victim = leader if ctx.run % 2 == 0 else (leader + 1) % etcd.size
    node = etcd.node_of(victim)
    await ctx.cut(ctx.isolate(node, [n for n in ctx.nodes if n != node]))
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    return f"etcd member {node} ({'leader' if victim == leader else 'follower'}) isolated"


async def _kill_etcd_leader(ctx: FaultCtx) -> str:
    etcd = _etcd(ctx)
    leader = await _etcd_leader(ctx)
    await asyncio.to_thread(etcd.kill, leader)
    await ctx.hold(2 * ctx.lease)
    await asyncio.to_thread(etcd.start_member, leader)
    return f"etcd leader {etcd.node_of(leader)} SIGKILLed, restarted"


async def _etcd_majority_down(ctx: FaultCtx) -> str:
    etcd = _etcd(ctx)
    leader = await _etcd_leader(ctx)
    victims = [leader, (leader + 1 + ctx.rng.randrange(etcd.size - 1)) % etcd.size]
    for v in victims:
        await asyncio.to_thread(etcd.kill, v)
    t_lost = time.monotonic()
    await ctx.hold(2 * ctx.lease)
    t_back = time.monotonic()
    for v in victims:
        etcd.start_member(v, wait=False)
    ctx.marks["quorum_lost"] = [t_lost, t_back]
    await asyncio.to_thread(etcd.wait_healthy)
    return f"etcd members {','.join(etcd.node_of(v) for v in victims)} SIGKILLed, restarted"


async def _master_cut_from_etcd(ctx: FaultCtx) -> str:
    await ctx.cut([p for m in ctx.masters.values() for p in ctx.isolate(m, list(ETCD_NODES))])
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    return "masters " + ",".join(ctx.masters.values()) + " cut off from etcd"


async def _pause_etcd_leader(ctx: FaultCtx) -> str:
    etcd = _etcd(ctx)
    leader = await _etcd_leader(ctx)
    etcd.pause(leader)
    try:
        # etcd's election time-out is etcd.election_ms; a follower campaigns within twice it.
        await asyncio.sleep(2 * etcd.election_ms / 1000 + ctx.rng.uniform(0.5, ctx.lease))
    finally:
        etcd.resume(leader)
    return f"etcd leader {etcd.node_of(leader)} paused"


async def _isolate_namesrv(ctx: FaultCtx) -> str:
    node = ("ns1", "ns2")[ctx.run % 2]
    await ctx.cut(ctx.isolate(node, [n for n in ctx.nodes if n != node]))
    await ctx.hold(2 * ctx.lease)
    ctx.net.heal_all()
    return f"name server {node} isolated"


FAULTS: dict[str, Callable[[FaultCtx], Awaitable[str]]] = {
    "a": _isolate_master, "b": _one_way, "c": _pause_master, "d": _isolate_controller,
    "e": _isolate_slave, "f": _cut_during_promotion, "g": _lost_replies,
    "h": _isolate_etcd_member, "i": _kill_etcd_leader, "j": _etcd_majority_down,
    "k": _master_cut_from_etcd, "l": _pause_etcd_leader, "m": _isolate_namesrv}


# --- one run -----------------------------------------------------------------------------------
async def apply_fault(cfg: PartitionsConfig, cluster: NsCluster, net: Network, rng: random.Random,
                      run: int, masters: dict[str, str], slaves: dict[str, str], scenario: str,
                      rec: Recorder, result: RunResult) -> float:
    """Run ``scenario``'s fault, then heal everything whatever happened (cuts, paused
    masters); records the fault's window and the cuts proved.  Returns the heal's time."""
    lease = cluster.lease
    ctx = FaultCtx(cluster, net, rng, lease, run, masters, slaves)
    t_fault = time.monotonic()
    try:
        result.detail = await FAULTS[scenario](ctx)
    finally:
        net.heal_all()
        for m in masters.values():
            cluster.resume(m)
        await asyncio.to_thread(cluster.restore)
    t_heal = time.monotonic()
    bound = gap_bound(lease) if scenario in MINORITY else None
    rec(type="fault", scenario=scenario, mono=t_fault, until=t_heal + 2 * lease, lease=lease,
        gap_bound=bound, **ctx.marks)
    result.cuts_proved, result.cuts_unproved = ctx.proved, ctx.unproved
    return t_heal


async def poll_masters(cluster: NsCluster, rec: Recorder, stop: asyncio.Event) -> None:
    """Record a ``master`` event each time the controller names another master or epoch."""
    last_seen: dict[str, tuple[str, int]] = {}
    while not stop.is_set():
        for g, info in (await cluster.masters()).items():
            if info is None:
                continue
            seen = (info.master_addr if info.master_id is not None else "", info.master_epoch)
            if last_seen.get(g) != seen:
                last_seen[g] = seen
                rec(type="master", group=g, master=seen[0], epoch=seen[1])
        await asyncio.sleep(0.1)


async def _settle(namesrv: str, timeout: float) -> dict[str, int | None]:
    """Pending halves per group once none is left, or at the deadline."""
    deadline = time.monotonic() + timeout
    pending: dict[str, int | None] = {g.name: None for g in GROUPS}
    while time.monotonic() < deadline:
        try:
            async with AdminClient(namesrv, timeout=2.0) as admin:
                docs = await admin.status()
        except (ClientError, OSError, TimeoutError):
            docs = {}
        for g in GROUPS:
            doc = docs.get(g.name) or {}
            if "pendingHalfMessages" in doc:
                pending[g.name] = int(doc["pendingHalfMessages"])
        if all(v == 0 for v in pending.values()):
            break
        await asyncio.sleep(0.5)
    return pending


async def _full_read(namesrv: str, group: str, topic: str, rec: Recorder, quiet: float = 2.5,
                     timeout: float = 30.0) -> None:
    consumer = Consumer(f"read_{topic}", namesrv, from_where="first", long_poll_timeout=1.0,
                        rebalance_interval=1.0, pull_error_backoff=0.2, request_timeout=2.0)
    consumer.subscribe(topic)
    await consumer.start()
    t0 = last = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            msg = await consumer.poll(0.3)
            now = time.monotonic()
            if msg is not None:
                last = now
                rec(type="read", group=group, key=msg.keys or "", queue=msg.queue_id,
                    offset=msg.queue_offset)
            elif now - last > quiet and now - t0 > 2 * quiet:
                break
    finally:
        await consumer.shutdown()


async def _run_once(cfg: PartitionsConfig, cluster: NsCluster, net: Network, scenario: str,
                    run: int, rng: random.Random, rec: Recorder) -> RunResult:
    result = RunResult(scenario, run)
    infos = await cluster.wait_healthy(cfg.healthy_timeout)
    if infos is None:
        result.error = UNHEALTHY
        return result
    masters = {g: cluster.node_of(i.master_addr) or "?" for g, i in infos.items()}
    slaves = {g.name: next(n for n in g.nodes if n != masters[g.name]) for g in GROUPS}
    topics = {g.name: f"Part{scenario.upper()}{run}{g.name[-1].upper()}{rng.randrange(10**6)}"
              for g in GROUPS}
    namesrv = cluster.namesrv_addr
    async with AdminClient(namesrv) as admin:
        for g in GROUPS:
            await admin.create_topic(topics[g.name], 4, cluster=g.cluster)
    first_ns = namesrv.split(";")[0]
    for g in GROUPS:
        deadline = time.monotonic() + 20
        while await routed_master(first_ns, topics[g.name], g.name) is None:
            if time.monotonic() > deadline:
                result.error = f"the name server never routed {topics[g.name]}"
                return result
            await asyncio.sleep(0.2)

    stop_poll = asyncio.Event()
    ledger = Ledger()
    stop_load = asyncio.Event()
    producers: list[tuple[str, TransactionProducer]] = []
    for g in GROUPS:
        for _ in range(cfg.producers):
            producers.append((g.name, TransactionProducer(
                f"pg_{g.name.replace('-', '_')}", namesrv, listener=LedgerListener(ledger),
                send_timeout=cfg.send_timeout, retries=2)))
    seeds = [rng.random() for _ in producers]

    async def produce(idx: int, group: str, producer: TransactionProducer) -> None:
        prng = random.Random(seeds[idx])
        for i in range(1_000_000):
            if stop_load.is_set():
                return
            key = f"{scenario}{run}-{group}-p{idx}-{i}"
            ledger.begin(key, prng.choice(KINDS))
            rec(type="invoke", group=group, key=key)
            try:
                res = await producer.send_message_in_transaction(
                    Message(topics[group], key.encode(), keys=key), key)
            except SendError as exc:
                refused = exc.code is not None and all(
                    "no answer" not in a and "Error:" not in a for a in exc.attempts)
                ledger.send_failed(key)
                rec(type="fail" if refused else "info", group=group, key=key, error=str(exc)[:300])
                await asyncio.sleep(0.1)
            except (ClientError, OSError, TimeoutError) as exc:
                ledger.send_failed(key)
                rec(type="info", group=group, key=key, error=str(exc)[:300])
                await asyncio.sleep(0.1)
            else:
                host, port, offset = decode_offset_msg_id(res.offset_msg_id)
                t = ledger.txns[key]
                rec(type="ok", group=group, key=key, broker=f"{host}:{port}", offset=offset,
                    status=res.send_status.name, decision=t.truth if t.state == DECIDED else None)
            await asyncio.sleep(0.01)

    poller = asyncio.ensure_future(poll_masters(cluster, rec, stop_poll))
    tasks: list[asyncio.Future] = []
    try:
        for _, p in producers:
            await p.start()
        tasks = [asyncio.ensure_future(produce(i, g, p)) for i, (g, p) in enumerate(producers)]
        await asyncio.sleep(rng.uniform(*cfg.warmup))
        await apply_fault(cfg, cluster, net, rng, run, masters, slaves, scenario, rec, result)
        await asyncio.sleep(cfg.after_heal)
        stop_load.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        pending = await _settle(namesrv, cfg.settle_timeout)
        for g in GROUPS:
            await _full_read(namesrv, g.name, topics[g.name], rec)
            rec(type="pending", group=g.name, count=pending[g.name] if pending[g.name] is not None else -1)
    finally:
        stop_load.set()
        stop_poll.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(poller, *tasks, return_exceptions=True)
        for _, p in producers:
            with contextlib.suppress(Exception):
                await p.shutdown()
    for g in GROUPS:
        result.verdicts[g.name] = check(rec.events, g.name, g.role)
    return result


# --- the whole bench ---------------------------------------------------------------------------
def run_partitions(cfg: PartitionsConfig, progress: Callable[[str], None] = print) -> list[RunResult]:
    """Every scenario ``cfg.runs`` times; raises NetnsUnavailable when namespaces cannot be used."""
    tmp = None
    if cfg.work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="txbroker-partitions-")
        root = Path(tmp.name)
    else:
        root = Path(cfg.work_dir)
        root.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    try:
        with Network(nodes_for(cfg.etcd), prefix=cfg.prefix, subnet=cfg.net_subnet) as net, \
                net.inside(CLIENT):
            asyncio.run(_all(cfg, net, root, results, progress))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return results


async def _all(cfg: PartitionsConfig, net: Network, root: Path, results: list[RunResult],
               progress: Callable[[str], None]) -> None:
    rng = random.Random(cfg.seed)
    settings = ClusterSettings(lease=cfg.lease, kafka=cfg.kafka, etcd=cfg.etcd)
    run_once, line = _run_once, _progress_line
    if cfg.kafka:
        from txbroker.bench.chaos import kafka_partitions  # it builds on this module

        run_once, line = kafka_partitions.run_once, kafka_partitions.progress_line
    for scenario in cfg.scenarios:
        cluster = NsCluster(net, root / f"scenario-{scenario}", settings)
        progress(f"[{scenario}] {scenario_name(scenario, cfg.etcd)}: starting the cluster"
                 f"{' (etcd)' if cfg.etcd else ''}")
        try:
            await asyncio.to_thread(cluster.start)
            for run in range(cfg.runs):
                rec = Recorder()
                try:
                    r = await asyncio.wait_for(run_once(cfg, cluster, net, scenario, run, rng, rec),
                                               cfg.run_timeout)
                except TimeoutError:
                    r = RunResult(scenario, run, error=f"run cut short after {cfg.run_timeout:.0f}s")
                    net.heal_all()
                except (RuntimeError, OSError) as exc:  # a fault not made or undone: this run's error
                    r = RunResult(scenario, run, error=f"{CRASHED}: {type(exc).__name__}: {exc}")
                    net.heal_all()
                rec.write(cluster.root / f"history-{scenario}{run}.jsonl")
                results.append(r)
                progress(line(r, cfg.runs))
                fresh = r.error == UNHEALTHY or (r.error or "").startswith(CRASHED)
                if fresh and run + 1 < cfg.runs:
                    # The group did not recover from the last fault, or a fault was not undone
                    # (a finding in itself, kept in this run's result): the next runs get a
                    # fresh cluster.
                    await asyncio.to_thread(cluster.stop)
                    cluster = NsCluster(net, root / f"scenario-{scenario}-from-run{run + 2}", settings)
                    progress(f"[{scenario}] the cluster did not recover: starting a fresh one "
                             f"(logs of the old one kept)")
                    await asyncio.to_thread(cluster.start)
        finally:
            net.heal_all()
            await asyncio.to_thread(cluster.stop)


def _progress_line(r: RunResult, runs: int) -> str:
    head = f"[{r.scenario} {r.run + 1}/{runs}] {r.detail}"
    if r.error:
        return f"{head}: ERROR {r.error}"
    parts = [f"cuts proved {r.cuts_proved}" + (f" (UNPROVED {r.cuts_unproved})" if r.cuts_unproved else "")]
    for v in r.verdicts.values():
        bound = _first(v.gap_bounds_s)
        parts.append(f"{v.mode}: promo {_fmt(_first(v.promotions_s))}s gap {v.longest_gap_s:.1f}s "
                     f"fault gap {_fmt(_first(v.fault_gaps_s))}s"
                     + (f" (bound {bound:.1f}s)" if bound is not None else "")
                     + f" ok {v.oks} lost {len(v.lost)} split {len(v.split_brain)} -> {v.verdict}")
    return head + " | " + " | ".join(parts)


def _first(values: list[float | None]) -> float | None:
    return next((v for v in values if v is not None), None)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def report(results: list[RunResult]) -> str:
    """One row per scenario and mode: promotion time, longest gap, anomalies, verdict."""
    head = (f"{'scenario':<9}{'mode':<13}{'runs':>5}{'promo s med/max':>17}{'gap s max':>10}"
            f"{'fault gap s':>12}{'bound':>6}"
            f"{'split':>6}{'lost':>6}{'lostNR':>7}{'dup':>5}{'wrong':>6}{'pend':>5}{'noQ':>4}"
            f"{'ASYNC win s':>12}  verdict")
    lines = [head, "-" * len(head)]
    for scenario in dict.fromkeys(r.scenario for r in results):
        runs = [r for r in results if r.scenario == scenario]
        errors = [r for r in runs if r.error]
        for g in GROUPS:
            vs = [r.verdicts[g.name] for r in runs if g.name in r.verdicts]
            promos = [p for v in vs for p in v.promotions_s if p is not None]
            bad = [v for v in vs if not v.ok]
            wins = [v.loss_window_s for v in vs if v.loss_window_s is not None]
            fgaps = [g for v in vs for g in v.fault_gaps_s if g is not None]
            never = sum(g is None for v in vs for g in v.fault_gaps_s)
            bounds = [b for v in vs for b in v.gap_bounds_s if b is not None]
            fgap = _fmt(max(fgaps, default=None)) + (f"+{never}x" if never else "")
            verdict = "PASS" if not bad and not errors else \
                f"FAIL {len(bad)}/{len(runs)} runs" + (f", {len(errors)} errors" if errors else "")
            lines.append(
                f"{scenario:<9}{g.role:<13}{len(vs):>5}"
                f"{_fmt(statistics.median(promos) if promos else None) + ' / ' + _fmt(max(promos, default=None)):>17}"
                f"{max((v.longest_gap_s for v in vs), default=0.0):>10.1f}"
                f"{fgap:>12}{_fmt(max(bounds, default=None)):>6}"
                f"{sum(len(v.split_brain) for v in vs):>6}{sum(len(v.lost) for v in vs):>6}"
                f"{sum(len(v.lost_unreplicated) for v in vs):>7}{sum(len(v.duplicated) for v in vs):>5}"
                f"{sum(len(v.aborted_reads) + len(v.unknown_reads) for v in vs):>6}"
                f"{sum(max(v.pending or 0, 0) for v in vs):>5}"
                f"{sum(len(v.acked_without_quorum) for v in vs):>4}"
                f"{_fmt(max(wins, default=None)):>12}  {verdict}")
    unproved = sum(r.cuts_unproved for r in results)
    lines.append(f"cuts proved silent: {sum(r.cuts_proved for r in results)}, unproved: {unproved}")
    lines.append("RESULT: " + ("PASS" if all(r.ok for r in results) else "FAIL"))
    return "\n".join(lines)
