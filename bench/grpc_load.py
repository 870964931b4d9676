"""One load process of ``python -m txbroker.bench.grpc``: a client sending to the broker for one
measured window, run as ``python -m txbroker.bench.grpc_load KIND ROW ADDRESS TOPIC ...``.

Why a process of its own: the RocketMQ 5.x Python client (``rocketmq-python-client``) registers
protobuf messages under the same names as txbroker's gRPC stubs, and one process cannot load
both; and the 5.x client is synchronous and holds the GIL for most of a send, so several
processes are what loads a broker, as several application processes would.  The remoting
path's load runs the same way (same number of processes and senders), so both paths are
measured alike.

* ``KIND`` ``grpc``: the unmodified 5.x client, ``--senders`` threads sharing one ``Producer``
  given the broker's gRPC endpoint (``ADDRESS``); ``remoting``: the txbroker SDK,
  ``--senders`` coroutines sharing one ``Producer`` / ``TransactionProducer`` that finds the
  broker through the name server (``ADDRESS``).
* ``ROW`` ``send``: a normal message per send, counted when its answer came back; ``tx``: a
  transaction per send (half, then commit), counted when the commit is sent and answered as
  each client does it (the 5.x client waits for EndTransaction's answer, the SDK sends
  END_TRANSACTION one-way, as RocketMQ's 4.x clients do).

Protocol with the driver, one JSON object per line: this process prints ``{"ready": true}``
once its client has started and sent one warm-up message (so routes and connections exist
before the window opens), waits for one line on stdin (the window opens), sends until
``--seconds`` have passed or ``--max`` sends were made, and prints ``{"count", "stored",
"errors", "seconds", "cpu_s", "latencies_ms"}``: answered sends, every message it stored
including the warm-up (what the driver checks the topic against), failed sends, the window's
length, this process's CPU seconds over it (every thread of the client) and each send's
latency.  A failed start prints ``{"error": ...}`` and exits 1.
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
#: A send never waits longer for its answer (both clients' own time-outs are set to it).
SEND_TIMEOUT_S = 10

log = logging.getLogger("txbroker.bench.grpc_load")


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


class Window:
    """The measured window's bounds and counts, shared by the senders of one process."""

    def __init__(self, seconds: float, max_sends: int) -> None:
        self.seconds, self.max_sends = seconds, max_sends
        self.started = self.count = self.errors = 0
        self.stored = 1  # the warm-up message
        self.latencies: list[float] = []
        self.lock = threading.Lock()
        self.start = self.stop_at = 0.0

    def open(self) -> None:
        self.start = time.monotonic()
        self.stop_at = self.start + self.seconds

    def may_start(self) -> bool:
        """The bound on every sender's loop: time and count."""
        with self.lock:
            if self.started >= self.max_sends or time.monotonic() >= self.stop_at:
                return False
            self.started += 1
            return True

    def done(self, t0: float) -> None:
        with self.lock:
            self.count += 1
            self.stored += 1
            self.latencies.append((time.perf_counter() - t0) * 1e3)

    def failed(self) -> bool:
        """Count a send that raised; True for the first, whose traceback goes to stderr (the
        driver keeps it in a file: later ones would only repeat it)."""
        with self.lock:
            self.errors += 1
            return self.errors == 1

    def report(self, cpu_s: float) -> dict:
        return {"count": self.count, "stored": self.stored, "errors": self.errors,
                "seconds": time.monotonic() - self.start, "cpu_s": cpu_s,
                "latencies_ms": [round(x, 3) for x in self.latencies]}


def run_grpc(args: argparse.Namespace, window: Window) -> None:
    """The 5.x client: ``--senders`` threads on one Producer."""
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        Message,
        Producer,
        TransactionChecker,
        TransactionResolution,
    )

    class Commit(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            return TransactionResolution.COMMIT

    tx = args.row == "tx"
    producer = Producer(ClientConfiguration(args.address, Credentials(), request_timeout=SEND_TIMEOUT_S),
                        (args.topic,), Commit() if tx else None)
    producer.startup()

    def one() -> None:
        m = Message()
        m.topic, m.body, m.tag = args.topic, BODY, "bench"
        if tx:
            transaction = producer.begin_transaction()
            producer.send(m, transaction)
            transaction.commit()
        else:
            producer.send(m)

    def sender() -> None:
        while window.may_start():
            t0 = time.perf_counter()
            try:
                one()
            except Exception:  # counted: the row reports its errors
                if window.failed():
                    log.exception("send failed (later failures are only counted)")
            else:
                window.done(t0)

    try:
        one()
        emit(ready=True)
        sys.stdin.readline()
        cpu0 = time.process_time()
        window.open()
        threads = [threading.Thread(target=sender, daemon=True) for _ in range(args.senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(window.seconds + 2 * SEND_TIMEOUT_S * 3)
        emit(**window.report(time.process_time() - cpu0))
    finally:
        producer.shutdown()


async def run_remoting(args: argparse.Namespace, window: Window) -> None:
    """The txbroker SDK: ``--senders`` coroutines on one Producer or TransactionProducer."""
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
    await producer.start()

    async def one() -> None:
        msg = Message(args.topic, BODY, tags="bench")
        if tx:
            result = await producer.send_message_in_transaction(msg)
            if result.local_transaction_state != LocalTransactionState.COMMIT_MESSAGE:
                raise RuntimeError(f"transaction not committed: {result}")
        else:
            result = await producer.send(msg)
            if result.send_status != SendStatus.SEND_OK:
                raise RuntimeError(f"send not stored: {result}")

    async def sender() -> None:
        while window.may_start():
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(one(), SEND_TIMEOUT_S)
            except Exception:  # counted: the row reports its errors
                if window.failed():
                    log.exception("send failed (later failures are only counted)")
            else:
                window.done(t0)

    try:
        await one()
        emit(ready=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        cpu0 = time.process_time()
        window.open()
        await asyncio.gather(*(sender() for _ in range(args.senders)))
        emit(**window.report(time.process_time() - cpu0))
    finally:
        await producer.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("grpc", "remoting"))
    ap.add_argument("row", choices=("send", "tx"))
    ap.add_argument("address", help="grpc: the gRPC endpoint; remoting: the name server")
    ap.add_argument("topic")
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--max", type=int, default=100_000)
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
