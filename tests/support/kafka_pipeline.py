"""An exactly-once consume-transform-produce app on aiokafka, run as a process by the tests.

It reads the input topic in a consumer group (read_committed, no auto commit), and for each
batch runs one transaction: one output per input to the output topic (value
``<input value>|<instance>``, same key), the batch's next offsets through
``send_offsets_to_transaction``, commit.  Each transaction prints one line to stdout:
``committed <json list of input values>``; a fenced producer prints ``fenced <json list of the
inputs of the transaction that failed>`` and exits 3 (the zombie test reads both).  Any other
failure (the broker went away) ends the process with status 1: the test restarts it, with the
same transactional.id, as an orchestrator would.  With no input for ``--idle-exit`` seconds
after its first assignment it exits 0.

Run: python tests/support/kafka_pipeline.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID
     [--instance NAME] [--delay SECONDS] [--max-batch N] [--idle-exit SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ProducerFenced

#: Short group timings (the test broker allows them): a SIGKILLed member leaves the group soon.
SESSION_MS = 2000
HEARTBEAT_MS = 300


async def main(a: argparse.Namespace) -> int:
    consumer = AIOKafkaConsumer(a.input, bootstrap_servers=a.bootstrap, group_id=a.group,
                                isolation_level="read_committed", enable_auto_commit=False,
                                auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                                heartbeat_interval_ms=HEARTBEAT_MS, rebalance_timeout_ms=5000)
    producer = AIOKafkaProducer(bootstrap_servers=a.bootstrap, transactional_id=a.transactional_id,
                                transaction_timeout_ms=10_000)
    await producer.start()
    await consumer.start()
    loop = asyncio.get_running_loop()
    idle_since = None
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=300, max_records=a.max_batch)
            records = [(tp, r) for tp, rs in batches.items() for r in rs]
            if not records:
                if consumer.assignment():
                    idle_since = idle_since or loop.time()
                    if loop.time() - idle_since >= a.idle_exit:
                        return 0
                continue
            idle_since = None
            inputs = [r.value.decode() for _, r in records]
            offsets = {}
            for tp, r in records:
                offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
            try:
                async with producer.transaction():
                    for _, r in records:
                        await producer.send(a.output, f"{r.value.decode()}|{a.instance}".encode(),
                                            key=r.key)
                    if a.delay:
                        await asyncio.sleep(a.delay)
                    await producer.send_offsets_to_transaction(offsets, a.group)
            except ProducerFenced:
                print("fenced " + json.dumps(inputs), flush=True)
                return 3
            print("committed " + json.dumps(inputs), flush=True)
    finally:
        for stop in (consumer.stop, producer.stop):
            try:
                await stop()
            except Exception as exc:  # noqa: BLE001 - a fenced producer may fail to stop cleanly
                print(f"stop: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "output", "group", "transactional_id"):
        ap.add_argument(name)
    ap.add_argument("--instance", default="app")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--max-batch", type=int, default=20)
    ap.add_argument("--idle-exit", type=float, default=3.0)
    sys.exit(asyncio.run(main(ap.parse_args())))
