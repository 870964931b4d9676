"""Kafka clients on txbroker, beside the RocketMQ protocol: ``python -m txbroker.bench.kafka``.

One ``txbroker serve --kafka-port 0`` runs in its own process (ephemeral ports, temp data dir)
and this process drives it, one row after the other:

* **kafka plain** — one aiokafka producer (acks=all), sends pipelined (up to ``--in-flight``
  unanswered), 100-byte values over the topic's 4 partitions;
* **kafka txn N** — ``--txn-producers`` transactional aiokafka producers at once (one
  transactional id each), each committing transactions of N = 1, 10 and 100 messages (begin,
  N sends, commit) one after the other;
* **kafka read_committed** — one aiokafka consumer (``isolation_level=read_committed``, no
  group, partitions assigned) draining everything the rows above stored, from offset 0;
* **rocketmq tx** / **rocketmq plain** — the txbroker SDK's committed transactions and plain
  sends, measured by ``bench.broker``'s own row (``run_row``, SDK client, ``--rmq-producers``
  coroutines on one shared producer), each on a fresh ``bench.broker.BrokerProc`` (same flush
  mode and segment size; its consumer group starts from nothing, as in ``bench.broker``).

Each row is bounded by ``--seconds`` and ``--max-messages``.  Per row: messages, msgs/s, and
the broker process's CPU µs per message (``/proc/<pid>/stat`` read before and after the row,
as ``bench.broker`` does; the kernel counts 10 ms ticks, so a tiny run's figure is coarse) and
this load process's (``time.process_time``: the Kafka client's own cost, often the larger one
on this 2-core machine, where client and broker share the cores).
Then the three targets of docs/kafka.md, each met or not met:

* Kafka plain produce CPU/msg ≤ 1.5 × the RocketMQ plain send CPU/msg;
* transactions of 100 messages reach ≥ 70 % of plain produce msgs/s;
* the read_committed consumer drains ≥ 50,000 msgs/s.

``--json`` prints the rows and targets as one JSON document instead of the table.

``--cluster`` runs ``bench.kafka_cluster`` instead: one broker vs two broker groups, and the
produce stall through a failover.  ``--tls`` runs ``bench.kafka_tls`` instead: plaintext vs TLS
(``security.protocol=SSL``), interleaved, and the TLS cost in % of plaintext tx/s.

Usage: ``python -m txbroker.bench.kafka [--seconds 3] [--max-messages 300000]
[--in-flight 1000] [--rmq-producers 64] [--txn-producers 4] [--cluster | --tls [--rounds 3]]
[--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Self

import orjson

from txbroker.bench.broker import REPO, BrokerProc, proc_cpu_seconds, run_row
from txbroker.bench.extras import require, run_main
from txbroker.bench.pki import ThrowawayPki
from txbroker.client.admin import AdminClient

TOPIC = "BenchKafka"
PARTITIONS = 4
VALUE = b"v" * 100
TXN_SIZES = (1, 10, 100)
READY = re.compile(rb"txbroker ready broker=(\S+) namesrv=(\S+) kafka=(\S+)")
#: Seconds the consumer row may take beyond ``--seconds`` to drain the backlog.
DRAIN_SECONDS = 30.0
#: ``bench.broker.run_row`` also reports ratios to a raw echo; this bench does not use them.
NO_ECHO = (1.0, 1.0)
#: The targets (docs/kafka.md): Kafka plain CPU/msg over RocketMQ send CPU/msg at most, 100-msg
#: transactions' msgs/s over plain at least, read_committed consumer msgs/s at least.
CPU_RATIO_MAX = 1.5
TXN_SHARE_MIN = 0.70
CONSUMER_MIN = 50_000.0


class KafkaBroker:
    """A ``txbroker serve`` subprocess with its name server and its Kafka listener on
    ephemeral ports; ``addr``, ``namesrv`` and ``cpu()`` as ``bench.broker.BrokerProc`` has
    them, so that module's rows run against it too.  With ``pki`` every port speaks TLS only
    (``tls_mode=enforcing``) and :attr:`client_options` make aiokafka verify it."""

    def __init__(self, data_dir: str, pki: ThrowawayPki | None = None) -> None:
        self.data_dir = data_dir
        self.pki = pki
        self.proc: subprocess.Popen | None = None
        self.addr = self.namesrv = self.kafka = ""
        #: What every aiokafka client of this broker is given besides its bootstrap address.
        self.client_options: dict[str, object] = {} if pki is None else {
            "security_protocol": "SSL", "ssl_context": pki.client_context()}

    def __enter__(self) -> Self:
        cmd = [sys.executable, "-P", "-m", "txbroker", "serve",
               "--broker-port", "0", "--namesrv-port", "0", "--kafka-port", "0",
               "--data-dir", self.data_dir, "--flush-mode", "async",
               "--default-queue-nums", str(PARTITIONS), "--segment-size", str(256 * 1024 * 1024),
               "--log-level", "WARNING", "--transaction-check-interval", "60",
               "--transaction-timeout", "60", *(self.pki.serve_args() if self.pki else ())]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            m = READY.search(line)
            if m:
                self.addr, self.namesrv, self.kafka = (g.decode() for g in m.groups())
                return self
            if not line and self.proc.poll() is not None:
                break
        self.__exit__()
        raise RuntimeError(f"broker with a Kafka listener did not start: {line!r}")

    def cpu(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class RowResult:
    """One row's figures."""

    row: str
    messages: int
    seconds: float
    msgs_per_s: float
    broker_us_per_msg: float
    client_us_per_msg: float


