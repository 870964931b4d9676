"""An exactly-once consume-transform-produce app that rides out broker restarts, on
librdkafka (confluent-kafka) or aiokafka, run as a process by the group-restart tests.

It reads the input topic in a consumer group (read_committed, no auto commit) and, every
``--batch`` records (or fewer when no more arrive), runs one transaction: one output per input
(value ``<input value>|app``, same key) and the consumed offsets through
``send_offsets_to_transaction``.  Each commit prints ``committed <unix time> <json list of
input values>``; a rebalance that takes partitions away prints ``rebalance <unix time>
<revoked|lost> <count>`` (the first assignment prints nothing).  A failed transaction is aborted and the consumer goes back to the committed
offsets, as an application is expected to do; the process keeps going across a broker restart.
With no input for ``--idle-exit`` seconds after it has committed something it exits 0.

Run: python tests/support/kafka_group_pipeline.py CLIENT BOOTSTRAP INPUT OUTPUT GROUP
     TRANSACTIONAL_ID [--batch N] [--session-ms MS] [--idle-exit SECONDS] [--delay SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


def report(inputs: list[str]) -> None:
    print(f"committed {time.time():.3f} {json.dumps(inputs)}", flush=True)


#: Set when the app stops: the revoke of its own close is no rebalance.
closing = False


def report_rebalance(kind: str, partitions) -> None:
    if partitions and not closing:
        print(f"rebalance {time.time():.3f} {kind} {len(partitions)}", flush=True)


#: No re-bootstrap: with it, librdkafka's send_offsets_to_transaction can wait indefinitely
#: after the only broker restarts (docs/kafka.md, "Consumer groups", "What is durable").
RDKAFKA_COMMON = {"metadata.recovery.strategy": "none"}


def run_rdkafka(a: argparse.Namespace) -> int:
    from confluent_kafka import Consumer, KafkaException, Producer

    consumer = Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": a.session_ms,
                         "heartbeat.interval.ms": 500, "max.poll.interval.ms": 300_000,
                         **RDKAFKA_COMMON})
    producer = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": a.transactional_id,
                         "transaction.timeout.ms": 60_000, **RDKAFKA_COMMON})
    producer.init_transactions(30)
    consumer.subscribe([a.input], on_revoke=lambda c, ps: report_rebalance("revoked", ps),
                       on_lost=lambda c, ps: report_rebalance("lost", ps))
    last = time.monotonic()
    committed_any = False
    try:
        while True:
            msgs = [m for m in consumer.consume(num_messages=a.batch, timeout=0.5)
                    if m.error() is None]
            if not msgs:
                if committed_any and time.monotonic() - last >= a.idle_exit:
                    return 0
                continue
            last = time.monotonic()
            inputs = [m.value().decode() for m in msgs]
            try:
                producer.begin_transaction()
                for m in msgs:
                    producer.produce(a.output, value=f"{m.value().decode()}|app".encode(),
                                     key=m.key())
                if a.delay:
                    time.sleep(a.delay)
                producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                     consumer.consumer_group_metadata(), 30)
                producer.commit_transaction(30)
            except KafkaException as exc:
                err = exc.args[0]
                print(f"transaction failed: {err}", file=sys.stderr, flush=True)
                if err.fatal():
                    return 1
                if err.txn_requires_abort() or not err.retriable():
                    producer.abort_transaction(30)
                rewind_rdkafka(consumer)
                continue
            committed_any = True
            report(inputs)
    finally:
        global closing
        closing = True
        consumer.close()


def rewind_rdkafka(consumer) -> None:
    """Back to the committed offsets: the aborted inputs are read again."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in consumer.committed(assignment, timeout=30):
        tp.offset = max(tp.offset, 0)
        consumer.seek(tp)


async def run_aiokafka(a: argparse.Namespace) -> int:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked) -> None:
            report_rebalance("revoked", revoked)

        def on_partitions_assigned(self, assigned) -> None:
            pass

    consumer = AIOKafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group,
                                isolation_level="read_committed", enable_auto_commit=False,
                                auto_offset_reset="earliest", session_timeout_ms=a.session_ms,
                                heartbeat_interval_ms=500, rebalance_timeout_ms=10_000)
    producer = AIOKafkaProducer(bootstrap_servers=a.bootstrap, transactional_id=a.transactional_id,
                                transaction_timeout_ms=60_000)
    await producer.start()
    await consumer.start()
    consumer.subscribe([a.input], listener=Listener())
    loop = asyncio.get_running_loop()
    last = loop.time()
    committed_any = False
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=a.batch)
            records = [(tp, r) for tp, rs in batches.items() for r in rs]
            if not records:
                if committed_any and loop.time() - last >= a.idle_exit:
                    return 0
                continue
            last = loop.time()
            inputs = [r.value.decode() for _, r in records]
            offsets = {}
            for tp, r in records:
                offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
            try:
                async with producer.transaction():
                    for _, r in records:
                        await producer.send(a.output, f"{r.value.decode()}|app".encode(), key=r.key)
                    if a.delay:
                        await asyncio.sleep(a.delay)
                    await producer.send_offsets_to_transaction(offsets, a.group)
            except KafkaError as exc:
                print(f"transaction failed: {exc!r}", file=sys.stderr, flush=True)
                for tp in consumer.assignment():
                    consumer.seek(tp, await consumer.committed(tp) or 0)
                continue
            committed_any = True
            report(inputs)
    finally:
        global closing
        closing = True
        for stop in (consumer.stop, producer.stop):
            try:
                await stop()
            except Exception as exc:  # noqa: BLE001 - stopping after a failure may fail too
                print(f"stop: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("client", choices=("rdkafka", "aiokafka"))
    for name in ("bootstrap", "input", "output", "group", "transactional_id"):
        ap.add_argument(name)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--session-ms", type=int, default=10_000)
    ap.add_argument("--idle-exit", type=float, default=5.0)
    ap.add_argument("--delay", type=float, default=0.0)
    args = ap.parse_args()
    if args.client == "rdkafka":
        sys.exit(run_rdkafka(args))
    sys.exit(asyncio.run(run_aiokafka(args)))
