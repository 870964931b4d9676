"""The broker's CPU per transaction without sockets: ``python -m txbroker.bench.txpath``.

``bench.broker`` measures whole processes over loopback, where the kernel's share, the other
processes on a 2-core machine and the client all move the figures.  This runs one real broker
(``Broker``: store, transaction service, handlers; temp dir, no listening client) in this
process and feeds the frames a RocketMQ producer sends straight into one server connection:
``--tx`` half messages (SEND_MESSAGE_V2, 200-byte body, the properties a Java client sets),
each answered, then the END_TRANSACTION commit built from the answer, ``--batch`` frames per
read.  The transport under the connection only collects what the broker writes: nothing
leaves the process, so what is timed is the broker's Python work per transaction: frame and
header decoding, dispatch, validation, the three appends (half, final message, op record), the
transaction index and the answer's encoding.

It prints CPU µs (``time.process_time``) per half and per END, and per transaction in all,
the median of ``--repeat`` runs on a fresh broker each; ``--profile N`` then prints the N
functions with the most own time under cProfile (which slows everything ~2.5x: use it to
rank, not to quote).  Building the END frames from the answers is this script's own work and
is not counted.

Usage: ``python -m txbroker.bench.txpath [--tx 20000] [--batch 1] [--repeat 3] [--profile 30]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import tempfile
import time
from typing import Any

import uvloop

from txbroker._compiled import ENV, in_use
from txbroker.broker import Broker
from txbroker.config import BrokerConfig
from txbroker.remoting.codec import FrameDecoder, encode
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.server import Connection

GROUP = "PG_TXPATH"
TOPIC = "TxPath"
QUEUES = 4
_BODY = b"x" * 200


class Collector:
    """The transport under the measured connection (the calls the connection core makes):
    keeps what the broker writes."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def writelines(self, parts: list[bytes]) -> None:
        self.out.extend(parts)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def half_frame(seq: int, born_ms: int) -> tuple[bytes, str]:
    """A half message as a RocketMQ Java producer sends it, and its UNIQ_KEY."""
    uniq = f"7F000001{seq:024X}"
    props = (f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02UNIQ_KEY\x01{uniq}"
             "\x02WAIT\x01true\x02TAGS\x01bench")
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": GROUP, "b": TOPIC, "c": "TBW102", "d": str(QUEUES), "e": str(seq % QUEUES),
        "f": "4", "g": str(born_ms), "h": "0", "i": props, "j": "0", "k": "false", "m": "false",
    }, _BODY)
    return encode(cmd), uniq


def end_frame(answer: RemotingCommand, uniq: str) -> bytes:
    """The one-way commit of the half ``answer`` acknowledged."""
    ext = answer.ext_fields
    return encode(RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": ext["queueOffset"],
        "commitLogOffset": str(int(ext["msgId"][16:], 16)), "commitOrRollback": "8",
        "fromTransactionCheck": "false", "msgId": uniq, "transactionId": uniq}, oneway=True))


async def run_once(tx: int, batch: int, profile: cProfile.Profile | None = None) -> tuple[float, float]:
    """CPU seconds spent by the broker on ``tx`` halves and on their ENDs."""
    with tempfile.TemporaryDirectory(prefix="txbroker-txpath-") as data_dir:
        broker = Broker(BrokerConfig(data_dir=data_dir, broker_port=0, namesrv_port=-1,
                                     metrics_port=-1, default_queue_nums=QUEUES))
        await broker.start()
        try:
            await broker.topics.get_or_create(TOPIC, queue_nums=QUEUES)  # not on the clock
            conn = Connection(broker.server, 1)
            out = Collector()
            conn.connection_made(out)  # type: ignore[arg-type]
            answers = FrameDecoder(64 * 1024 * 1024)
            born = int(time.time() * 1000)
            frames = [half_frame(i, born) for i in range(tx)]
            half_cpu = end_cpu = 0.0
            for start in range(0, tx, batch):
                chunk = frames[start:start + batch]
                t0 = time.process_time()
                if profile is not None:
                    profile.enable()
                conn.data_received(b"".join(f for f, _ in chunk))
                await asyncio.sleep(0)
                if profile is not None:
                    profile.disable()
                half_cpu += time.process_time() - t0
                got = answers.feed(b"".join(out.out))
                out.out.clear()
                if len(got) != len(chunk) or any(a.code != 0 for a in got):
                    raise RuntimeError(f"half sends refused: {[(a.code, a.remark) for a in got]}")
                ends = b"".join(end_frame(a, uniq) for a, (_, uniq) in zip(got, chunk, strict=True))
                t0 = time.process_time()
                if profile is not None:
                    profile.enable()
                conn.data_received(ends)
                await asyncio.sleep(0)
                if profile is not None:
                    profile.disable()
                end_cpu += time.process_time() - t0
            committed = broker.store.max_offset(TOPIC, 0) + sum(
                broker.store.max_offset(TOPIC, q) for q in range(1, QUEUES))
            if committed != tx:
                raise RuntimeError(f"{committed} of {tx} transactions committed")
            conn.connection_lost(None)
        finally:
            await broker.stop()
    return half_cpu, end_cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m txbroker.bench.txpath",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tx", type=int, default=20000, help="transactions per run")
    ap.add_argument("--batch", type=int, default=1, help="frames per read")
    ap.add_argument("--repeat", type=int, default=3, help="runs; medians printed")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed runs, one cProfile'd run: the top N by own time")
    args = ap.parse_args(argv)
    if args.tx < 1 or args.batch < 1 or args.repeat < 1:
        ap.error("--tx, --batch and --repeat must be at least 1")
    runs = [uvloop.run(run_once(args.tx, args.batch)) for _ in range(args.repeat)]
    half = statistics.median(h for h, _ in runs) / args.tx * 1e6
    end = statistics.median(e for _, e in runs) / args.tx * 1e6
    total = statistics.median(h + e for h, e in runs) / args.tx * 1e6
    print(f"broker CPU per transaction, in process, {args.tx:,} tx, {args.batch} frame(s) per "
          f"read, median of {args.repeat}, hot path {in_use()} ({ENV}=1: pure Python)")
    print(f"{'half send + answer':<24}{half:>8.1f} µs")
    print(f"{'END_TRANSACTION commit':<24}{end:>8.1f} µs")
    print(f"{'transaction':<24}{total:>8.1f} µs")
    if args.profile:
        prof = cProfile.Profile()
        uvloop.run(run_once(args.tx, args.batch, prof))
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
