"""The fault scenarios of :mod:`txbroker.bench.chaos.partitions`, driven by Kafka clients.

``python -m txbroker.bench.chaos --partitions --kafka [--scenario a,b] [--runs 5] [--seed 1]``.
The same cluster in network namespaces (a controller, two name servers, a SYNC_MASTER group
``broker-a`` and an ASYNC_MASTER group ``broker-b``), every broker with its Kafka listener open
(Kafka node 1 = ``broker-a``, node 2 = ``broker-b``, on master and slave alike, so a node keeps
its id through a failover), and the same faults (a)-(g).  Each run creates three topics of
two queues per group, so partitions 0-1 are ``broker-a``'s and 2-3 ``broker-b``'s
(docs/kafka.md, "Kafka on a cluster"), and runs three workloads of unmodified aiokafka clients
in the client's namespace, recording a :mod:`~txbroker.bench.chaos.kafka_history` history:

i.   an idempotent producer (acks=all), one sender per partition, one record at a time:
     invoke / ok (with the answered offset) / info per record;
ii.  two transactional producers, one coordinated by each group, whose transactions write one
     record to each of the four partitions (so every commit sends WriteTxnMarkers to the
     other group) and then commit or abort (seeded), recording each decision and whether
     EndTxn answered it;
iii. per group, an exactly-once consume-transform-produce pipeline: it reads the idempotent
     records of its group's partitions (read_committed, offsets in the consumer group, both
     coordinated by that group) and writes one output per input to the same group's
     partitions of the output topic, with the consumed offsets, in one transaction.  A failed
     transaction ends the pipeline's clients; new ones with the same transactional id take
     over (InitProducerId fences and aborts what was open), as an orchestrator would restart
     the application.

After the seeded warm-up the scenario's fault is injected on both groups at once and healed;
the load goes on for a while, then stops; the pipelines run until they have consumed every
input (bounded), and a fresh read_committed consumer reads every partition of the three
topics from offset 0.  :func:`txbroker.bench.chaos.kafka_history.check` judges each group by
its mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from txbroker.bench.chaos.faults import GROUPS, KAFKA_CLUSTER, KAFKA_PORT, NsCluster
from txbroker.bench.chaos.history import SYNC
from txbroker.bench.chaos.kafka_history import IDEM, OUT_SUFFIX, PIPE, TXN, check
from txbroker.bench.chaos.netns import Network
from txbroker.bench.chaos.partitions import (
    UNHEALTHY,
    PartitionsConfig,
    Recorder,
    RunResult,
    apply_fault,
    poll_masters,
)
from txbroker.bench.kafka_cluster import key_on, metadata_leaders
from txbroker.client.admin import AdminClient

#: Queues per group of every topic: partitions 0-1 on broker-a, 2-3 on broker-b.
QUEUES = 2
PARTITIONS = QUEUES * len(GROUPS)
GROUP_OF = {p: GROUPS[p // QUEUES].name for p in range(PARTITIONS)}
LEADERS = [GROUPS[p // QUEUES].kafka_node_id for p in range(PARTITIONS)]
#: Seconds any one client call may take before it counts as indeterminate.
CALL_TIMEOUT = 15.0
#: Seconds a sender waits for one record's acknowledgement before it counts as indeterminate
#: (the client keeps retrying it meanwhile; a little above the clients' request time-out).
RECORD_TIMEOUT = 6.0
#: The idempotent producer is replaced after this many failed records in a row.
IDEM_FAILURES_BEFORE_NEW_PRODUCER = 2
#: After the heal, every producer gets this long to have a record or transaction acknowledged
#: again before the load stops.
RESUME_TIMEOUT = 30.0
#: After the load stops, the pipelines get this long to consume every input.
PIPE_DRAIN_TIMEOUT = 30.0


def _client_settings(bootstrap: str) -> dict[str, Any]:
    """Short client timings: a request unanswered for 5 s counts as lost and is retried."""
    return {"bootstrap_servers": bootstrap, "request_timeout_ms": 5000, "retry_backoff_ms": 100,
            "metadata_max_age_ms": 2000}


async def _quietly_stop(*clients: Any) -> None:
    for c in clients:
        if c is None:
            continue
        with contextlib.suppress(Exception):
            await asyncio.wait_for(c.stop(), 10.0)


class Load:
    """The three workloads of one run, recording into ``rec``."""

    def __init__(self, bootstrap: str, topics: dict[str, str], prefix: str, rng: random.Random,
                 rec: Recorder) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.prefix = prefix
        self.rng = rng
        self.rec = rec
        self.stop = asyncio.Event()
        self.inputs_done = asyncio.Event()  # set once no more idempotent records will be sent
        self.pipe_positions: dict[str, dict[int, int]] = {g.name: {} for g in GROUPS}
        #: When each producer (``idem-<partition>``, ``txn-<index>``) last had an ``ok``.
        self.last_ok: dict[str, float] = {}

    async def resumed(self, since: float, timeout: float) -> list[str]:
        """Wait until every producer had an ``ok`` after ``since`` (bounded); returns those
        that had none."""
        deadline = time.monotonic() + timeout
        while True:
            behind = sorted(k for k, t in self.last_ok.items() if t <= since)
            if not behind or time.monotonic() >= deadline:
                return behind
            await asyncio.sleep(0.1)

    # --- i. idempotent records -----------------------------------------------------------------
    async def idempotent(self) -> None:
        holder: dict[str, AIOKafkaProducer | None] = {"p": None}
        lock = asyncio.Lock()
        #: Failed records in a row per partition: one partition's sender may be wedged in the
        #: client (aiokafka 0.14 can lose a batch it re-enqueues twice) while the others run.
        failures = [0] * PARTITIONS

        async def producer() -> AIOKafkaProducer:
            async with lock:
                if holder["p"] is None:
                    p = AIOKafkaProducer(**_client_settings(self.bootstrap), acks="all",
                                         enable_idempotence=True, linger_ms=2)
                    try:
                        await asyncio.wait_for(p.start(), CALL_TIMEOUT)
                    except BaseException:
                        await _quietly_stop(p)
                        raise
                    holder["p"] = p
                return holder["p"]

        async def renew() -> None:
            async with lock:
                old, holder["p"] = holder["p"], None
            await _quietly_stop(old)

        async def sender(partition: int) -> None:
            group = GROUP_OF[partition]
            for i in range(1_000_000):
                if self.stop.is_set():
                    return
                value = f"{self.prefix}-i{partition}-{i}"
                self.rec(type="invoke", wl=IDEM, key=value, group=group, partition=partition)
                try:
                    p = await producer()
                    fut = await asyncio.wait_for(
                        p.send(self.topics[IDEM], value.encode(), partition=partition), CALL_TIMEOUT)
                    md = await asyncio.wait_for(asyncio.shield(fut), RECORD_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - any failure is indeterminate here
                    self.rec(type="info", wl=IDEM, key=value, error=repr(exc)[:300])
                    failures[partition] += 1
                    if failures[partition] >= IDEM_FAILURES_BEFORE_NEW_PRODUCER:
                        failures[partition] = 0
                        await renew()
                    await asyncio.sleep(0.2)
                    continue
                failures[partition] = 0
                self.rec(type="ok", wl=IDEM, key=value, offset=md.offset)
                self.last_ok[f"idem-{partition}"] = time.monotonic()
                await asyncio.sleep(0.005)

        try:
            await asyncio.gather(*(sender(p) for p in range(PARTITIONS)))
        finally:
            self.inputs_done.set()
            await renew()

    # --- ii. transactions over both groups -----------------------------------------------------
    async def transactions(self, index: int, tid: str, seed: float) -> None:
        rng = random.Random(seed)
        producer: AIOKafkaProducer | None = None
        try:
            for i in range(1_000_000):
                if self.stop.is_set():
                    return
                key = f"{self.prefix}-t{index}-{i}"
                decision = "commit" if rng.random() < 0.7 else "abort"
                records = [(f"{key}-{p}", p, GROUP_OF[p]) for p in range(PARTITIONS)]
                self.rec(type="invoke", wl=TXN, key=key, decision=decision, records=records)
                try:
                    if producer is None:
                        producer = AIOKafkaProducer(**_client_settings(self.bootstrap),
                                                    transactional_id=tid,
                                                    transaction_timeout_ms=10_000)
                        await asyncio.wait_for(producer.start(), CALL_TIMEOUT)
                    await asyncio.wait_for(producer.begin_transaction(), CALL_TIMEOUT)
                    futs = [await asyncio.wait_for(producer.send(self.topics[TXN], v.encode(),
                                                                 partition=p), CALL_TIMEOUT)
                            for v, p, _ in records]
                    await asyncio.wait_for(asyncio.gather(*futs), CALL_TIMEOUT)
                    end = producer.commit_transaction if decision == "commit" else \
                        producer.abort_transaction
                    await asyncio.wait_for(end(), CALL_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - the outcome is unknown: a new producer
                    self.rec(type="info", wl=TXN, key=key, error=repr(exc)[:300])
                    await _quietly_stop(producer)
                    producer = None
                    await asyncio.sleep(0.2)
                    continue
                self.rec(type="ok", wl=TXN, key=key)
                self.last_ok[f"txn-{index}"] = time.monotonic()
                await asyncio.sleep(0.01)
        finally:
            await _quietly_stop(producer)

    # --- iii. exactly-once pipeline per group --------------------------------------------------
    async def pipeline(self, group: str, tid: str, consumer_group: str) -> None:
        parts = [p for p in range(PARTITIONS) if GROUP_OF[p] == group]
        tps = [TopicPartition(self.topics[IDEM], p) for p in parts]
        seq = 0
        for _ in range(1000):  # one incarnation per failed transaction, bounded
            if self.stop.is_set() and await self._pipe_caught_up(group, tps):
                return
            consumer = producer = None
            try:
                producer = AIOKafkaProducer(**_client_settings(self.bootstrap), transactional_id=tid,
                                            transaction_timeout_ms=10_000)
                await asyncio.wait_for(producer.start(), CALL_TIMEOUT)
                consumer = AIOKafkaConsumer(**_client_settings(self.bootstrap), group_id=consumer_group,
                                            isolation_level="read_committed",
                                            enable_auto_commit=False, auto_offset_reset="earliest")
                await asyncio.wait_for(consumer.start(), CALL_TIMEOUT)
                consumer.assign(tps)
                while True:
                    batches = await asyncio.wait_for(consumer.getmany(timeout_ms=300, max_records=20),
                                                     CALL_TIMEOUT)
                    records = [(tp, r) for tp, rs in batches.items() for r in rs]
                    if not records:
                        for tp in tps:
                            self.pipe_positions[group][tp.partition] = await asyncio.wait_for(
                                consumer.position(tp), CALL_TIMEOUT)
                        if self.stop.is_set() and await self._pipe_caught_up(group, tps):
                            return
                        continue
                    seq += 1
                    key = f"{self.prefix}-{group}-pipe-{seq}"
                    inputs = [r.value.decode() for _, r in records]
                    self.rec(type="invoke", wl=PIPE, key=key, group=group, inputs=inputs)
                    offsets: dict[TopicPartition, int] = {}
                    for tp, r in records:
                        offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
                    try:
                        await asyncio.wait_for(producer.begin_transaction(), CALL_TIMEOUT)
                        futs = [await asyncio.wait_for(producer.send(
                                    self.topics["out"], (v + OUT_SUFFIX).encode(),
                                    partition=tp.partition), CALL_TIMEOUT)
                                for (tp, _), v in zip(records, inputs, strict=True)]
                        await asyncio.wait_for(asyncio.gather(*futs), CALL_TIMEOUT)
                        await asyncio.wait_for(producer.send_offsets_to_transaction(
                            offsets, consumer_group), CALL_TIMEOUT)
                        await asyncio.wait_for(producer.commit_transaction(), CALL_TIMEOUT)
                    except Exception as exc:  # noqa: BLE001 - unknown outcome: restart the app
                        self.rec(type="info", wl=PIPE, key=key, error=repr(exc)[:300])
                        break
                    self.rec(type="ok", wl=PIPE, key=key)
            except Exception as exc:  # noqa: BLE001 - a client that cannot start: try again
                self.rec(type="note", wl=PIPE, group=group, error=repr(exc)[:300])
            finally:
                await _quietly_stop(consumer, producer)
            await asyncio.sleep(0.3)

    async def _pipe_caught_up(self, group: str, tps: list[TopicPartition]) -> bool:
        """Every input sent, and the pipeline's last positions at the partitions' ends."""
        if not self.inputs_done.is_set():
            return False
        ends = await end_offsets(self.bootstrap, tps)
        return ends is not None and all(
            self.pipe_positions[group].get(tp.partition, -1) >= ends[tp] for tp in tps)


async def end_offsets(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
    consumer = AIOKafkaConsumer(**_client_settings(bootstrap), isolation_level="read_committed",
                                enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), CALL_TIMEOUT)
        return await asyncio.wait_for(consumer.end_offsets(tps), CALL_TIMEOUT)
    except Exception:  # noqa: BLE001 - the caller asks again
        return None
    finally:
        await _quietly_stop(consumer)


async def full_read(bootstrap: str, topic: str, wl: str, rec: Recorder, timeout: float = 60.0) -> str | None:
    """Every record of ``topic``, read_committed, from offset 0 to the end; None, or why not."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    deadline = time.monotonic() + timeout
    last_error = "no attempt"
    while time.monotonic() < deadline:
        consumer = AIOKafkaConsumer(**_client_settings(bootstrap), isolation_level="read_committed",
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        got: list[dict[str, Any]] = []
        try:
            await asyncio.wait_for(consumer.start(), CALL_TIMEOUT)
            consumer.assign(tps)
            ends = await asyncio.wait_for(consumer.end_offsets(tps), CALL_TIMEOUT)
            for tp in tps:
                consumer.seek(tp, 0)
            while time.monotonic() < deadline:
                positions = [await asyncio.wait_for(consumer.position(tp), CALL_TIMEOUT) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                    for ev in got:
                        rec(**ev)
                    return None
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500, max_records=5000),
                                                 CALL_TIMEOUT)
                for tp, rs in batches.items():
                    got += [{"type": "read", "wl": wl, "topic": wl, "partition": tp.partition,
                             "offset": r.offset, "value": r.value.decode(),
                             "group": GROUP_OF[tp.partition]} for r in rs]
        except Exception as exc:  # noqa: BLE001 - read again from the start
            last_error = repr(exc)[:200]
        finally:
            await _quietly_stop(consumer)
        await asyncio.sleep(0.5)
    return f"the full read of {topic} did not finish in {timeout:.0f}s ({last_error})"


