"""End-to-end throughput of sends and deliveries and their CPU cost: ``python -m txbroker.bench.broker``.

For each row a fresh ``txbroker serve`` runs in its own process (ephemeral ports, temp data dir)
and this process is the load generator.  Three kinds of row (``--kind``):

* **tx** — committed transactions: P producers loop "half send → answer → END_TRANSACTION
  commit"; one consumer drains the topic.
* **plain** — plain sends: P producers loop "send → wait for the answer"; one consumer drains.
* **delivery** — one consumer drains a backlog preloaded into the topic's 4 queues
  (``--backlog`` messages of 256 B, default 1,000,000, stored beforehand by batched
  SEND_BATCH_MESSAGE requests with the progress on stderr; bounded in time), ``--pull-batch``
  messages per pull (32, the SDK's default).  Only the drain is measured (and profiled).

and two ways of driving each:

* **raw** — the wire protocol through RemotingClient: pre-built SEND_MESSAGE_V2 (and
  END_TRANSACTION) frames; the consumer long-polls every queue and only checks the framing of
  what it pulls.  This measures the broker.
* **sdk** — as a user runs it: P coroutines call ``send_message_in_transaction`` on a
  TransactionProducer whose listener commits (tx) or ``send`` on a Producer (plain); one
  Consumer drains the topic with ``poll``.  This measures broker and SDK together.

``each`` gives every producer coroutine its own connection (raw) or its own producer instance
(sdk); ``shared`` puts them all on one, as producers in one client process usually are.

A message counts when the consumer has *seen* it, so the figures are end to end.  Each send
row loads for a bounded time (``--seconds``) and count (``--max-tx``), then waits (bounded)
for the consumer to catch up.  Per row it prints messages seen, msgs/s (messages seen / time
from the window's start to the last message seen), p50/p99 of one send as the producer sees it
(for tx: half send to END_TRANSACTION written; none for delivery), the broker process's CPU µs
per message (from ``/proc/<pid>/stat``), this load process's CPU µs per message
(``time.process_time``: producers and consumer together), both over the same window, and the
ratio of each to a raw uvloop echo measured in the same pass (64 connections, one request in
flight each, from ``bench/remoting.py``): "× echo rate" is msgs/s over echo round trips/s,
"× echo CPU" is broker CPU per message over echo server CPU per round trip.  Throughput here
is close to 1 / (broker + client CPU per message), since neither side saturates its core; the
CPU columns are the ones to move.  The broker's CPU is counted in 10 ms clock ticks, so a
delivery row needs a backlog that takes well over that to drain.

``--workers 1,2`` runs every send row against ``txbroker serve --workers N`` as well
(docs/workers.md): the topic is created on every worker, the row starts once the name server
routes it to all of them, raw producers are spread over the workers' addresses (producer ``i``
on worker ``i mod N``; ``shared``: one connection per worker) with one raw consumer per worker,
SDK clients spread through the routes, and the broker CPU is that of the supervisor and every
worker process together.  The load generator shares the machine's cores with the workers, so
compare rows of one run.  A delivery row runs on one broker only.

``--repeat N`` runs every row N times, interleaved (fresh broker each time), and prints the
median of each figure.  ``--profile DIR`` samples the broker of every run's measured window
with py-spy (``pip install -e '.[bench]'``) into ``DIR/<row>-<pass>.txt`` (collapsed stacks:
grep them, or open them in speedscope or flamegraph.pl); sampling pauses the broker, so
figures of a profiled run are for finding the cost, not for quoting.

Usage: ``python -m txbroker.bench.broker [--seconds 3] [--kind tx,plain,delivery]
[--producers 1,64] [--flush async,sync] [--client raw,sdk] [--connections each,shared]
[--backlog 1000000] [--pull-batch 32] [--workers 1,2] [--repeat 3] [--profile DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Self

from txbroker.bench.extras import require_program, run_main
from txbroker.bench.pki import ThrowawayPki
from txbroker.bench.remoting import echo_ceiling
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    SendStatus,
    TransactionListener,
    TransactionProducer,
)
from txbroker.remoting.bodies import TopicRouteData
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.tls import ClientTLS
from txbroker.store.record import MESSAGE_MAGIC, encode_batch

TOPIC = "BenchTx"
GROUP = "PG_BENCH"
CONSUMER_GROUP = "CG_BENCH"
QUEUES = 4
READY = re.compile(rb"txbroker ready broker=(\S+) namesrv=(\S+)(?: kafka=\S+)?(?: grpc=\S+)?(?: workers=(\S+))?")
REPO = Path(__file__).resolve().parent.parent
_SIZE_MAGIC = struct.Struct(">iI")
_BODY = b"x" * 200
#: Seconds the consumer may take to catch up after the load stops, and the echo's measured time.
DRAIN_SECONDS = 15.0
ECHO_SECONDS = 1.0
KINDS = ("tx", "plain", "delivery")
#: The delivery row's backlog: body size, messages per preload request, requests in flight,
#: and the bound on the preload's time.
DELIVERY_BODY = 256
PRELOAD_BATCH = 64
PRELOAD_IN_FLIGHT = 8
PRELOAD_SECONDS = 300.0


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, from ``/proc/<pid>/stat``.

    Read from outside so that measuring the broker adds no request to its load; the kernel
    counts in clock ticks (10 ms), well below the seconds a measured window costs.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    rest = stat[stat.rindex(")") + 2:].split()  # comm may hold spaces; fields from 3 on follow
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a ``serve --workers`` supervisor's workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            out.append(int(entry.name))
    return out


class BrokerProc:
    """A ``txbroker serve`` subprocess with its own name server (the SDK finds routes there);
    with ``workers`` > 1 a ``serve --workers N`` supervisor, ``addrs`` every worker's address.
    With ``pki`` it serves TLS only (``tls_mode=enforcing``) with that certificate, and
    ``client_tls`` / ``client_ssl`` are what the SDK and raw connections must use (None:
    plaintext)."""

    def __init__(self, flush: str, data_dir: str, workers: int = 1,
                 pki: ThrowawayPki | None = None) -> None:
        self.flush = flush
        self.data_dir = data_dir
        self.workers = workers
        self.pki = pki
        self.client_tls: ClientTLS | None = pki.client_tls() if pki is not None else None
        self.client_ssl: ssl.SSLContext | None = (pki.client_context() if pki is not None
                                                  else None)
        self.proc: subprocess.Popen | None = None
        self.addr = ""
        self.addrs: list[str] = []
        self.namesrv = ""
        self.worker_pids: list[int] = []

    def __enter__(self) -> Self:
        cmd = [sys.executable, "-P", "-m", "txbroker", "serve",
               "--broker-port", "0", "--namesrv-port", "0", "--data-dir", self.data_dir,
               "--flush-mode", self.flush, "--default-queue-nums", str(QUEUES),
               "--segment-size", str(256 * 1024 * 1024), "--log-level", "WARNING",
               "--transaction-check-interval", "60", "--transaction-timeout", "60"]
        if self.workers > 1:
            cmd += ["--workers", str(self.workers)]
        if self.pki is not None:
            cmd += self.pki.serve_args()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            m = READY.search(line)
            if m:
                self.addr = m.group(1).decode()
                self.namesrv = m.group(2).decode()
                self.addrs = m.group(3).decode().split(";") if m.group(3) else [self.addr]
                self.worker_pids = children_of(self.proc.pid) if self.workers > 1 else []
                return self
            if not line and self.proc.poll() is not None:
                break
        self.__exit__()
        raise RuntimeError(f"broker did not start: {line!r}")

    def cpu(self) -> float:
        """CPU seconds of the broker: with workers, the supervisor's and every worker's."""
        return sum(proc_cpu_seconds(pid) for pid in [self.proc.pid, *self.worker_pids])

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Profiler:
    """py-spy sampling one process into a collapsed-stack file until :meth:`stop`."""

    def __init__(self, pid: int, out: Path) -> None:
        spy = require_program("py-spy")
        self.out = out
        self.proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "200",
                                      "--format", "raw", "--output", str(out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        """SIGINT makes py-spy write what it sampled; wait (bounded) for the file."""
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("py-spy did not finish writing its profile") from None
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")


class ProfileWindow:
    """A :class:`Profiler` of the broker over the measured window of one run, if ``out`` is
    set: :meth:`open` when the window opens (after a delivery row's preload), :meth:`close`
    after the run."""

    def __init__(self, pid: int, out: Path | None) -> None:
        self.pid, self.out = pid, out
        self.spy: Profiler | None = None

    def open(self) -> None:
        if self.out is not None and self.spy is None:
            self.spy = Profiler(self.pid, self.out)

    def close(self) -> None:
        if self.spy is not None:
            self.spy.stop()


@dataclass
class Tally:
    """What the producers and the consumer of one row have done so far."""

    max_tx: int
    started: int = 0
    sent: int = 0
    seen: int = 0
    last_seen: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def may_start(self, stop_at: float) -> bool:
        """The bound on every load loop: time and count."""
        if self.started >= self.max_tx or asyncio.get_running_loop().time() >= stop_at:
            return False
        self.started += 1
        return True


@dataclass
class Result:
    """One run of one row; every field is a figure the table prints (medians over runs)."""

    sent: float
    seen: float
    seconds: float
    tps: float
    p50_ms: float
    p99_ms: float
    broker_us: float
    client_us: float
    echo_rate: float
    echo_cpu: float


# --- raw load: RemotingClient ------------------------------------------------------------------


def _send_request(producer: int, seq: int, born: str, tx: bool,
                  body: bytes = _BODY) -> tuple[RemotingCommand, str]:
    """A message as a RocketMQ Java client sends it (SEND_MESSAGE_V2): a half (sysFlag 4) when
    ``tx``, else a plain message (sysFlag 0)."""
    uniq = f"{os.getpid():08X}{producer:08X}{seq:016X}"
    props = f"UNIQ_KEY\x01{uniq}\x02WAIT\x01true\x02TAGS\x01bench"
    if tx:
        props = f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02" + props
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": str(seq % QUEUES),
        "f": "4" if tx else "0", "g": born, "h": "0", "i": props, "j": "0", "k": "false",
        "m": "false",
    }, body), uniq


def count_records(body: bytes) -> int:
    """Records in a PULL body, walked by their TOTALSIZE and checked by magic code.

    The raw load generator must stay cheap (it shares this 2-core machine with the broker), so
    it validates framing instead of decoding every field.
    """
    n = pos = 0
    end = len(body)
    while pos < end:
        size, magic = _SIZE_MAGIC.unpack_from(body, pos)
        if magic != MESSAGE_MAGIC or size <= 0:
            raise RuntimeError(f"bad record at {pos} in a pull body")
        pos += size
        n += 1
    if pos != end:
        raise RuntimeError("pull body ends inside a record")
    return n


class RawConsumer:
    """One RemotingClient long-polling every queue of the topic from offset 0, counting what it
    pulls into ``tally`` (framing checked, nothing decoded)."""

    def __init__(self, addr: str, tally: Tally, batch: int,
                 ssl: ssl.SSLContext | None = None) -> None:
        self.addr, self.tally, self.batch, self.ssl = addr, tally, batch, ssl
        self.done = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        client = RemotingClient(self.addr, ssl=self.ssl)
        await client.connect()
        self.task = asyncio.create_task(self._consume(client))

    async def _consume(self, client: RemotingClient) -> None:
        loop = asyncio.get_running_loop()
        tally = self.tally

        async def one_queue(qid: int) -> None:
            offset = 0
            while not self.done.is_set():
                cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
                    "consumerGroup": CONSUMER_GROUP, "topic": TOPIC, "queueId": str(qid),
                    "queueOffset": str(offset), "maxMsgNums": str(self.batch), "sysFlag": "6",
                    "commitOffset": "-1", "suspendTimeoutMillis": "1000", "subscription": "*",
                    "subVersion": "0"})
                resp = await client.invoke(cmd, 5.0)
                if resp.code == ResponseCode.SUCCESS:
                    tally.seen += count_records(resp.body)
                    tally.last_seen = loop.time()
                if resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                                 ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED):
                    offset = int(resp.ext_fields.get("nextBeginOffset", offset))
                else:
                    await asyncio.sleep(0.05)

        try:
            await asyncio.gather(*(one_queue(q) for q in range(QUEUES)))
        finally:
            await client.close()

    async def close(self) -> None:
        self.done.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


class SdkConsumer:
    """One Consumer draining the topic with ``poll``, as a user does, counting into ``tally``."""

    def __init__(self, namesrv: str, tally: Tally, batch: int = 32,
                 tls: ClientTLS | None = None) -> None:
        self.tally = tally
        # A short long-poll so that shutdown after the row does not wait out the default 15 s.
        self.consumer = Consumer(CONSUMER_GROUP, namesrv, from_where="first",
                                 long_poll_timeout=1.0, pull_batch_size=batch, tls=tls)
        self.consumer.subscribe(TOPIC)
        self.done = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        tally = self.tally
        consumer = self.consumer
        while not self.done.is_set():
            if await consumer.poll(0.2) is not None:
                tally.seen += 1
                tally.last_seen = loop.time()

    async def close(self) -> None:
        self.done.set()
        try:
            if self.task is not None:
                await asyncio.wait_for(self.task, 10)
        finally:
            await self.consumer.shutdown()


class RawLoad:
    """Producers on RemotingClient connections and one raw long-polling consumer."""

    def __init__(self, broker: BrokerProc, producers: int, shared: bool, tally: Tally,
                 tx: bool, body: bytes = _BODY) -> None:
        self.tally, self.tx, self.body = tally, tx, body
        addrs = broker.addrs or [broker.addr]
        # producer i on worker i mod N (its half and its END on one connection)
        self.clients = [RemotingClient(addrs[i % len(addrs)], ssl=broker.client_ssl)
                        for i in range(len(addrs) if shared else producers)]
        self.consumers = [RawConsumer(addr, tally, 512, broker.client_ssl) for addr in addrs]

    async def start(self) -> None:
        for client in self.clients:
            await client.connect()
        for consumer in self.consumers:
            await consumer.start()

    async def produce(self, idx: int, stop_at: float) -> None:
        client = self.clients[idx % len(self.clients)]
        tally, tx = self.tally, self.tx
        seq = 0
        while tally.may_start(stop_at):
            t0 = time.perf_counter()
            cmd, uniq = _send_request(idx, seq, str(int(time.time() * 1000)), tx, self.body)
            resp = await client.invoke(cmd, 10.0)
            if resp.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"send failed: {resp.code} {resp.remark}")
            if tx:
                ext = resp.ext_fields
                offset = int(ext["msgId"][16:], 16)  # offsetMsgId = ip(4) port(4) offset(8), hex
                await client.invoke_oneway(RemotingCommand.request(RequestCode.END_TRANSACTION, {
                    "producerGroup": GROUP, "tranStateTableOffset": ext["queueOffset"],
                    "commitLogOffset": str(offset), "commitOrRollback": "8",
                    "fromTransactionCheck": "false", "msgId": uniq, "transactionId": uniq,
                }, oneway=True))
            tally.latencies.append(time.perf_counter() - t0)
            seq += 1
            tally.sent += 1

    async def close(self) -> None:
        try:
            for consumer in self.consumers:
                await consumer.close()
        finally:
            for client in self.clients:
                await client.close()


# --- sdk load: TransactionProducer or Producer, and a Consumer ----------------------------------


class _Commit(TransactionListener):
    """Commits every transaction: the row measures the messaging, not a local database."""

    def execute_local_transaction(self, msg: MessageExt, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


class SdkLoad:
    """Producer instances (TransactionProducer for ``tx``, else Producer; one per coroutine or
    one shared) and one Consumer."""

    def __init__(self, broker: BrokerProc, producers: int, shared: bool, tally: Tally,
                 tx: bool, body: bytes = _BODY) -> None:
        self.tally, self.tx, self.body = tally, tx, body
        listener = _Commit()
        count = 1 if shared else producers
        tls = broker.client_tls
        self.producers: list[Producer] = (
            [TransactionProducer(GROUP, broker.namesrv, listener=listener, tls=tls)
             for _ in range(count)]
            if tx else [Producer(GROUP, broker.namesrv, tls=tls) for _ in range(count)])
        self.consumer = SdkConsumer(broker.namesrv, tally, tls=tls)

    async def start(self) -> None:
        await self.consumer.start()
        for producer in self.producers:
            await producer.start()

    async def produce(self, idx: int, stop_at: float) -> None:
        producer = self.producers[idx % len(self.producers)]
        tally = self.tally
        while tally.may_start(stop_at):
            t0 = time.perf_counter()
            msg = Message(TOPIC, self.body, tags="bench")
            if self.tx:
                result = await producer.send_message_in_transaction(msg)
                if result.local_transaction_state != LocalTransactionState.COMMIT_MESSAGE:
                    raise RuntimeError(f"transaction not committed: {result}")
            else:
                result = await producer.send(msg)
                if result.send_status != SendStatus.SEND_OK:
                    raise RuntimeError(f"send not stored: {result}")
            tally.latencies.append(time.perf_counter() - t0)
            tally.sent += 1

    async def close(self) -> None:
        try:
            await self.consumer.close()
        finally:
            for producer in self.producers:
                await producer.shutdown()


# --- one row -----------------------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _create_topic(addr: str, ssl: ssl.SSLContext | None = None) -> None:
    """Created up front, so that the consumer's first pulls and routes find it."""
    admin = RemotingClient(addr, ssl=ssl)
    await admin.connect()
    try:
        resp = await admin.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES),
            "perm": "6"}), 10)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"topic not created: {resp.code} {resp.remark}")
    finally:
        await admin.close()


