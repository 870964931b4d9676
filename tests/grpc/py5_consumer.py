"""Drive the unmodified RocketMQ 5.x Python client's consumers for one scenario, in its own
process (as tests/grpc/py5_client.py does for producers).  Prints one JSON object per line,
``{"done": ...}`` last.

Scenarios (``ENDPOINT TOPIC GROUP N``; every wait bounded by ``DEADLINE_S``):

* ``receive``: a SimpleConsumer receives (``--batch`` at a time, invisible ``--invisible`` s)
  until N messages came, acks each unless ``--no-ack`` (only the first K with
  ``--ack-first K``), then receives for ``--quiet`` seconds
  more and prints what came (nothing, when all were acked);
* ``redeliver``: receives one message (invisible ``--invisible`` s), leaves it unacked,
  receives until it comes back, prints both deliveries and acks the second;
* ``change``: receives one message (invisible 2 s), changes its invisible duration to 30 s,
  receives for 4 s (nothing may come), then acks it under its new handle;
* ``give-up``: receives without acking until N deliveries of one message came, then receives
  for ``--quiet`` seconds more, printing anything that still comes;
* ``push``: a PushConsumer with ``--threads`` consumption threads acks every message until N
  distinct ones came.

``--ak KEY --sk SECRET`` sign every call with those credentials (none: unsigned).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)

DEADLINE_S = 60.0


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def show(kind: str, m) -> None:
    emit(**{kind: m.body.decode()}, id=m.message_id, attempt=m.delivery_attempt,
         handle=m.receipt_handle, tag=m.tag)


def receive_for(consumer: SimpleConsumer, seconds: float, invisible: int,
                batch: int = 16) -> list:
    got: list = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got += consumer.receive(batch, invisible)
    return got


def simple(args: argparse.Namespace) -> int:
    config = ClientConfiguration(args.endpoint, Credentials(args.ak, args.sk), request_timeout=5)
    consumer = SimpleConsumer(config, args.group, {args.topic: FilterExpression(args.tag)},
                              await_duration=args.poll)
    consumer.startup()
    emit(started=True)
    deadline = time.monotonic() + DEADLINE_S
    try:
        if args.scenario == "receive":
            seen = 0
            while seen < args.n and time.monotonic() < deadline:
                for m in consumer.receive(args.batch, args.invisible):
                    show("got", m)
                    seen += 1
                    if args.ack and (args.ack_first is None or seen <= args.ack_first):
                        consumer.ack(m)
                        emit(acked=m.body.decode())
            for m in receive_for(consumer, args.quiet, args.invisible, args.batch):
                show("extra", m)
        elif args.scenario == "redeliver":
            first = []
            while not first and time.monotonic() < deadline:
                first = consumer.receive(1, args.invisible)
            show("got", first[0])
            again = []
            while not again and time.monotonic() < deadline:
                again = consumer.receive(1, args.invisible)
            show("again", again[0])
            consumer.ack(again[0])
            emit(acked=again[0].message_id)
        elif args.scenario == "change":
            first = []
            while not first and time.monotonic() < deadline:
                first = consumer.receive(1, 2)
            show("got", first[0])
            old = first[0].receipt_handle
            consumer.change_invisible_duration(first[0], 30)
            emit(changed=first[0].message_id, new_handle=first[0].receipt_handle != old)
            for m in receive_for(consumer, 4.0, 2):
                show("extra", m)
            consumer.ack(first[0])
            emit(acked=first[0].message_id)
        else:  # give-up
            deliveries = 0
            while deliveries < args.n and time.monotonic() < deadline:
                for m in consumer.receive(1, args.invisible):
                    show("got", m)
                    deliveries += 1
            for m in receive_for(consumer, args.quiet, args.invisible):
                show("extra", m)
        emit(done=True)
        return 0
    finally:
        consumer.shutdown()


class Listener(MessageListener):
    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.lock = threading.Lock()
        self.bodies: set[str] = set()
        self.threads: set[str] = set()
        self.enough = threading.Event()

    def consume(self, message) -> ConsumeResult:
        with self.lock:
            show("got", message)
            self.bodies.add(message.body.decode())
            self.threads.add(threading.current_thread().name)
            if len(self.bodies) >= self.wanted:
                self.enough.set()
        time.sleep(0.05)  # work: several threads busy at once
        return ConsumeResult.SUCCESS


def push(args: argparse.Namespace) -> int:
    config = ClientConfiguration(args.endpoint, Credentials(args.ak, args.sk), request_timeout=5)
    listener = Listener(args.n)
    consumer = PushConsumer(config, args.group, listener, {args.topic: FilterExpression(args.tag)},
                            consumption_thread_count=args.threads)
    consumer.startup()
    emit(started=True)
    try:
        if not listener.enough.wait(DEADLINE_S):
            emit(error=f"{len(listener.bodies)} of {args.n} messages within {DEADLINE_S} s")
            return 1
        time.sleep(1.0)  # the last acks go out
        emit(threads=len(listener.threads))
        emit(done=True)
        return 0
    finally:
        consumer.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=("receive", "redeliver", "change", "give-up", "push"))
    ap.add_argument("endpoint")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("n", type=int)
    ap.add_argument("--tag", default="*")
    ap.add_argument("--invisible", type=int, default=30)
    ap.add_argument("--poll", type=int, default=2)
    ap.add_argument("--quiet", type=float, default=0.0)
    ap.add_argument("--no-ack", dest="ack", action="store_false")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ack-first", type=int, default=None)
    ap.add_argument("--ak", default="")  # with --sk: every call signed
    ap.add_argument("--sk", default="")
    args = ap.parse_args()
    return push(args) if args.scenario == "push" else simple(args)


if __name__ == "__main__":
    sys.exit(main())