def _result(row: str, messages: int, seconds: float, broker_s: float, client_s: float) -> RowResult:
    count = max(messages, 1)
    return RowResult(row=row, messages=messages, seconds=seconds,
                     msgs_per_s=messages / seconds if seconds > 0 else 0.0,
                     broker_us_per_msg=broker_s * 1e6 / count,
                     client_us_per_msg=client_s * 1e6 / count)


async def kafka_plain(broker: KafkaBroker, seconds: float, max_messages: int,
                      in_flight: int) -> RowResult:
    """Pipelined plain sends; a message counts when its produce answer came back."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=broker.kafka, acks="all", linger_ms=5,
                                **broker.client_options)
    await producer.start()
    try:
        loop = asyncio.get_running_loop()
        cpu0, client0, t0 = broker.cpu(), time.process_time(), loop.time()
        stop_at, done, pending = t0 + seconds, 0, []
        while done + len(pending) < max_messages and loop.time() < stop_at:
            pending.append(await producer.send(TOPIC, VALUE))
            if len(pending) >= in_flight:
                await asyncio.gather(*pending)
                done, pending = done + len(pending), []
        await asyncio.gather(*pending)
        done += len(pending)
        elapsed, cpu1, client1 = loop.time() - t0, broker.cpu(), time.process_time()
    finally:
        await producer.stop()
    return _result("kafka plain", done, elapsed, cpu1 - cpu0, client1 - client0)


async def kafka_txn(broker: KafkaBroker, per_txn: int, seconds: float, max_messages: int,
                    producers: int) -> RowResult:
    """Committed transactions of ``per_txn`` messages: ``producers`` transactional producers
    (one transactional id each) at once, each running its transactions one after the other.

    One producer alone waits for AddPartitionsToTxn, its produce and EndTxn in turn at every
    commit, so its rate measures round trips; several at once measure what the broker can
    carry, the way plain sends are measured pipelined."""
    from aiokafka import AIOKafkaProducer

    clients = [AIOKafkaProducer(bootstrap_servers=broker.kafka, linger_ms=5,
                                transactional_id=f"bench-txn-{per_txn}-{i}",
                                **broker.client_options)
               for i in range(producers)]
    await asyncio.gather(*(c.start() for c in clients))
    loop = asyncio.get_running_loop()
    budget = max_messages // producers
    done = [0] * producers

    async def run(i: int, producer: AIOKafkaProducer, stop_at: float) -> None:
        while done[i] + per_txn <= budget and loop.time() < stop_at:
            async with producer.transaction():
                futures = [await producer.send(TOPIC, VALUE) for _ in range(per_txn)]
            await asyncio.gather(*futures)
            done[i] += per_txn

    try:
        cpu0, client0, t0 = broker.cpu(), time.process_time(), loop.time()
        await asyncio.gather(*(run(i, c, t0 + seconds) for i, c in enumerate(clients)))
        elapsed, cpu1, client1 = loop.time() - t0, broker.cpu(), time.process_time()
    finally:
        await asyncio.gather(*(c.stop() for c in clients))
    return _result(f"kafka txn {per_txn}", sum(done), elapsed, cpu1 - cpu0, client1 - client0)


async def kafka_consume(broker: KafkaBroker, backlog: int, seconds: float) -> RowResult:
    """One read_committed consumer draining ``backlog`` messages from offset 0 (bounded)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.kafka, group_id=None,
                                isolation_level="read_committed", auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        loop = asyncio.get_running_loop()
        cpu0, client0, t0 = broker.cpu(), time.process_time(), loop.time()
        deadline, seen = t0 + seconds + DRAIN_SECONDS, 0
        while seen < backlog and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=200, max_records=10_000)
            seen += sum(len(records) for records in batches.values())
        elapsed, cpu1, client1 = loop.time() - t0, broker.cpu(), time.process_time()
    finally:
        await consumer.stop()
    return _result("kafka read_committed", seen, elapsed, cpu1 - cpu0, client1 - client0)


async def rocketmq(kind: str, producers: int, seconds: float, max_messages: int) -> RowResult:
    """``bench.broker``'s SDK row (``kind`` tx or plain, one shared producer) on a fresh broker
    process, end to end: a message counts when its consumer has seen it."""
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-kafka-rmq-") as d, \
            BrokerProc("async", d) as broker:
        r = await run_row(broker, kind, "sdk", producers, True, seconds, max_messages, NO_ECHO)
    return RowResult(row=f"rocketmq {kind}", messages=int(r.seen), seconds=r.seconds,
                     msgs_per_s=r.tps, broker_us_per_msg=r.broker_us, client_us_per_msg=r.client_us)