async def _create_routed_topic(broker: BrokerProc) -> None:
    """The topic on every worker, then wait (bounded) until the name server routes it to all
    of them, so that SDK clients spread over every worker from their first route."""
    for addr in broker.addrs or [broker.addr]:
        await _create_topic(addr, broker.client_ssl)
    if len(broker.addrs) <= 1:
        return
    client = RemotingClient(broker.namesrv, ssl=broker.client_ssl)
    await client.connect()
    try:
        deadline = time.monotonic() + 30
        while True:
            resp = await client.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}), 10)
            if resp.code == ResponseCode.SUCCESS and \
                    len(TopicRouteData.decode(resp.body).broker_datas) == len(broker.addrs):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{TOPIC} not routed to all {len(broker.addrs)} workers in 30 s")
            await asyncio.sleep(0.1)
    finally:
        await client.close()


def _result(tally: Tally, elapsed: float, broker_s: float, client_s: float,
            echo: tuple[float, float]) -> Result:
    """The figures of one run: rates over ``elapsed``, CPU seconds spread over what was seen."""
    count = max(tally.seen, 1)
    latencies = sorted(tally.latencies)
    rate = tally.seen / elapsed if elapsed > 0 else 0.0
    broker_us = broker_s * 1e6 / count
    return Result(sent=tally.sent, seen=tally.seen, seconds=elapsed, tps=rate,
                  p50_ms=_percentile(latencies, 0.50) * 1e3, p99_ms=_percentile(latencies, 0.99) * 1e3,
                  broker_us=broker_us, client_us=client_s * 1e6 / count,
                  echo_rate=rate / echo[0], echo_cpu=broker_us / echo[1])


