"""What the Kafka end-to-end tests share: the pipeline app as a process, inputs produced
through aiokafka, and a topic read to its end at either isolation level."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

PIPELINE = Path(__file__).with_name("kafka_pipeline.py")
#: Broker settings the end-to-end tests share: short group timings (the app's 2 s session),
#: a fast timeout scan.
E2E_SETTINGS = {"kafka_group_initial_rebalance_delay": 0.2, "kafka_group_min_session_timeout": 1.0,
                "kafka_transaction_scan_interval": 0.2}


def start_app(bootstrap: str, src: str, dst: str, group: str, tid: str, *, instance: str = "app",
              delay: float = 0.0, idle_exit: float = 3.0, log: Path | None = None) -> subprocess.Popen:
    """The pipeline app as a process: stdout piped (its ``committed``/``fenced`` lines), stderr
    to ``log`` (appended) or discarded."""
    err = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
    try:
        return subprocess.Popen(
            [sys.executable, str(PIPELINE), bootstrap, src, dst, group, tid, "--instance", instance,
             "--delay", str(delay), "--idle-exit", str(idle_exit)],
            stdout=subprocess.PIPE, stderr=err, text=True)
    finally:
        if log is not None:
            err.close()


async def produce_inputs(bootstrap: str, topic: str, count: int) -> list[str]:
    """``count`` plain messages ``in-<n>`` (key ``k<n>``), acknowledged; returns the values."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        values = [f"in-{n}" for n in range(count)]
        futures = [await producer.send(topic, v.encode(), key=f"k{n}".encode())
                   for n, v in enumerate(values)]
        for f in futures:
            await f
        return values
    finally:
        await producer.stop()


async def read_topic(bootstrap: str, topic: str, isolation: str, partitions: int) -> list[str]:
    """Every value of ``topic`` from offset 0 to the current end, at ``isolation``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        values: list[str] = []
        for _ in range(10_000):  # bounded: each round reads at least one record or waits 0.5 s
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            for records in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                values += [r.value.decode() for r in records]
        return values
    finally:
        await consumer.stop()


def per_input(outputs: list[str]) -> Counter:
    """Output values ``<input>|<instance>`` counted per input."""
    return Counter(v.split("|", 1)[0] for v in outputs)
