"""Kafka clients on one broker vs on two broker groups: ``python -m txbroker.bench.kafka
--cluster`` (docs/kafka.md, "Kafka on a cluster").

Every broker is a ``txbroker serve`` process (async flush, ephemeral ports, a temp data dir);
this process drives them with aiokafka, one row after the other:

* **one broker** and **two groups** (a name server and ``broker-a``/``broker-b``, one master
  each, Kafka nodes 1 and 2): the same topic of 4 partitions (on two groups, 2 queues in each),
  then the rows of ``bench.kafka``: **plain** (pipelined sends, acks=all) and **txn N**
  (``--txn-producers`` transactional producers committing N-message transactions; on two groups
  a transaction's messages fall on both groups' partitions, so its commit sends a marker).
  Broker CPU µs per message is the sum over the setup's broker processes.
* **failover**: a controller, a name server, ``broker-a`` with a master and a slave, and
  ``broker-b``; a plain producer (acks=all) and a transactional producer (transactions of 10
  messages over both groups, its coordinator in ``broker-a``) run while ``broker-a``'s master
  is SIGKILLed after ``--seconds`` of load; both keep going until each resumed and ran
  ``--seconds`` more.  The figure is the longest time between two consecutive acknowledged
  sends (plain) and between two commits (transactional), i.e. how long clients stall through
  the failover (the controller's lease, the promotion, the clients' metadata refresh).

``--json`` prints the rows as one JSON document.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from txbroker.bench.broker import proc_cpu_seconds
from txbroker.bench.chaos.cluster import ServiceProcess
from txbroker.bench.chaos.driver import broker_settings
from txbroker.bench.chaos.process import BrokerProcess, free_port
from txbroker.bench.kafka import (
    TOPIC,
    VALUE,
    KafkaBroker,
    RowResult,
    kafka_plain,
    kafka_txn,
)
from txbroker.client.admin import AdminClient
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.kafka.cluster_view import coordinator_index

#: Transaction sizes of the comparison rows.
TXN_SIZES = (10, 100)
#: The failover row measures at most this long after the kill (the load runs ``--seconds``
#: before it, and ``--seconds`` after both loads resumed).
FAILOVER_AFTER = 30.0
#: Controller lease of the failover setup (brokers heartbeat well inside it).
LEASE = 2.0


def key_on(group_index: int, groups: int, prefix: str) -> str:
    """A transactional id whose coordinator is the ``group_index``-th group (node-id order)."""
    for n in range(10_000):
        key = f"{prefix}-{n}"
        if coordinator_index(key, groups) == group_index:
            return key
    raise RuntimeError("no key found")


class Processes:
    """Name server, optional controller and brokers of one setup; stopped together."""

    def __init__(self, root: Path, *, controller: bool) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.controller = ServiceProcess(
            ["controller", "--port", "0", "--data-dir", str(root / "controller"),
             "--lease", str(LEASE)],
            r"^txbroker controller ready addr=(\S+)$", root / "controller.log") if controller else None
        self.namesrv = ServiceProcess(["namesrv", "--port", "0"],
                                      r"^txbroker namesrv ready addr=(\S+)$", root / "namesrv.log")
        self.brokers: list[BrokerProcess] = []
        #: What ``bench.kafka``'s rows give their aiokafka clients: plaintext here.
        self.client_options: dict[str, object] = {}

    def start(self) -> None:
        if self.controller is not None:
            self.controller.start()
        self.namesrv.start()

    def broker(self, name: str, node: int, broker_id: int = 0) -> BrokerProcess:
        settings = {**broker_settings("async"), "segment_size": 64 * 1024 * 1024,
                    "log_level": "WARNING", "broker_port": free_port(), "ha_port": free_port(),
                    "kafka_port": free_port(), "namesrv_addr": self.namesrv.addr,
                    "broker_name": name, "broker_id": broker_id, "kafka_node_id": node,
                    "default_queue_nums": 2, "transaction_check_interval": 60.0,
                    "transaction_timeout": 60.0}
        if self.controller is not None:
            settings.update(controller_addr=self.controller.addr, controller_lease=LEASE,
                            controller_heartbeat_interval=0.3, metadata_sync_interval=0.2,
                            slave_timeout=1.0)
        proc = BrokerProcess(self.root / f"{name}-{broker_id}", settings,
                             self.root / f"{name}-{broker_id}.log")
        self.brokers.append(proc)
        proc.start()
        return proc

    @property
    def kafka(self) -> str:
        return ",".join(b.kafka_addr for b in self.brokers if b.alive())

    def cpu(self) -> float:
        return sum(proc_cpu_seconds(b.pid) for b in self.brokers if b.alive())

    def stop(self) -> None:
        for b in self.brokers:
            with contextlib.suppress(Exception):
                b.stop()
        self.namesrv.stop()
        if self.controller is not None:
            self.controller.stop()


async def create_everywhere(namesrv: str, topic: str, queues: int) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(topic, queues)


async def metadata_leaders(addr: str, topic: str) -> list[int]:
    """The leader of each partition of ``topic`` in ``addr``'s own Metadata answer."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(encode_request(ApiKey.METADATA, 8, 1, "bench", {
            "topics": [{"name": topic}], "allow_auto_topic_creation": False}))
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
        _, body = decode_response(ApiKey.METADATA, 8, await reader.readexactly(size))
    finally:
        writer.close()
    return [p["leader_id"] for t in body["topics"] for p in t["partitions"]]