async def run_row(broker: BrokerProc, kind: str, client: str, producers: int, shared: bool,
                  seconds: float, max_tx: int, echo: tuple[float, float],
                  body: bytes = _BODY) -> Result:
    """Load ``broker`` with sends (``kind`` "tx": committed transactions, "plain": plain
    sends) for one row and measure it; ``echo`` is (round trips/s, CPU µs per round trip) of
    the raw echo of the same pass; ``body`` is every message's body (``bench.peers`` sends
    256 B, as it does to RabbitMQ and NATS).  Connections, instances and the consumer are set up
    before the measured window opens and closed after it ends."""
    loop = asyncio.get_running_loop()
    await _create_routed_topic(broker)
    tally = Tally(max_tx)
    load = (RawLoad if client == "raw" else SdkLoad)(broker, producers, shared, tally, kind == "tx",
                                                     body)
    await load.start()
    try:
        broker0, client0 = broker.cpu(), time.process_time()
        start = loop.time()
        stop_at = start + seconds
        await asyncio.gather(*(load.produce(i, stop_at) for i in range(producers)))
        deadline = loop.time() + DRAIN_SECONDS
        while tally.seen < tally.sent and loop.time() < deadline:
            await asyncio.sleep(0.02)
        client1, broker1 = time.process_time(), broker.cpu()
    finally:
        await load.close()
    elapsed = (tally.last_seen or loop.time()) - start
    return _result(tally, elapsed, broker1 - broker0, client1 - client0, echo)


