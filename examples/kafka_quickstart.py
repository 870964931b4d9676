"""Kafka clients on txbroker: a transactional aiokafka producer and a read_committed consumer.

Run a broker with its Kafka listener (``txbroker serve --kafka-port 9092``), then
``python examples/kafka_quickstart.py [--bootstrap 127.0.0.1:9092] [--topic kafka-quickstart]``.

It commits one transaction of three orders, aborts a second one, sends one plain message, and
reads the topic back with ``isolation_level="read_committed"``: the committed and the plain
messages arrive, the aborted ones never do.  Each step prints one line; the run is bounded
(it stops after ``--timeout`` seconds without the expected messages, exit status 1).
Needs aiokafka (``pip install -e '.[test]'`` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError


async def produce(bootstrap: str, topic: str, run: str) -> set[str]:
    """One committed transaction, one aborted one, one plain message; the values expected."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"quickstart-{run}")
    try:
        await producer.start()
        async with producer.transaction():  # commits when the block ends without an error
            for n in (1, 2, 3):
                await producer.send(topic, f"{run} order {n}".encode(), key=f"order-{n}".encode())
        print(f"committed a transaction of 3 messages to {topic}")
        await producer.begin_transaction()
        await producer.send(topic, f"{run} order 4 (aborted)".encode())
        await producer.abort_transaction()
        print("aborted a transaction of 1 message")
    finally:
        await producer.stop()
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        await plain.start()
        meta = await plain.send_and_wait(topic, f"{run} hello".encode())
        print(f"sent a plain message: partition {meta.partition}, offset {meta.offset}")
    finally:
        await plain.stop()
    return {f"{run} order {n}" for n in (1, 2, 3)} | {f"{run} hello"}


async def consume(bootstrap: str, topic: str, run: str, expected: set[str], timeout: float) -> bool:
    """Read the whole topic read_committed; True when exactly ``expected`` of this run came."""
    # no group: the consumer reads every partition of the topic from its first offset
    # metadata refreshed every second: on a cluster the topic was just auto-created on one
    # group after another, and partitions a first answer missed are read as they appear
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                isolation_level="read_committed", auto_offset_reset="earliest",
                                metadata_max_age_ms=1000)
    seen: list[str] = []
    try:
        # In the try: a start that fails leaves tasks only stop() ends (asyncio.run would
        # otherwise wait on them for ever).
        await consumer.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(seen) < len(expected) and loop.time() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                seen += [r.value.decode() for r in records if r.value.decode().startswith(run)]
        await asyncio.sleep(0.5)  # anything else (an aborted record) would arrive meanwhile
        for records in (await consumer.getmany(timeout_ms=200)).values():
            seen += [r.value.decode() for r in records if r.value.decode().startswith(run)]
    finally:
        await consumer.stop()
    for value in sorted(seen):
        print(f"read_committed consumer got: {value}")
    return sorted(seen) == sorted(expected)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
                    help="the broker's Kafka listener (default $KAFKA_BOOTSTRAP or 127.0.0.1:9092)")
    ap.add_argument("--topic", default="kafka-quickstart")
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()
    run = uuid.uuid4().hex[:8]  # this run's messages, told apart from earlier runs'
    try:
        expected = await produce(args.bootstrap, args.topic, run)
        consumed = await consume(args.bootstrap, args.topic, run, expected, args.timeout)
    except KafkaError as exc:
        print(f"error: Kafka at {args.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if consumed:
        print(f"ok: {len(expected)} committed messages read, the aborted one never")
        return 0
    print("unexpected: the consumer did not read exactly the committed messages", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
