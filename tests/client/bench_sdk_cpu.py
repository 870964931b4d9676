"""The SDK's own CPU per operation, with the broker in another process (not collected by pytest).

Run: ``.venv/bin/python tests/client/bench_sdk_cpu.py {tx,delivery} N``.  ``tx``: one
TransactionProducer shared by 64 coroutines runs N committed transactions; ``delivery``: a
Consumer polls N messages of a backlog preloaded before (always the same size, so that two
runs differ only in what was consumed).  The broker is a ``txbroker serve`` subprocess, so
this process's CPU is the SDK's alone; it prints CPU µs per operation.

Instruction counts do not depend on what else runs on the machine: run it under
``valgrind --tool=callgrind --callgrind-out-file=/tmp/sdk.cg`` (the broker subprocess is not
traced) at two sizes and divide the difference of the "Collected" totals by the difference of
N; start-up, connecting and the preload cancel out.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import tempfile
import time

import uvloop

from txbroker.bench.broker import TOPIC, BrokerProc, _create_topic, preload
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)

IN_FLIGHT = 64
BODY = b"x" * 200
#: The delivery backlog, the same for every N (N must not exceed it).
BACKLOG = 40_000


class CommitAll(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def run_tx(broker: BrokerProc, n: int) -> float:
    await _create_topic(broker.addr)
    async with TransactionProducer("PG_SDK_CPU", broker.namesrv, listener=CommitAll()) as p:
        await p.send_message_in_transaction(Message(TOPIC, BODY))  # route and connection
        left = n
        cpu0 = time.process_time()

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                result = await p.send_message_in_transaction(Message(TOPIC, BODY, tags="bench"))
                if result.local_transaction_state is not LocalTransactionState.COMMIT_MESSAGE:
                    raise RuntimeError(f"not committed: {result}")

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return time.process_time() - cpu0


async def run_delivery(broker: BrokerProc, n: int) -> float:
    if n > BACKLOG:
        raise SystemExit(f"delivery: N may be at most {BACKLOG}")
    await _create_topic(broker.addr)
    await preload(broker.addr, BACKLOG)
    consumer = Consumer("CG_SDK_CPU", broker.namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe(TOPIC)
    await consumer.start()
    try:
        cpu0 = time.process_time()
        seen = 0
        deadline = time.monotonic() + 300
        while seen < n and time.monotonic() < deadline:
            if await consumer.poll(1.0) is not None:
                seen += 1
        if seen < n:
            raise RuntimeError(f"only {seen} of {n} messages delivered")
        return time.process_time() - cpu0
    finally:
        await consumer.shutdown()


def main() -> None:
    kind, n = sys.argv[1], int(sys.argv[2])
    run = {"tx": run_tx, "delivery": run_delivery}[kind]
    with tempfile.TemporaryDirectory(prefix="txbroker-sdkcpu-") as d, \
            BrokerProc("async", d) as broker, \
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        before = resource.getrusage(resource.RUSAGE_SELF)
        cpu = runner.run(run(broker, n))
        after = resource.getrusage(resource.RUSAGE_SELF)
    system = after.ru_stime - before.ru_stime
    print(f"{kind} {n}: {cpu * 1e6 / n:.1f} µs SDK CPU per operation "
          f"(of which about {system * 1e6 / n:.1f} in the kernel)")


if __name__ == "__main__":
    main()