# --- consumer delivery: a preloaded backlog ----------------------------------------------------


async def preload(addr: str, backlog: int, body_size: int = DELIVERY_BODY,
                  ssl: ssl.SSLContext | None = None) -> int:
    """Store ``backlog`` plain messages of ``body_size`` bytes in the topic's queues, as fast as
    the broker takes them: SEND_BATCH_MESSAGE requests of PRELOAD_BATCH messages (each record
    with its own UNIQ_KEY), PRELOAD_IN_FLIGHT at a time, each batch to the next queue, so a
    queue holds runs of PRELOAD_BATCH contiguous records.  Progress goes to stderr; bounded by
    PRELOAD_SECONDS, after which it returns how many were stored."""
    loop = asyncio.get_running_loop()
    body = b"b" * body_size
    client = RemotingClient(addr, ssl=ssl)
    await client.connect()
    stored = batches = 0
    deadline = loop.time() + PRELOAD_SECONDS
    next_report = loop.time() + 1.0
    pid = os.getpid()

    async def sender() -> None:
        nonlocal stored, batches, next_report
        while loop.time() < deadline:
            first = batches * PRELOAD_BATCH
            if first >= backlog:
                return
            n = min(PRELOAD_BATCH, backlog - first)
            qid = batches % QUEUES
            batches += 1
            payload = encode_batch((0, body, {"UNIQ_KEY": f"{pid:08X}{first + i:024X}"})
                                   for i in range(n))
            resp = await client.invoke(RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {
                "a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": str(qid), "f": "0",
                "g": str(int(time.time() * 1000)), "h": "0", "i": "WAIT\x01true", "j": "0",
                "k": "false", "m": "true"}, payload), 30.0)
            if resp.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"preload batch failed: {resp.code} {resp.remark}")
            stored += n
            if loop.time() >= next_report:
                next_report = loop.time() + 1.0
                print(f"    preloading: {stored:,} / {backlog:,} messages", file=sys.stderr)

    try:
        await asyncio.gather(*(sender() for _ in range(PRELOAD_IN_FLIGHT)))
    finally:
        await client.close()
    if stored < backlog:
        print(f"    preload stopped at {stored:,} of {backlog:,} messages after "
              f"{PRELOAD_SECONDS:g} s", file=sys.stderr)
    return stored


