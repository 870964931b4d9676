"""The chaos driver: transactional load while the broker is SIGKILLed and restarted.

Producers run a seeded mix of commit, rollback, unknown-then-commit and unknown-then-rollback
transactions; a consumer group records every delivery; a killer SIGKILLs the broker process at
seeded random moments and restarts it on the same data dir and port.  At the end the driver
waits (bounded) for check-backs to resolve every half, then asks the :class:`Ledger` for the
verdict.  Producers keep the SDK's default retries: a half whose answer a kill swallowed is
sent again with the same UNIQ_KEY, and the broker must answer the retry with the half it already
stored (one transaction, one outcome), across the restart too.
"""

from __future__ import annotations

import asyncio
import logging
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from txbroker.bench.chaos.ledger import KINDS, Ledger, Report
from txbroker.bench.chaos.process import BrokerProcess
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError

log = logging.getLogger("bench.chaos")

STATES = {"commit": LocalTransactionState.COMMIT_MESSAGE,
          "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
          "unknown": LocalTransactionState.UNKNOW}


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    kills: int = 3
    producers: int = 4
    #: Upper bound of transactions per producer (the run also ends when the kills are done).
    max_txns_per_producer: int = 2000
    flush_mode: str = "sync"
    min_kill_interval: float = 0.5
    max_kill_interval: float = 1.5
    settle_timeout: float = 30.0
    topic: str = "ChaosTopic"
    producer_group: str = "chaos_pg"
    consumer_group: str = "chaos_cg"
    #: Replace the consumer after every restart: it resumes from the broker's offsets, so a
    #: first delivery below the last persisted offset shows an offset that moved back.
    restart_consumer: bool = True
    data_dir: str | None = None


class LedgerListener(TransactionListener):
    """The producer's local database is the ledger: decisions and check answers come from it."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def execute_local_transaction(self, msg, arg):
        return STATES[self.ledger.execute(arg)]

    def check_local_transaction(self, msg):
        return STATES[self.ledger.check(msg.keys or "")]


def broker_settings(flush_mode: str) -> dict[str, object]:
    return {"listen_host": "127.0.0.1", "metrics_port": -1, "segment_size": 1024 * 1024,
            "max_message_size": 256 * 1024,
            "consume_queue_entries": 4096, "flush_mode": flush_mode, "flush_interval": 0.05,
            "offset_persist_interval": 0.2, "transaction_check_interval": 0.2,
            "transaction_timeout": 0.5, "transaction_check_max": 1000, "max_pull_suspend": 2.0,
            "shutdown_grace": 2.0}


def read_persisted_offsets(data_dir: Path, group: str, topic: str) -> dict[int, int]:
    path = data_dir / "consumerOffset.json"
    if not path.exists():
        return {}
    doc = orjson.loads(path.read_bytes())
    queues = doc.get("offsets", {}).get(group, {}).get(topic, {})
    return {int(q): int(v) for q, v in queues.items()}


async def _status(namesrv: str) -> dict | None:
    try:
        async with AdminClient(namesrv, timeout=2.0) as admin:
            docs = await admin.status()
    except (ClientError, OSError, TimeoutError):  # the broker may be down; the caller retries
        return None
    return next(iter(docs.values()), None)


async def run_chaos(cfg: ChaosConfig) -> Report:
    rng = random.Random(cfg.seed)
    tmp = None
    if cfg.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="txbroker-chaos-")
        root = Path(tmp.name)
    else:
        root = Path(cfg.data_dir)
        root.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(root / "data", broker_settings(cfg.flush_mode), root / "broker.log")
    ledger = Ledger()
    try:
        await asyncio.to_thread(broker.start)
        namesrv = broker.broker_addr
        async with AdminClient(namesrv) as admin:
            await admin.create_topic(cfg.topic, 4)
        return await _run(cfg, rng, broker, namesrv, ledger)
    finally:
        await asyncio.to_thread(broker.kill)
        if tmp is not None:
            tmp.cleanup()


async def _run(cfg: ChaosConfig, rng: random.Random, broker: BrokerProcess, namesrv: str,
               ledger: Ledger) -> Report:
    stop_load = asyncio.Event()
    stop_consume = asyncio.Event()
    def new_consumer() -> Consumer:
        c = Consumer(cfg.consumer_group, namesrv, from_where="first", long_poll_timeout=1.0,
                     rebalance_interval=1.0, persist_interval=0.2, pull_error_backoff=0.2,
                     request_timeout=2.0)
        c.subscribe(cfg.topic)
        return c

    consumer = new_consumer()
    await consumer.start()
    first_seen: set[int] = set()

    async def consume() -> None:
        while not stop_consume.is_set():
            msg = await consumer.poll(0.3)
            if msg is not None:
                ledger.delivered(msg.keys or "", msg.queue_id, msg.queue_offset)
                if msg.queue_id not in first_seen:
                    first_seen.add(msg.queue_id)
                    ledger.offset_sample(f"{cfg.topic}/{msg.queue_id}", msg.queue_offset, "first-delivery")

    async def replace_consumer() -> None:
        nonlocal consumer, consume_task
        stop_consume.set()
        await asyncio.gather(consume_task, return_exceptions=True)
        await consumer.shutdown()
        stop_consume.clear()
        first_seen.clear()
        consumer = new_consumer()
        await consumer.start()
        consume_task = asyncio.ensure_future(consume())

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
            key = f"c{cfg.seed}-p{idx}-{i}"
            ledger.begin(key, prng.choice(KINDS))
            try:
                await producer.send_message_in_transaction(Message(cfg.topic, key.encode(), keys=key), key)
            except (ClientError, OSError, TimeoutError):  # the half was not acknowledged
                ledger.send_failed(key)
                await asyncio.sleep(0.1)

    async def killer() -> None:
        for _ in range(cfg.kills):
            await asyncio.sleep(rng.uniform(cfg.min_kill_interval, cfg.max_kill_interval))
            await asyncio.to_thread(broker.kill)
            ledger.kills += 1
            for q, v in read_persisted_offsets(broker.data_dir, cfg.consumer_group, cfg.topic).items():
                ledger.offset_sample(f"{cfg.topic}/{q}", v, "persisted")
            ledger.recovery_seconds.append(await asyncio.to_thread(broker.start))
            doc = await _status(namesrv)
            live = (doc or {}).get("consumerGroups", {}).get(cfg.consumer_group, {}) \
                .get("offsets", {}).get(cfg.topic, {})
            for q, v in live.items():
                ledger.offset_sample(f"{cfg.topic}/{q}", int(v), "live")
            if cfg.restart_consumer:
                await replace_consumer()
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
    return ledger.verify(pending_at_end=pending)


async def _settle(cfg: ChaosConfig, namesrv: str, ledger: Ledger) -> int | None:
    """Wait (bounded) until no half is pending and every decided commit was consumed."""
    deadline = time.monotonic() + cfg.settle_timeout
    pending = None
    while time.monotonic() < deadline:
        doc = await _status(namesrv)
        pending = None if doc is None else int(doc.get("pendingHalfMessages", -1))
        if pending == 0 and not ledger.missing_commits():
            await asyncio.sleep(0.5)  # a late duplicate would show up now
            return 0
        await asyncio.sleep(0.3)
    return pending