async def wait_partitions(procs: Processes, topic: str, leaders: list[int],
                          timeout: float = 30.0) -> None:
    """Until every broker's Metadata lists ``topic``'s partitions led by ``leaders``: a client
    that read one broker's view before the other had learned both groups would number the
    partitions differently from it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = [await metadata_leaders(b.kafka_addr, topic) for b in procs.brokers if b.alive()]
        if all(s == leaders for s in seen):
            return
        await asyncio.sleep(0.3)
    raise RuntimeError(f"{topic}: partitions led by {leaders} not seen everywhere in {timeout:g} s")


async def compare_rows(root: Path, seconds: float, max_messages: int, in_flight: int,
                       txn_producers: int) -> list[RowResult]:
    """plain and txn rows on one broker, then on two groups."""
    rows: list[RowResult] = []
    with KafkaBroker(str(root / "single")) as single:
        await create_everywhere(single.namesrv, TOPIC, 4)
        rows += await _rows("one broker", single, seconds, max_messages, in_flight, txn_producers)
    procs = Processes(root / "groups", controller=False)
    try:
        procs.start()
        procs.broker("broker-a", 1)
        procs.broker("broker-b", 2)
        await create_everywhere(procs.namesrv.addr, TOPIC, 2)
        await wait_partitions(procs, TOPIC, [1, 1, 2, 2])
        rows += await _rows("two groups", procs, seconds, max_messages, in_flight, txn_producers)
    finally:
        procs.stop()
    return rows


async def _rows(setup: str, broker, seconds: float, max_messages: int, in_flight: int,
                txn_producers: int) -> list[RowResult]:
    out = [await kafka_plain(broker, seconds, max_messages, in_flight)]
    for size in TXN_SIZES:
        out.append(await kafka_txn(broker, size, seconds, max_messages, txn_producers))
    for r in out:
        r.row = f"{setup}: {r.row}"
    return out


@dataclass
class FailoverResult:
    plain_sent: int
    plain_longest_gap_s: float
    txn_committed: int
    txn_longest_gap_s: float
    #: Seconds from the kill to the first plain send acknowledged after it (by the promoted
    #: slave: the plain sends go to broker-a's partitions only); None: none within the bound.
    first_ack_after_kill_s: float | None


async def failover_row(root: Path, seconds: float) -> FailoverResult:
    from aiokafka import AIOKafkaProducer

    # The clients log every refused connection while the master is down: expected here.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    procs = Processes(root / "failover", controller=True)
    try:
        procs.start()
        master = procs.broker("broker-a", 1, broker_id=0)
        procs.broker("broker-a", 1, broker_id=1)
        procs.broker("broker-b", 2)
        await create_everywhere(procs.namesrv.addr, TOPIC, 2)
        bootstrap = procs.kafka
        await wait_partitions(procs, TOPIC, [1, 1, 2, 2])
        plain = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                 request_timeout_ms=30_000)
        txn = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, request_timeout_ms=30_000,
                               transactional_id=key_on(0, 2, "bench-failover"))
        await plain.start()
        await txn.start()
        loop = asyncio.get_running_loop()
        plain_acks: list[float] = []
        commits: list[float] = []
        killed = loop.time() + max(seconds, 1.0)
        hard_stop = killed + FAILOVER_AFTER

        def running() -> bool:
            """Until both loads resumed after the kill and ran ``seconds`` more (bounded)."""
            now = loop.time()
            if now >= hard_stop:
                return False
            resumed = [next((t for t in times if t > killed), None) for times in (plain_acks, commits)]
            return any(t is None for t in resumed) or now < max(resumed) + seconds

        async def plain_load() -> None:
            while running():
                futures = [await plain.send(TOPIC, VALUE, partition=p % 2) for p in range(20)]
                for f in futures:
                    await f
                    plain_acks.append(loop.time())

        async def txn_load() -> None:
            while running():
                async with txn.transaction():
                    for p in range(10):
                        await txn.send(TOPIC, VALUE, partition=p % 4)
                commits.append(loop.time())

        tasks = [asyncio.create_task(plain_load()), asyncio.create_task(txn_load())]
        await asyncio.sleep(killed - loop.time())
        master.kill()
        for r in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(r, BaseException):
                raise r
        first = next((t for t in plain_acks if t > killed), None)
        await plain.stop()
        await txn.stop()
    finally:
        procs.stop()
    return FailoverResult(len(plain_acks), _longest_gap(plain_acks), len(commits),
                          _longest_gap(commits), None if first is None else first - killed)


def _longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def run(seconds: float, max_messages: int, in_flight: int, txn_producers: int) -> dict:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="txbroker-bench-kafka-cluster-") as d, \
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        root = Path(d)
        rows = runner.run(compare_rows(root, seconds, max_messages, in_flight, txn_producers))
        failover = runner.run(failover_row(root, seconds))
    return {"seconds": seconds, "rows": [asdict(r) for r in rows], "failover": asdict(failover)}


def print_report(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Kafka produce: one broker vs two broker groups ({doc['seconds']:g} s per row)")
    for col in ("row", "messages", "msgs/s", "broker µs/msg", "client µs/msg"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in doc["rows"]:
        table.add_row(r["row"], f"{r['messages']:,}", f"{r['msgs_per_s']:,.0f}",
                      f"{r['broker_us_per_msg']:.1f}", f"{r['client_us_per_msg']:.1f}")
    console = Console(width=120)
    console.print(table)
    f = doc["failover"]
    first = f["first_ack_after_kill_s"]
    promoted = "not seen" if first is None else f"{first:.2f} s"
    console.print(f"failover of broker-a's master: first plain ack after the kill {promoted}; "
                  f"longest gap plain {f['plain_longest_gap_s']:.2f} s ({f['plain_sent']:,} sent), "
                  f"transactional {f['txn_longest_gap_s']:.2f} s ({f['txn_committed']:,} commits)")