async def run_delivery(broker: BrokerProc, client: str, backlog: int, pull_batch: int,
                       echo: tuple[float, float],
                       window_opens: Callable[[], None] | None = None) -> Result:
    """Preload ``backlog`` messages, then time one consumer (``client`` "sdk": a Consumer
    polling message by message; "raw": RemotingClient pulls, framing checked) draining all of
    it from the first offset, ``pull_batch`` messages per pull.  The window opens before the
    consumer starts and closes when it has seen the last message (bounded wait);
    ``window_opens`` is called then (a profiler starts there, leaving the preload out)."""
    loop = asyncio.get_running_loop()
    await _create_topic(broker.addr, broker.client_ssl)
    loaded = await preload(broker.addr, backlog, ssl=broker.client_ssl)
    if window_opens is not None:
        window_opens()
    tally = Tally(loaded, sent=loaded)
    consumer = (RawConsumer(broker.addr, tally, pull_batch, broker.client_ssl) if client == "raw"
                else SdkConsumer(broker.namesrv, tally, pull_batch, broker.client_tls))
    broker0, client0 = broker.cpu(), time.process_time()
    start = loop.time()
    try:
        await consumer.start()
        deadline = loop.time() + DRAIN_SECONDS + loaded / 10_000
        while tally.seen < loaded and loop.time() < deadline:
            await asyncio.sleep(0.02)
        client1, broker1 = time.process_time(), broker.cpu()
    finally:
        await consumer.close()
    elapsed = (tally.last_seen or loop.time()) - start
    return _result(tally, elapsed, broker1 - broker0, client1 - client0, echo)


