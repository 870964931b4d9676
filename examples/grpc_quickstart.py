"""RocketMQ 5.x clients on txbroker's gRPC endpoint, no proxy: the official Python client
(``rocketmq-python-client``) sends, commits and rolls back transactions, and consumes.

Run a broker with its gRPC endpoint (``txbroker serve --grpc-port 8081``), then
``python examples/grpc_quickstart.py [--endpoint 127.0.0.1:8081] [--topic grpc-quickstart]``.

It sends one plain message, commits a transaction of one order, rolls back another, and reads
the topic with a SimpleConsumer, acknowledging each message: the plain and the committed
messages arrive, the rolled-back one never does.  Each step prints one line; the run is bounded
(it stops after ``--timeout`` seconds without the expected messages, exit status 1).
Needs the 5.x client (``pip install -e '.[test]'`` installs it, or
``pip install rocketmq-python-client==5.1.2``).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


class Checker(TransactionChecker):
    """Asked by the broker about a transaction left undecided (none is, here)."""

    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.ROLLBACK


def message(topic: str, body: str, key: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    msg.keys = key
    return msg


def produce(config: ClientConfiguration, topic: str, run: str) -> set[str]:
    """One plain message, one committed and one rolled-back transaction; the bodies expected."""
    producer = Producer(config, (topic,), Checker())
    producer.startup()
    try:
        receipt = producer.send(message(topic, f"{run} hello", "hello"))
        print(f"sent a plain message: id {receipt.message_id}")
        tx = producer.begin_transaction()
        receipt = producer.send(message(topic, f"{run} order 1", "order-1"), tx)
        tx.commit()
        print(f"committed a transaction of 1 message: id {receipt.message_id}")
        tx = producer.begin_transaction()
        producer.send(message(topic, f"{run} order 2 (rolled back)", "order-2"), tx)
        tx.rollback()
        print("rolled back a transaction of 1 message")
    finally:
        producer.shutdown()
    return {f"{run} hello", f"{run} order 1"}


def consume(config: ClientConfiguration, topic: str, run: str, expected: set[str],
            timeout: float) -> bool:
    """Receive and acknowledge until ``expected`` came (or the timeout); True when exactly
    ``expected`` of this run came."""
    consumer = SimpleConsumer(config, f"quickstart-{run}", {topic: FilterExpression()},
                              await_duration=2)
    consumer.startup()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not expected <= set(seen):
            for msg in consumer.receive(16, 30) or []:
                body = msg.body.decode()
                consumer.ack(msg)
                if body.startswith(run):
                    seen.append(body)
                    print(f"SimpleConsumer got {body!r} (attempt {msg.delivery_attempt}), acked")
    finally:
        consumer.shutdown()
    return sorted(seen) == sorted(expected)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="127.0.0.1:8081", help="the broker's gRPC endpoint")
    ap.add_argument("--topic", default="grpc-quickstart")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    run = uuid.uuid4().hex[:8]
    config = ClientConfiguration(args.endpoint, Credentials(), request_timeout=10)
    try:
        expected = produce(config, args.topic, run)
        ok = consume(config, args.topic, run, expected, args.timeout)
    except Exception as exc:  # noqa: BLE001 - the 5.x client raises bare Exceptions
        # (a route it cannot fetch, a refused send): one line, no traceback
        print(f"error: {args.endpoint}: {exc}", file=sys.stderr)
        return 1
    if not ok:
        print(f"error: the committed messages did not all arrive within {args.timeout:.0f} s",
              file=sys.stderr)
        return 1
    print("ok: 2 messages read and acknowledged, the rolled-back one never")
    return 0


if __name__ == "__main__":
    sys.exit(main())