async def run_all(broker: KafkaBroker, seconds: float, max_messages: int, in_flight: int,
                  rmq_producers: int, txn_producers: int) -> list[RowResult]:
    """Every row, in the order the module docstring lists them."""
    async with AdminClient(broker.namesrv) as admin:
        await admin.create_topic(TOPIC, PARTITIONS)
    rows = [await kafka_plain(broker, seconds, max_messages, in_flight)]
    for size in TXN_SIZES:
        rows.append(await kafka_txn(broker, size, seconds, max_messages, txn_producers))
    rows.append(await kafka_consume(broker, sum(r.messages for r in rows), seconds))
    for kind in ("tx", "plain"):
        rows.append(await rocketmq(kind, rmq_producers, seconds, max_messages))
    return rows


def targets(rows: list[RowResult]) -> list[dict]:
    """The three targets: name, the measured value, the bound, and whether it is met."""
    by = {r.row: r for r in rows}
    plain, send = by["kafka plain"], by["rocketmq plain"]
    cpu_ratio = plain.broker_us_per_msg / send.broker_us_per_msg if send.broker_us_per_msg else 0.0
    share = by["kafka txn 100"].msgs_per_s / plain.msgs_per_s if plain.msgs_per_s else 0.0
    consumer = by["kafka read_committed"].msgs_per_s
    return [
        {"target": "Kafka plain CPU/msg over RocketMQ send CPU/msg", "value": cpu_ratio,
         "bound": f"<= {CPU_RATIO_MAX}", "met": 0 < cpu_ratio <= CPU_RATIO_MAX},
        {"target": "100-msg transactions msgs/s over plain msgs/s", "value": share,
         "bound": f">= {TXN_SHARE_MIN}", "met": share >= TXN_SHARE_MIN},
        {"target": "read_committed consumer msgs/s", "value": consumer,
         "bound": f">= {CONSUMER_MIN:,.0f}", "met": consumer >= CONSUMER_MIN},
    ]


def print_table(rows: list[RowResult], goals: list[dict], seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Kafka and RocketMQ protocols on one broker ({seconds:g} s per row)")
    for col in ("row", "messages", "msgs/s", "broker µs/msg", "client µs/msg"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in rows:
        table.add_row(r.row, f"{r.messages:,}", f"{r.msgs_per_s:,.0f}", f"{r.broker_us_per_msg:.1f}",
                      f"{r.client_us_per_msg:.1f}")
    console = Console(width=120)
    console.print(table)
    for goal in goals:
        value = goal["value"]
        shown = f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
        console.print(f"{goal['target']}: {shown} (target {goal['bound']}): "
                      f"{'met' if goal['met'] else 'not met'}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="load time per row")
    ap.add_argument("--max-messages", type=int, default=300_000,
                    help="messages per row at most (bounds a fast run)")
    ap.add_argument("--in-flight", type=int, default=1000,
                    help="unanswered plain Kafka sends at most")
    ap.add_argument("--rmq-producers", type=int, default=64,
                    help="producer coroutines of the RocketMQ rows (on one SDK producer)")
    ap.add_argument("--txn-producers", type=int, default=4,
                    help="transactional Kafka producers at once in the transaction rows")
    ap.add_argument("--tls", action="store_true",
                    help="plaintext vs TLS, interleaved, and the TLS cost (bench.kafka_tls)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --tls: rounds of the interleaved comparison (medians reported)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--cluster", action="store_true",
                    help="one broker vs two broker groups, and a failover (bench.kafka_cluster)")
    args = ap.parse_args(argv)
    import uvloop

    require("aiokafka")  # before the broker starts, not at the first Kafka row
    if args.cluster:
        from txbroker.bench import kafka_cluster

        doc = kafka_cluster.run(args.seconds, args.max_messages, args.in_flight, args.txn_producers)
        if args.json:
            print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        else:
            kafka_cluster.print_report(doc)
        return doc
    if args.tls:
        from txbroker.bench import kafka_tls

        doc = kafka_tls.run(args.seconds, args.max_messages, args.in_flight, args.txn_producers,
                            args.rounds)
        if args.json:
            print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        else:
            kafka_tls.print_report(doc)
        return doc
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-kafka-") as d, KafkaBroker(d) as broker, \
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        rows = runner.run(run_all(broker, args.seconds, args.max_messages, args.in_flight,
                                  args.rmq_producers, args.txn_producers))
    goals = targets(rows)
    doc = {"seconds": args.seconds, "rows": [asdict(r) for r in rows], "targets": goals}
    if args.json:
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        print_table(rows, goals, args.seconds)
    return doc


if __name__ == "__main__":
    run_main(main, "python -m txbroker.bench.kafka")