# --- driver ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    flush: str
    kind: str
    client: str
    producers: int
    sharing: str
    workers: int = 1
    tls: bool = False

    @property
    def label(self) -> str:
        label = f"{self.flush}-{self.kind}-{self.client}-{self.producers}-{self.sharing}"
        return label + (f"-w{self.workers}" if self.workers > 1 else "") + \
            ("-tls" if self.tls else "")

    def plaintext(self) -> Row:
        """The same row without TLS: what a TLS row is compared with."""
        return replace(self, tls=False)


#: ``--tls`` values: which rows run plaintext, which over TLS (``both``: each row both ways,
#: side by side in every pass, compared at the end).
TLS_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}
#: The issue's target: TLS may cost at most this share of the plaintext msgs/s.
TLS_COST_TARGET = 0.25


def rows_of(args: argparse.Namespace) -> list[Row]:
    """Every combination asked for; a delivery row has one consumer and no producers, so it
    is one row per flush mode and client.  TLS is the innermost choice, so a row's plaintext
    and TLS runs follow each other in every pass (the machine is noisy: interleaved, they see
    the same load)."""
    tls_modes = TLS_CHOICES[args.tls]
    rows = _plain_rows(args)
    return [replace(row, tls=tls) for row in rows for tls in tls_modes]


