"""SDK throughput against an in-process broker on 127.0.0.1 port 0 (not collected by pytest).

Run: ``.venv/bin/python tests/client/bench_sdk.py [messages]`` (default 3000, body 256 bytes).
Client and broker share one event loop and one core, so the numbers are a floor for the SDK's
own cost per message, not a broker capacity figure; prints a Markdown table.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from txbroker.broker import Broker
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.config import BrokerConfig

IN_FLIGHT = 64
BODY = b"x" * 256


class CommitAll(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def _bounded(n: int, make) -> None:
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with sem:
            await make()

    await asyncio.gather(*(one() for _ in range(n)))


async def main(n: int) -> list[tuple[str, int, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        config = BrokerConfig(data_dir=str(Path(tmp) / "data"), listen_host="127.0.0.1",
                              broker_port=0, namesrv_port=0, segment_size=64 * 1024 * 1024,
                              transaction_check_interval=5.0)
        broker = Broker(config)
        await broker.start()
        ns = broker.namesrv_addr
        rows: list[tuple[str, int, float]] = []
        try:
            async with Producer("PG_BENCH", ns) as p:
                await p.send(Message("Bench", BODY))  # route and connection warm-up
                t = time.perf_counter()
                for _ in range(n):
                    await p.send(Message("Bench", BODY))
                rows.append(("send, one at a time", n, time.perf_counter() - t))
                t = time.perf_counter()
                await _bounded(n, lambda: p.send(Message("Bench", BODY)))
                rows.append((f"send, {IN_FLIGHT} in flight", n, time.perf_counter() - t))
                t = time.perf_counter()
                for _ in range(n // 32):
                    await p.send_batch([Message("Bench", BODY)] * 32)
                rows.append(("send_batch of 32", n // 32 * 32, time.perf_counter() - t))
            async with TransactionProducer("PG_BENCH_TX", ns, listener=CommitAll()) as tp:
                t = time.perf_counter()
                await _bounded(n, lambda: tp.send_message_in_transaction(Message("BenchTx", BODY)))
                rows.append((f"send_message_in_transaction, {IN_FLIGHT} in flight", n,
                             time.perf_counter() - t))
            total = 1 + n + n + n // 32 * 32
            consumer = Consumer("CG_BENCH", ns, from_where="first")
            consumer.subscribe("Bench")
            async with consumer:
                t = time.perf_counter()
                for _ in range(total):
                    if await consumer.poll(30) is None:
                        raise RuntimeError("consumer stalled")
                rows.append(("consume (poll)", total, time.perf_counter() - t))
        finally:
            await broker.stop()
    return rows


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    results = asyncio.run(main(count))
    print("| operation | messages | seconds | msgs/s |\n|---|---:|---:|---:|")
    for name, msgs, secs in results:
        print(f"| {name} | {msgs} | {secs:.2f} | {msgs / secs:,.0f} |")
