"""One load process of ``python -m txbroker.bench.grpc``: a client loading the broker for one
measured window, run as ``python -m txbroker.bench.grpc_load KIND ROW ADDRESS TOPIC ...``.

Why a process of its own: the RocketMQ 5.x Python client (``rocketmq-python-client``) registers
protobuf messages under the same names as txbroker's gRPC stubs, and one process cannot load
both; and the 5.x client is synchronous and holds the GIL for most of a call, so several
processes are what loads a broker, as several application processes would.  The remoting
path's load runs the same way (same number of processes and senders), so both paths are
measured alike.

``KIND`` ``grpc`` is the unmodified 5.x client given the broker's gRPC endpoint (``ADDRESS``),
``--senders`` threads sharing one client; ``remoting`` is the txbroker SDK finding the broker
through the name server (``ADDRESS``), ``--senders`` coroutines sharing one client.  ``ROW``:

* ``send``: a normal message per send, counted when its answer came back;
* ``tx``: a transaction per send (half, then commit), counted when the commit is done as each
  client does it (the 5.x client waits for EndTransaction's answer, the SDK sends
  END_TRANSACTION one-way, as RocketMQ's 4.x clients do);
* ``consume``: the topic's messages consumed by group ``GROUP_<TOPIC>``: a SimpleConsumer's
  receive (POP, ``--batch`` at a time) and one ack per message, or the SDK Consumer's ``poll``
  (pull, offsets committed by the consumer), counted per message acked or polled; a sender
  stops at an empty receive (poll) once its process has consumed something: the backlog is
  drained;
* ``timer``: timer messages at ``--rate`` per second for the whole process (spread over its
  senders), each due on the first whole second at least ``--delay`` seconds after its send
  (``delivery_timestamp``, or the SDK's ``deliver_time_ms``), counted when the send is answered.

Protocol with the driver, one JSON object per line: this process prints ``{"ready": true}``
once its client has started and made one warm-up call (a send, or a receive of at most one
message, so routes, assignments and connections exist before the window opens; an SDK Consumer
makes none: once started it pulls ahead, so it starts when the window opens), waits for one
line on stdin (the window opens), runs until ``--seconds`` have passed or ``--max`` calls were
made, and prints ``{"count", "extra", "errors", "seconds", "active_s", "cpu_s",
"latencies_ms"}``: messages counted, what the warm-up sent or consumed besides (the driver
checks the topic against both), failed calls, the window's length and the time from its start
to the last message counted, this process's CPU seconds over the window (every thread of the
client) and each call's latency (a consume row: one receive or poll with its acks).  A failed
start prints ``{"error": ...}`` and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import threading
import time

#: Every message's body, as ``bench.broker`` sends.
BODY = b"x" * 200
#: The 5.x client's request time-out; an SDK call is cut off at twice it.
CALL_TIMEOUT_S = 10
#: A received message stays invisible for the window and this long after it, so nothing is
#: redelivered while the row runs.
INVISIBLE_MARGIN_S = 60
#: Long-polling time of a consume row's receive or poll: an empty one ends its sender.
POLL_S = 1
#: The topic's queues (the driver creates it with 4).
QUEUES = 4

log = logging.getLogger("txbroker.bench.grpc_load")


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


class Window:
    """The measured window's bounds and counts, shared by the senders of one process."""

    def __init__(self, seconds: float, max_calls: int) -> None:
        self.seconds, self.max_calls = seconds, max_calls
        self.started = self.count = self.errors = self.extra = 0
        self.latencies: list[float] = []
        self.lock = threading.Lock()
        self.start = self.stop_at = self.last = 0.0

    def open(self) -> None:
        self.start = time.monotonic()
        self.stop_at = self.start + self.seconds

    def may_start(self) -> bool:
        """The bound on every sender's loop: time and count."""
        with self.lock:
            if self.started >= self.max_calls or time.monotonic() >= self.stop_at:
                return False
            self.started += 1
            return True

    def done(self, t0: float, messages: int = 1) -> None:
        with self.lock:
            self.count += messages
            self.latencies.append((time.perf_counter() - t0) * 1e3)
            self.last = time.monotonic()

    def drained(self) -> bool:
        """An empty receive or poll ends a sender once this process has consumed something: a
        process whose first calls find nothing (its client still starting, or the other
        processes holding what was visible) keeps trying until then, within the window."""
        return self.count > 0

    def failed(self) -> bool:
        """Count a call that raised; True for the first, whose traceback goes to stderr (the
        driver keeps it in a file: later ones would only repeat it)."""
        with self.lock:
            self.errors += 1
            return self.errors == 1

    def due(self, sender: int, senders: int, i: int, rate: float) -> float:
        """When the ``i``-th timer of ``sender`` is due to be sent: the senders' sends
        interleaved, ``rate`` per second for this process."""
        return self.start + (i * senders + sender) / rate

    def report(self, cpu_s: float) -> dict:
        return {"count": self.count, "extra": self.extra, "errors": self.errors,
                "seconds": time.monotonic() - self.start,
                "active_s": (self.last - self.start) if self.last else 0.0, "cpu_s": cpu_s,
                "latencies_ms": [round(x, 3) for x in self.latencies]}