def _plain_rows(args: argparse.Namespace) -> list[Row]:
    rows = []
    sharings = args.connections.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    for kind in args.kind.split(","):
        if kind not in KINDS:
            raise SystemExit(f"error: --kind {kind!r}: not one of {', '.join(KINDS)}")
        for flush in args.flush.split(","):
            for client in args.client.split(","):
                if kind == "delivery":  # one broker's drain
                    rows.append(Row(flush, kind, client, 1, "-"))
                    continue
                for producers in (int(p) for p in args.producers.split(",")):
                    for sharing in sharings:
                        if producers == 1 and sharing != sharings[0]:
                            continue  # one producer: each and shared are the same
                        for n in workers:  # side by side: compared within one pass
                            rows.append(Row(flush, kind, client, producers, sharing, n))
    return rows


def median_result(results: list[Result]) -> Result:
    return Result(**{f.name: statistics.median(getattr(r, f.name) for r in results)
                     for f in fields(Result)})


HEADER = (f"{'flush':<6} {'kind':<8} {'client':<6} {'producers':>9} {'sharing':<7} {'workers':>7} "
          f"{'tls':<3} {'messages':>10} {'msgs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'broker µs/msg':>13} "
          f"{'client µs/msg':>13} {'× echo rate':>11} {'× echo CPU':>10}")


def format_row(row: Row, r: Result) -> str:
    """One table line; a delivery row has no send latency ("-")."""
    p50, p99 = ((f"{r.p50_ms:>7.2f}", f"{r.p99_ms:>7.2f}") if row.kind != "delivery"
                else (f"{'-':>7}", f"{'-':>7}"))
    return (f"{row.flush:<6} {row.kind:<8} {row.client:<6} {row.producers:>9} {row.sharing:<7} "
            f"{row.workers:>7} {'on' if row.tls else 'off':<3} "
            f"{r.seen:>10,.0f} {r.tps:>8,.0f} {p50} {p99} {r.broker_us:>13.1f} "
            f"{r.client_us:>13.1f} {r.echo_rate:>11.3f} {r.echo_cpu:>10.1f}")


TLS_HEADER = (f"{'flush':<6} {'kind':<8} {'client':<6} {'producers':>9} {'sharing':<7} "
              f"{'workers':>7} {'plain msgs/s':>12} {'TLS msgs/s':>10} {'TLS/plain':>9} "
              f"{'TLS cost':>8} {'broker µs/msg plain/TLS':>23} {'client µs/msg plain/TLS':>23} "
              f"{'CPU cost':>8}")


