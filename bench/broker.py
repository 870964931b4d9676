"""End-to-end transactional throughput: ``python -m txbroker.bench.broker``.

For each row a fresh ``txbroker serve`` runs in its own process (ephemeral ports, temp data dir)
and this process is the load generator, speaking the wire protocol through RemotingClient:
P producers, each on its own connection, loop "half send → wait for the answer → one-way
END_TRANSACTION commit"; one consumer long-polls every queue of the topic.  A transaction
counts when the consumer has *seen* its committed message, so the figure is end to end.
Each row runs a bounded time (``--seconds``) and then waits (bounded) for the consumer to catch
up; throughput = messages seen / time from first send to last message seen.

Usage: ``python -m txbroker.bench.broker [--seconds 3] [--producers 1,64] [--flush async,sync]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.store.record import MESSAGE_MAGIC

TOPIC = "BenchTx"
GROUP = "PG_BENCH"
QUEUES = 4
READY = re.compile(rb"txbroker ready broker=(\S+) namesrv=(\S+)")
REPO = Path(__file__).resolve().parent.parent
_SIZE_MAGIC = struct.Struct(">iI")


class BrokerProc:
    def __init__(self, flush: str, data_dir: str) -> None:
        self.flush = flush
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None
        self.addr = ""

    def __enter__(self) -> Self:
        cmd = [sys.executable, "-c", "from txbroker.cli.main import main; main()", "serve",
               "--broker-port", "0", "--namesrv-port", "-1", "--data-dir", self.data_dir,
               "--flush-mode", self.flush, "--default-queue-nums", str(QUEUES),
               "--segment-size", str(256 * 1024 * 1024), "--log-level", "WARNING",
               "--transaction-check-interval", "60", "--transaction-timeout", "60"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            m = READY.search(line)
            if m:
                self.addr = m.group(1).decode()
                return self
            if not line and self.proc.poll() is not None:
                break
        self.__exit__()
        raise RuntimeError(f"broker did not start: {line!r}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_BODY = b"x" * 200


def _half(producer: int, seq: int, born: str) -> tuple[RemotingCommand, str]:
    """A half message as a RocketMQ Java client sends it (SEND_MESSAGE_V2, sysFlag 4)."""
    uniq = f"{os.getpid():08X}{producer:08X}{seq:016X}"
    props = (f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02UNIQ_KEY\x01{uniq}"
             "\x02WAIT\x01true\x02TAGS\x01bench")
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": str(seq % QUEUES),
        "f": "4", "g": born, "h": "0", "i": props, "j": "0", "k": "false", "m": "false",
    }, _BODY), uniq


async def _producer(client: RemotingClient, idx: int, stop_at: float, sent: list[int]) -> None:
    loop = asyncio.get_running_loop()
    seq = 0
    while loop.time() < stop_at:
        cmd, uniq = _half(idx, seq, str(int(time.time() * 1000)))
        resp = await client.invoke(cmd, 10.0)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"half send failed: {resp.code} {resp.remark}")
        ext = resp.ext_fields
        offset = int(ext["msgId"][16:], 16)  # offsetMsgId = ip(4) port(4) offset(8), hex
        await client.invoke_oneway(RemotingCommand.request(RequestCode.END_TRANSACTION, {
            "producerGroup": GROUP, "tranStateTableOffset": ext["queueOffset"],
            "commitLogOffset": str(offset), "commitOrRollback": "8",
            "fromTransactionCheck": "false", "msgId": uniq, "transactionId": uniq,
        }, oneway=True))
        seq += 1
        sent[0] += 1


def count_records(body: bytes) -> int:
    """Records in a PULL body, walked by their TOTALSIZE and checked by magic code.

    The load generator must stay cheap (it shares this 2-core machine with the broker), so it
    validates framing instead of decoding every field.
    """
    n = pos = 0
    end = len(body)
    while pos < end:
        size, magic = _SIZE_MAGIC.unpack_from(body, pos)
        if magic != MESSAGE_MAGIC or size <= 0:
            raise RuntimeError(f"bad record at {pos} in a pull body")
        pos += size
        n += 1
    if pos != end:
        raise RuntimeError("pull body ends inside a record")
    return n


async def _consumer(addr: str, seen: list, done: asyncio.Event) -> None:
    client = RemotingClient(addr)
    await client.connect()
    loop = asyncio.get_running_loop()

    async def one_queue(qid: int) -> None:
        offset = 0
        while not done.is_set():
            cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
                "consumerGroup": "CG_BENCH", "topic": TOPIC, "queueId": str(qid),
                "queueOffset": str(offset), "maxMsgNums": "512", "sysFlag": "6",
                "commitOffset": "-1", "suspendTimeoutMillis": "1000", "subscription": "*",
                "subVersion": "0"})
            resp = await client.invoke(cmd, 5.0)
            if resp.code == ResponseCode.SUCCESS:
                seen[0] += count_records(resp.body)
                seen[1] = loop.time()
                seen[2] += 1
            if resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                             ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED):
                offset = int(resp.ext_fields.get("nextBeginOffset", offset))
            else:
                await asyncio.sleep(0.05)

    try:
        await asyncio.gather(*(one_queue(q) for q in range(QUEUES)))
    finally:
        await client.close()


async def run_row(addr: str, producers: int, seconds: float, connections: int) -> dict:
    loop = asyncio.get_running_loop()
    # Create the topic first so the consumer's pulls find it.
    warm = RemotingClient(addr)
    await warm.connect()
    await warm.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"}), 10)
    await warm.close()
    seen = [0, 0.0, 0]  # messages, time of the last one, pull responses with messages
    sent = [0]
    done = asyncio.Event()
    consumer = asyncio.create_task(_consumer(addr, seen, done))
    start = loop.time()
    stop_at = start + seconds
    clients = [RemotingClient(addr) for _ in range(min(connections, producers))]
    for client in clients:
        await client.connect()
    try:
        await asyncio.gather(*(_producer(clients[i % len(clients)], i, stop_at, sent)
                               for i in range(producers)))
    finally:
        for client in clients:
            await client.close()
    deadline = loop.time() + 15
    while seen[0] < sent[0] and loop.time() < deadline:
        await asyncio.sleep(0.02)
    done.set()
    await asyncio.wait_for(consumer, 10)
    elapsed = (seen[1] or loop.time()) - start
    return {"sent": sent[0], "seen": seen[0], "seconds": elapsed, "pulls": seen[2],
            "tps": seen[0] / elapsed if elapsed > 0 else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--producers", default="1,64")
    ap.add_argument("--flush", default="async,sync")
    ap.add_argument("--connections", default="each,shared",
                    help="each: one connection per producer; shared: all producers share one "
                         "connection, as producers in one RocketMQ client process do")
    ap.add_argument("--broker", default="",
                    help="drive an already running broker at HOST:PORT (for profiling) instead")
    args = ap.parse_args()
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    rows = []
    if args.broker:
        with runner:
            for producers in (int(p) for p in args.producers.split(",")):
                for mode in args.connections.split(","):
                    conns = producers if mode == "each" else 1
                    r = runner.run(run_row(args.broker, producers, args.seconds, conns))
                    rows.append(("given", producers, mode, r))
        _print(rows)
        return
    with runner:
        for flush in args.flush.split(","):
            for producers in (int(p) for p in args.producers.split(",")):
                for mode in args.connections.split(","):
                    if producers == 1 and mode != args.connections.split(",")[0]:
                        continue  # one producer: both modes are the same
                    conns = producers if mode == "each" else 1
                    with tempfile.TemporaryDirectory(prefix="txbroker-bench-") as d, \
                            BrokerProc(flush, d) as b:
                        r = runner.run(run_row(b.addr, producers, args.seconds, conns))
                    rows.append((flush, producers, mode, r))
                    print(f"  {flush:5} {producers:3} producers ({mode} connection): "
                          f"{r['tps']:,.0f} tx/s", file=sys.stderr)
    _print(rows)


def _print(rows: list) -> None:
    print(f"{'flush':<6} {'producers':>9} {'connections':>11} {'committed tx':>13} {'seen':>8} {'seconds':>8} {'tx/s':>9} {'msgs/pull':>9}")
    for flush, producers, mode, r in rows:
        conns = producers if mode == "each" else 1
        print(f"{flush:<6} {producers:>9} {conns:>11} {r['sent']:>13,} {r['seen']:>8,} {r['seconds']:>8.2f} "
              f"{r['tps']:>9,.0f} {r['seen'] / max(r['pulls'], 1):>9.1f}")
    if any(r["seen"] != r["sent"] for *_, r in rows):
        print("WARNING: the consumer did not see every committed transaction", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