def deliver_s(args: argparse.Namespace) -> int:
    """A timer's due time: the first whole second at least ``--delay`` after now.  Whole
    seconds because the 5.x Python client sends ``delivery_timestamp`` as whole seconds (the
    protobuf Timestamp's ``seconds``); the SDK's timers are due at the same instants, so both
    rows give the broker the same shape of load: each second's timers fall due together."""
    return int(time.time() + args.delay) + 1


# --- the 5.x client ----------------------------------------------------------------------------


def run_grpc(args: argparse.Namespace, window: Window) -> None:
    """``--senders`` threads on one 5.x client."""
    from rocketmq import ClientConfiguration, Credentials

    config = ClientConfiguration(args.address, Credentials(), request_timeout=CALL_TIMEOUT_S)
    if args.row == "consume":
        client, one = _grpc_consumer(args, config)
    else:
        client, one = _grpc_producer(args, config)
    client.startup()

    def sender(index: int) -> None:
        i = 0
        while window.may_start():
            if args.row == "timer":
                time.sleep(max(0.0, window.due(index, args.senders, i, args.rate) - time.monotonic()))
                i += 1
            t0 = time.perf_counter()
            try:
                got = one()
            except Exception:  # counted: the row reports its errors
                if window.failed():
                    log.exception("call failed (later failures are only counted)")
                continue
            if got == 0:  # an empty receive
                if window.drained():
                    return
                continue
            window.done(t0, got)

    try:
        window.extra = one()
        emit(ready=True)
        sys.stdin.readline()
        cpu0 = time.process_time()
        window.open()
        threads = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(args.senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(window.seconds + 3 * CALL_TIMEOUT_S)
        emit(**window.report(time.process_time() - cpu0))
    finally:
        client.shutdown()


def _grpc_producer(args: argparse.Namespace, config: object) -> tuple[object, object]:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    class Commit(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            return TransactionResolution.COMMIT

    tx = args.row == "tx"
    producer = Producer(config, (args.topic,), Commit() if tx else None)

    def one() -> int:
        m = Message()
        m.topic, m.body, m.tag = args.topic, BODY, "bench"
        if args.row == "timer":
            m.delivery_timestamp = deliver_s(args)
        if tx:
            transaction = producer.begin_transaction()
            producer.send(m, transaction)
            transaction.commit()
        else:
            producer.send(m)
        return 1

    return producer, one


def _grpc_consumer(args: argparse.Namespace, config: object) -> tuple[object, object]:
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(config, f"GROUP_{args.topic}", {args.topic: FilterExpression()},
                              await_duration=POLL_S)
    first = [True]

    def one() -> int:
        batch = 1 if first[0] else args.batch  # the warm-up takes one message at most
        first[0] = False
        messages = consumer.receive(batch, int(args.seconds) + INVISIBLE_MARGIN_S)
        for m in messages:
            consumer.ack(m)
        return len(messages)

    return consumer, one


# --- the txbroker SDK --------------------------------------------------------------------------


async def run_remoting(args: argparse.Namespace, window: Window) -> None:
    """``--senders`` coroutines on one SDK client."""
    consume = args.row == "consume"
    client, one = _sdk_consumer(args) if consume else _sdk_producer(args)

    async def sender(index: int) -> None:
        i = 0
        while window.may_start():
            if args.row == "timer":
                await asyncio.sleep(max(0.0, window.due(index, args.senders, i, args.rate) - time.monotonic()))
                i += 1
            t0 = time.perf_counter()
            try:
                got = await asyncio.wait_for(one(), 2 * CALL_TIMEOUT_S)
            except Exception:  # counted: the row reports its errors
                if window.failed():
                    log.exception("call failed (later failures are only counted)")
                continue
            if got == 0:  # an empty poll
                if window.drained():
                    return
                continue
            window.done(t0, got)

    try:
        if not consume:
            await client.start()
            window.extra = await one()
        emit(ready=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        cpu0 = time.process_time()
        window.open()
        if consume:  # a started Consumer pulls ahead at once: its start is inside the window
            await client.start()
        await asyncio.gather(*(sender(i) for i in range(args.senders)))
        emit(**window.report(time.process_time() - cpu0))
    finally:
        await client.shutdown()


def _sdk_producer(args: argparse.Namespace) -> tuple[object, object]:
    from txbroker.client import (
        LocalTransactionState,
        Message,
        MessageExt,
        Producer,
        SendStatus,
        TransactionListener,
        TransactionProducer,
    )

    class Commit(TransactionListener):
        def execute_local_transaction(self, msg: MessageExt, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    tx = args.row == "tx"
    group = f"PG_{args.topic}"
    producer = (TransactionProducer(group, args.address, listener=Commit()) if tx
                else Producer(group, args.address))

    async def one() -> int:
        msg = (Message(args.topic, BODY, tags="bench", deliver_time_ms=deliver_s(args) * 1000)
               if args.row == "timer" else Message(args.topic, BODY, tags="bench"))
        if tx:
            result = await producer.send_message_in_transaction(msg)
            if result.local_transaction_state != LocalTransactionState.COMMIT_MESSAGE:
                raise RuntimeError(f"transaction not committed: {result}")
        else:
            result = await producer.send(msg)
            if result.send_status != SendStatus.SEND_OK:
                raise RuntimeError(f"send not stored: {result}")
        return 1

    return producer, one


def _sdk_consumer(args: argparse.Namespace) -> tuple[object, object]:
    from txbroker.client import Consumer, MessageQueue

    consumer = Consumer(f"GROUP_{args.topic}", args.address, from_where="first",
                        long_poll_timeout=POLL_S, pull_batch_size=args.batch)
    # Queue i to process i mod N: a static share of the group's queues, where several SDK
    # consumers starting together would first each take every queue and then rebalance.
    consumer.assign([MessageQueue(args.topic, args.broker, q)
                     for q in range(QUEUES) if q % args.of == args.index])

    async def one() -> int:
        return 0 if await consumer.poll(POLL_S) is None else 1

    return consumer, one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("grpc", "remoting"))
    ap.add_argument("row", choices=("send", "tx", "consume", "timer"))
    ap.add_argument("address", help="grpc: the gRPC endpoint; remoting: the name server")
    ap.add_argument("topic")
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--max", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=32, help="consume: messages per receive")
    ap.add_argument("--rate", type=float, default=1000.0, help="timer: timers/s of this process")
    ap.add_argument("--delay", type=float, default=1.0, help="timer: due this long after the send")
    ap.add_argument("--index", type=int, default=0, help="consume (SDK): this process's number")
    ap.add_argument("--of", type=int, default=1, help="consume (SDK): how many processes share the queues")
    ap.add_argument("--broker", default="", help="consume (SDK): the broker's name")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    window = Window(args.seconds, args.max)
    try:
        if args.kind == "grpc":
            run_grpc(args, window)
        else:
            import uvloop

            uvloop.run(run_remoting(args, window))
    except Exception as exc:  # the driver shows this line as the row's failure
        log.exception("load process failed")
        emit(error=f"{args.kind} {args.row} client at {args.address}: {exc!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