def tls_comparison(medians: dict[Row, Result]) -> list[str]:
    """The TLS rows against their plaintext twins (medians of the interleaved passes): msgs/s
    of both, their ratio, the cost (1 - ratio), CPU per message of broker and client, and the
    cost by CPU (1 - plaintext CPU / TLS CPU per message, broker and client together: the
    msgs/s lost if both were bound by their CPU, which other load on a shared machine moves
    far less than msgs/s); then whether every row meets :data:`TLS_COST_TARGET`.  Empty when
    no row ran both ways."""
    pairs = [(row, medians[row.plaintext()], r) for row, r in medians.items()
             if row.tls and row.plaintext() in medians]
    if not pairs:
        return []
    lines = [TLS_HEADER]
    costs, cpu_costs = [], []
    for row, plain, tls in pairs:
        ratio = tls.tps / plain.tps if plain.tps > 0 else 0.0
        cost = 1.0 - ratio  # negative: the TLS run was faster (noise)
        costs.append(cost)
        tls_cpu = tls.broker_us + tls.client_us
        cpu_cost = 1.0 - (plain.broker_us + plain.client_us) / tls_cpu if tls_cpu > 0 else 0.0
        cpu_costs.append(cpu_cost)
        lines.append(
            f"{row.flush:<6} {row.kind:<8} {row.client:<6} {row.producers:>9} {row.sharing:<7} "
            f"{row.workers:>7} {plain.tps:>12,.0f} {tls.tps:>10,.0f} {ratio:>9.3f} "
            f"{cost * 100:>7.1f}% {f'{plain.broker_us:.1f} / {tls.broker_us:.1f}':>23} "
            f"{f'{plain.client_us:.1f} / {tls.client_us:.1f}':>23} {cpu_cost * 100:>7.1f}%")
    worst = max(costs)
    verdict = "met" if worst <= TLS_COST_TARGET else "not met"
    lines.append(f"target: TLS costs <= {TLS_COST_TARGET:.0%} of plaintext msgs/s: {verdict} "
                 f"(largest cost {worst:.1%}; by CPU {max(cpu_costs):.1%})")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="load time per row and pass")
    ap.add_argument("--max-tx", type=int, default=200_000,
                    help="sends per row and pass at most (bounds a fast run)")
    ap.add_argument("--kind", default=",".join(KINDS),
                    help="tx: committed transactions; plain: plain sends; delivery: one "
                         "consumer draining a preloaded backlog")
    ap.add_argument("--producers", default="1,64")
    ap.add_argument("--flush", default="async,sync")
    ap.add_argument("--client", default="raw,sdk",
                    help="raw: RemotingClient frames; sdk: TransactionProducer or Producer + "
                         "Consumer")
    ap.add_argument("--connections", default="each,shared",
                    help="each: one connection (raw) or producer instance (sdk) per producer "
                         "coroutine; shared: one for all, as in one client process")
    ap.add_argument("--backlog", type=int, default=1_000_000,
                    help=f"messages ({DELIVERY_BODY} B) preloaded for a delivery row")
    ap.add_argument("--pull-batch", type=int, default=32,
                    help="messages per pull in a delivery row (32: the SDK's default)")
    ap.add_argument("--workers", default="1",
                    help="broker processes (txbroker serve --workers N), comma-separated for "
                         "side-by-side rows: 1,2")
    ap.add_argument("--tls", nargs="?", const="on", default="off", choices=sorted(TLS_CHOICES),
                    help="on (or --tls alone): the broker accepts TLS only (a throwaway CA and "
                         "certificate made for the run) and every client verifies it; both: "
                         "each row plaintext and over TLS, interleaved, then the TLS cost")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved passes; medians printed")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="sample the broker of every run with py-spy into DIR")
    args = ap.parse_args(argv)
    if args.profile is not None:
        require_program("py-spy")  # now, not after the first row's minutes of load
    rows = rows_of(args)
    results: dict[Row, list[Result]] = {row: [] for row in rows}
    echoes: list[tuple[float, float]] = []
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        pki = stack.enter_context(ThrowawayPki()) if args.tls != "off" else None
        _passes(args, rows, results, echoes, pki)
    print(f"raw echo, 64 connections (median of {len(echoes)}): "
          f"{statistics.median(e[0] for e in echoes):,.0f} round trips/s, "
          f"{statistics.median(e[1] for e in echoes):.1f} µs server CPU per round trip")
    print(f"median of {len(echoes)} passes, {args.seconds:g} s of load per send row and pass, "
          f"a backlog of {args.backlog:,} per delivery row")
    print(HEADER)
    medians = {row: median_result(results[row]) for row in rows}
    for row in rows:
        print(format_row(row, medians[row]))
    comparison = tls_comparison(medians)
    if comparison:
        print(f"TLS against plaintext (medians of {len(echoes)} interleaved passes):")
        print("\n".join(comparison))
    if any(r.seen != r.sent for rs in results.values() for r in rs):
        print("WARNING: the consumer did not see every stored message", file=sys.stderr)
        sys.exit(1)


def _passes(args: argparse.Namespace, rows: list[Row], results: dict[Row, list[Result]],
            echoes: list[tuple[float, float]], pki: ThrowawayPki | None) -> None:
    """Run every row ``--repeat`` times, each on a fresh broker, filling ``results`` and
    ``echoes``.  Odd passes run the rows in reverse, so that no row always runs first (after
    a plaintext twin that warmed the machine, or before it)."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        for rep in range(max(1, args.repeat)):
            echo = runner.run(echo_ceiling(64, 1, ECHO_SECONDS))
            echoes.append(echo)
            print(f"pass {rep + 1}: raw echo {echo[0]:,.0f} round trips/s, {echo[1]:.1f} µs CPU "
                  "per round trip", file=sys.stderr)
            for row in (rows if rep % 2 == 0 else rows[::-1]):
                with tempfile.TemporaryDirectory(prefix="txbroker-bench-") as d, \
                        BrokerProc(row.flush, d, row.workers, pki if row.tls else None) as broker:
                    window = ProfileWindow(broker.proc.pid, None if args.profile is None
                                           else args.profile / f"{row.label}-{rep + 1}.txt")
                    if row.kind == "delivery":
                        run = run_delivery(broker, row.client, args.backlog, args.pull_batch,
                                           echo, window.open)
                    else:
                        window.open()
                        run = run_row(broker, row.kind, row.client, row.producers,
                                      row.sharing == "shared", args.seconds, args.max_tx, echo)
                    try:
                        r = runner.run(run)
                    finally:
                        window.close()
                results[row].append(r)
                print(f"  {format_row(row, r)}", file=sys.stderr)


if __name__ == "__main__":
    run_main(main, "python -m txbroker.bench.broker")
