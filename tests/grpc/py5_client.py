"""Drive the unmodified RocketMQ 5.x Python client (PyPI ``rocketmq-python-client``) for one
scenario, in its own process: its protobuf names are the broker's too, and one process cannot
load both.  Prints one JSON object per line (what happened), ``{"done": ...}`` last.

Scenarios:

* ``send ENDPOINT TOPIC N [--tag T] [--group G] [--deliver-ms MS]``: N normal messages (FIFO with
  ``--group``, DELAY with ``--deliver-ms``, the absolute time);
* ``tx ENDPOINT TOPIC N --end commit|rollback|none``: N transactions, each one half ended as
  asked; ``none`` leaves them open and then waits to be killed (an orphaned transaction);
* ``check ENDPOINT TOPIC N --answer commit|rollback``: a producer with a checker that answers
  every check-back and prints it, until N checks came;
* ``recall ENDPOINT TOPIC N --deliver-s S``: N timer messages due at epoch second S (this
  client sends ``delivery_timestamp`` in whole seconds), then RecallMessage of the first, twice
  (the second must fail), printing each send's recall handle and each recall's outcome.

``--ak KEY --sk SECRET`` sign every call with those credentials (none: unsigned).  With
``--refusal-ok``, a start-up or send the broker refuses prints ``{"refused": "<the client's
error>"}`` and ends the scenario (exit 0, ``done`` last) instead of failing it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.v5.exception.client_exception import ClientException

#: A scenario never waits longer than this for anything.
DEADLINE_S = 60.0


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def message(topic: str, i: int, args: argparse.Namespace) -> Message:
    m = Message()
    m.topic = topic
    m.body = f"{args.prefix}-{i}".encode()
    m.tag = args.tag
    m.keys = f"k{i}"
    m.add_property("n", str(i))
    if args.group:
        m.message_group = args.group
    if args.deliver_ms:
        m.delivery_timestamp = args.deliver_ms
    if args.deliver_s:
        m.delivery_timestamp = args.deliver_s
    return m


class Checker(TransactionChecker):
    def __init__(self, answer: str, wanted: int) -> None:
        self.answer = answer
        self.wanted = wanted
        self.seen = 0
        self.enough = threading.Event()

    def check(self, msg) -> TransactionResolution:
        self.seen += 1
        emit(check=msg.message_id, topic=msg.topic, body=msg.body.decode())
        if self.seen >= self.wanted:
            self.enough.set()
        return TransactionResolution.COMMIT if self.answer == "commit" else TransactionResolution.ROLLBACK


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=("send", "tx", "check", "recall"))
    ap.add_argument("endpoint")
    ap.add_argument("topic")
    ap.add_argument("n", type=int)
    ap.add_argument("--tag", default="t")
    ap.add_argument("--group", default=None)
    ap.add_argument("--deliver-ms", type=int, default=0)
    ap.add_argument("--deliver-s", type=int, default=0)
    ap.add_argument("--end", choices=("commit", "rollback", "none"), default="commit")
    ap.add_argument("--answer", choices=("commit", "rollback"), default="commit")
    ap.add_argument("--prefix", default="m")
    ap.add_argument("--ak", default="")
    ap.add_argument("--sk", default="")
    ap.add_argument("--refusal-ok", action="store_true")
    args = ap.parse_args()
    config = ClientConfiguration(args.endpoint, Credentials(args.ak, args.sk), request_timeout=10)
    checker = Checker(args.answer, args.n) if args.scenario in ("tx", "check") else None
    producer = Producer(config, (args.topic,), checker)
    try:
        producer.startup()
    except Exception as exc:  # the client wraps a refused route in its own errors
        if not args.refusal_ok:
            raise
        emit(refused=f"startup: {exc}")
        emit(done=True)
        return 0
    emit(started=True)
    try:
        return run(producer, checker, args)
    except Exception as exc:  # a refused route is a bare Exception, a refused send a ClientException
        if not args.refusal_ok:
            raise
        emit(refused=str(exc))
        emit(done=True)
        return 0
    finally:
        producer.shutdown()


def run(producer: Producer, checker: Checker | None, args: argparse.Namespace) -> int:
    if args.scenario == "send":
        for i in range(args.n):
            receipt = producer.send(message(args.topic, i, args))
            emit(sent=receipt.message_id, i=i)
    elif args.scenario == "tx":
        for i in range(args.n):
            tx = producer.begin_transaction()
            receipt = producer.send(message(args.topic, i, args), tx)
            emit(half=receipt.message_id, transaction_id=receipt.transaction_id, i=i)
            if args.end == "commit":
                tx.commit()
            elif args.end == "rollback":
                tx.rollback()
            emit(ended=receipt.message_id, how=args.end)
        if args.end == "none":
            time.sleep(DEADLINE_S)  # killed here: the halves are orphaned
            return 1
    elif args.scenario == "recall":
        receipts = []
        for i in range(args.n):
            receipt = producer.send(message(args.topic, i, args))
            receipts.append(receipt)
            emit(sent=receipt.message_id, i=i, recall_handle=receipt.recall_handle)
        for attempt in range(2):
            try:
                emit(recalled=producer.recall_message(args.topic, receipts[0].recall_handle),
                     attempt=attempt)
            except ClientException as exc:
                emit(recall_failed=str(exc), attempt=attempt)
    else:
        if not checker.enough.wait(DEADLINE_S):
            emit(error=f"{checker.seen} of {args.n} checks within {DEADLINE_S} s")
            return 1
        time.sleep(0.5)  # the last answer goes out
    emit(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