async def _views_agree(cluster: NsCluster, topic: str, timeout: float = 30.0) -> str | None:
    """Until every master's Metadata numbers ``topic``'s partitions the same way (groups in
    node-id order), so no client reads a view that knows one group only; None, or what the
    views said at the deadline."""
    deadline = time.monotonic() + timeout
    seen: dict[str, object] = {}
    while time.monotonic() < deadline:
        infos = await cluster.masters()
        hosts = [i.master_addr.rsplit(":", 1)[0] for i in infos.values() if i and i.master_addr]
        seen = {}
        for host in hosts:
            try:
                seen[host] = await asyncio.wait_for(metadata_leaders(f"{host}:{KAFKA_PORT}", topic), 5.0)
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
                seen[host] = repr(exc)
        if len(seen) == len(GROUPS) and all(s == LEADERS for s in seen.values()):
            return None
        await asyncio.sleep(0.3)
    return f"the Kafka views never numbered {topic}'s partitions {LEADERS}: {seen}"


async def run_once(cfg: PartitionsConfig, cluster: NsCluster, net: Network, scenario: str,
                   run: int, rng: random.Random, rec: Recorder) -> RunResult:
    """One run of ``scenario`` under the Kafka workloads (the signature of partitions' own)."""
    # Refused and reset connections are the point of the run: the clients log each one, and
    # aiokafka leaves some of its internal futures' errors unretrieved (asyncio logs those).
    for name in ("aiokafka", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    result = RunResult(scenario, run)
    infos = await cluster.wait_healthy(cfg.healthy_timeout)
    if infos is None:
        result.error = UNHEALTHY
        return result
    masters = {g: cluster.node_of(i.master_addr) or "?" for g, i in infos.items()}
    slaves = {g.name: next(n for n in g.nodes if n != masters[g.name]) for g in GROUPS}
    tag = f"K{scenario.upper()}{run}x{rng.randrange(10**6)}"
    topics = {wl: f"{tag}{wl}" for wl in (IDEM, TXN, "out")}
    async with AdminClient(cluster.namesrv_addr) as admin:
        for t in topics.values():  # QUEUES queues in every group of the cluster
            await admin.create_topic(t, QUEUES, cluster=KAFKA_CLUSTER)
    for t in topics.values():
        result.error = await _views_agree(cluster, t)
        if result.error:
            return result

    load = Load(cluster.kafka_bootstrap, topics, tag, rng, rec)
    tids = [key_on(i, len(GROUPS), f"{tag}-txn") for i in range(len(GROUPS))]
    work: list[Awaitable[None]] = [load.idempotent()]
    work += [load.transactions(i, t, rng.random()) for i, t in enumerate(tids)]
    work += [load.pipeline(g.name, key_on(i, len(GROUPS), f"{tag}-ptx"),
                           key_on(i, len(GROUPS), f"{tag}-pcg")) for i, g in enumerate(GROUPS)]
    stop_poll = asyncio.Event()
    poller = asyncio.ensure_future(poll_masters(cluster, rec, stop_poll))
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        await asyncio.sleep(rng.uniform(*cfg.warmup))
        t_heal = await apply_fault(cfg, cluster, net, rng, run, masters, slaves, scenario, rec,
                                   result)
        behind = await load.resumed(t_heal, RESUME_TIMEOUT)
        resumed = time.monotonic() - t_heal
        result.detail += (f"; producers resumed {resumed:.1f}s after the heal" if not behind else
                          f"; no ok within {RESUME_TIMEOUT:.0f}s of the heal: {','.join(behind)}")
        await asyncio.sleep(cfg.after_heal)
        load.stop.set()
        done, pending = await asyncio.wait(tasks, timeout=PIPE_DRAIN_TIMEOUT + 2 * CALL_TIMEOUT)
        if pending:
            result.error = f"{len(pending)} workload(s) did not finish (the pipelines never caught up)"
        for t in done:
            if t.exception() is not None:
                result.error = f"a workload failed: {t.exception()!r}"[:300]
        for wl in (IDEM, TXN, "out"):
            why = await full_read(cluster.kafka_bootstrap, topics[wl], wl, rec)
            if why is not None:
                result.error = why
    finally:
        load.stop.set()
        stop_poll.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(poller, *tasks, return_exceptions=True)
    for g in GROUPS:
        result.verdicts[g.name] = check(rec.events, g.name, g.role)
    return result


def progress_line(r: RunResult, runs: int) -> str:
    head = f"[{r.scenario} {r.run + 1}/{runs}] {r.detail}"
    if r.error:
        return f"{head}: ERROR {r.error}"
    parts = [f"cuts proved {r.cuts_proved}" + (f" (UNPROVED {r.cuts_unproved})" if r.cuts_unproved else "")]
    for v in r.verdicts.values():
        promo = next((p for p in v.promotions_s if p is not None), None)
        parts.append(f"{v.mode}: promo {'-' if promo is None else f'{promo:.1f}'}s "
                     f"gap {v.longest_gap_s:.1f}s idem ok {v.oks} txn {v.txn_committed}c/"
                     f"{v.txn_aborted}a/{v.txn_unknown}? pipe {v.pipe_inputs} -> {v.verdict}")
    return head + " | " + " | ".join(parts)


def report(results: list[RunResult]) -> str:
    """One row per scenario and mode: records, transactions, pipeline inputs, anomalies."""
    head = (f"{'scenario':<9}{'mode':<13}{'runs':>5}{'gap s max':>10}{'idem ok':>8}{'txn c/a/?':>12}"
            f"{'pipe in':>8}{'lost':>6}{'moved':>6}{'dup':>5}{'txnL':>5}{'torn':>5}{'abrt':>5}"
            f"{'p-miss':>7}{'p-2x':>5}  verdict")
    lines = [head, "-" * len(head)]
    for scenario in dict.fromkeys(r.scenario for r in results):
        runs = [r for r in results if r.scenario == scenario]
        errors = [r for r in runs if r.error]
        for g in GROUPS:
            vs = [r.verdicts[g.name] for r in runs if g.name in r.verdicts]
            bad = [v for v in vs if not v.ok]
            verdict = "PASS" if not bad and not errors else \
                f"FAIL {len(bad)}/{len(runs)} runs" + (f", {len(errors)} errors" if errors else "")

            def total(name: str, vs: list = vs) -> int:
                return sum(len(getattr(v, name)) for v in vs)

            txns = (f"{sum(v.txn_committed for v in vs)}/{sum(v.txn_aborted for v in vs)}/"
                    f"{sum(v.txn_unknown for v in vs)}")
            lines.append(
                f"{scenario:<9}{g.role:<13}{len(vs):>5}"
                f"{max((v.longest_gap_s for v in vs), default=0.0):>10.1f}"
                f"{sum(v.oks for v in vs):>8}{txns:>12}{sum(v.pipe_inputs for v in vs):>8}"
                f"{total('lost'):>6}{total('moved'):>6}{total('duplicated'):>5}{total('txn_lost'):>5}"
                f"{total('torn'):>5}{total('aborted_reads'):>5}{total('pipe_missing'):>7}"
                f"{total('pipe_twice'):>5}  {verdict}")
    lines.append(f"cuts proved silent: {sum(r.cuts_proved for r in results)}, "
                 f"unproved: {sum(r.cuts_unproved for r in results)}")
    lines.append("ASYNC_MASTER rows: lost, moved, txnL, torn, p-miss and p-2x are counted, not judged "
                 f"(only {SYNC} promises them)")
    lines.append("RESULT: " + ("PASS" if all(r.ok for r in results) else "FAIL"))
    return "\n".join(lines)
