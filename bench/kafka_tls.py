"""Kafka clients over TLS vs plaintext: ``python -m txbroker.bench.kafka --tls`` (docs/bench.md,
"Kafka over TLS").

Two ``txbroker serve`` processes run side by side (async flush, ephemeral ports, temp data
dirs), each idle but for the row being measured: one plaintext, one with
``tls_mode=enforcing`` serving a throwaway CA's certificate (``bench/pki.py``), whose aiokafka
clients use ``security_protocol="SSL"`` and verify the certificate and the host name, as a real
deployment does.  The rows are ``bench.kafka``'s:

* **kafka txn 10** — ``--txn-producers`` transactional producers committing transactions of
  10 messages; one transaction is one "tx" (the figure the 25 % target is about);
* **kafka plain** — one producer's pipelined sends (acks=all); one acknowledged send is one
  "tx".

**Interleaved**: the machine is shared and noisy, so each of ``--rounds`` rounds runs every row
on both brokers back to back, plaintext first in even rounds and TLS first in odd ones; drift
falls on both alike.  Per row and mode the medians over the rounds: tx/s, msgs/s, broker and
client CPU µs per tx (as ``bench.kafka`` measures them).  The TLS cost is taken per round, from
the two runs of that round (1 - TLS tx/s / plaintext tx/s, in %), and its median over the rounds
reported: a pair run back to back shares the machine's state, which a ratio of two medians
taken from different rounds does not.  Target: at most 25 % for ``kafka txn 10``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from contextlib import ExitStack
from dataclasses import asdict

from txbroker.bench.kafka import (
    PARTITIONS,
    TOPIC,
    KafkaBroker,
    RowResult,
    kafka_plain,
    kafka_txn,
)
from txbroker.bench.pki import ThrowawayPki
from txbroker.client.admin import AdminClient

#: Messages per transaction of the transaction row.
TXN_SIZE = 10
#: (row, messages per tx), the target's row first.
ROWS = ((f"kafka txn {TXN_SIZE}", TXN_SIZE), ("kafka plain", 1))
MODES = ("plaintext", "tls")
#: The issue's target: TLS costs at most this share of plaintext tx/s.
COST_MAX_PCT = 25.0


async def _measure(broker: KafkaBroker, row: str, seconds: float, max_messages: int,
                   in_flight: int, txn_producers: int) -> RowResult:
    if row == "kafka plain":
        return await kafka_plain(broker, seconds, max_messages, in_flight)
    return await kafka_txn(broker, TXN_SIZE, seconds, max_messages, txn_producers)


async def _create_topic(broker: KafkaBroker) -> None:
    tls = broker.pki.client_tls() if broker.pki is not None else None
    async with AdminClient(broker.namesrv, tls=tls) as admin:
        await admin.create_topic(TOPIC, PARTITIONS)


def _sample(r: RowResult, mode: int, round_no: int, per_tx: int) -> dict:
    return {**asdict(r), "mode": MODES[mode], "round": round_no,
            "tx_per_s": r.msgs_per_s / per_tx,
            "broker_us_per_tx": r.broker_us_per_msg * per_tx,
            "client_us_per_tx": r.client_us_per_msg * per_tx}


def summarise(samples: list[dict]) -> list[dict]:
    """Per row: each mode's medians, and the median over rounds of each round's TLS cost in %
    of plaintext tx/s."""
    out = []
    for row, _ in ROWS:
        entry: dict[str, object] = {"row": row}
        for mode in MODES:
            mine = [s for s in samples if s["row"] == row and s["mode"] == mode]
            for key in ("tx_per_s", "msgs_per_s", "broker_us_per_tx", "client_us_per_tx"):
                entry[f"{mode}_{key}"] = statistics.median(s[key] for s in mine) if mine else 0.0
        pairs: dict[int, dict[str, float]] = {}
        for s in samples:
            if s["row"] == row:
                pairs.setdefault(s["round"], {})[s["mode"]] = s["tx_per_s"]
        costs = [(1 - p["tls"] / p["plaintext"]) * 100 for p in pairs.values()
                 if len(p) == 2 and p["plaintext"] > 0]
        entry["tls_cost_pct"] = statistics.median(costs) if costs else 0.0
        out.append(entry)
    return out


def target(summary: list[dict]) -> dict:
    """The 25 % target, judged on the transaction row."""
    cost = summary[0]["tls_cost_pct"]
    return {"target": f"TLS cost in % of plaintext tx/s ({summary[0]['row']})", "value": cost,
            "bound": f"<= {COST_MAX_PCT:g}", "met": cost <= COST_MAX_PCT}


def run(seconds: float, max_messages: int, in_flight: int, txn_producers: int,
        rounds: int) -> dict:
    """Every round, every row, on both brokers (order alternating by round)."""
    import uvloop

    samples: list[dict] = []
    with ExitStack() as stack:
        pki = stack.enter_context(ThrowawayPki())
        brokers = [stack.enter_context(KafkaBroker(
            stack.enter_context(tempfile.TemporaryDirectory(prefix=f"txbroker-bench-kafka-{m}-")),
            pki if m == "tls" else None)) for m in MODES]
        runner = stack.enter_context(asyncio.Runner(loop_factory=uvloop.new_event_loop))
        for broker in brokers:
            runner.run(_create_topic(broker))
        for round_no in range(rounds):
            order = (0, 1) if round_no % 2 == 0 else (1, 0)
            for row, per_tx in ROWS:
                for mode in order:
                    r = runner.run(_measure(brokers[mode], row, seconds, max_messages,
                                            in_flight, txn_producers))
                    samples.append(_sample(r, mode, round_no, per_tx))
    summary = summarise(samples)
    return {"seconds": seconds, "rounds": rounds, "samples": samples, "summary": summary,
            "target": target(summary)}


def print_report(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Kafka over TLS vs plaintext: medians of {doc['rounds']} interleaved "
                        f"rounds ({doc['seconds']:g} s per row)")
    for col in ("row", "mode", "tx/s", "msgs/s", "broker µs/tx", "client µs/tx", "TLS cost"):
        table.add_column(col, justify="left" if col in ("row", "mode") else "right")
    for entry in doc["summary"]:
        for mode in MODES:
            cost = f"{entry['tls_cost_pct']:.1f} %" if mode == "tls" else ""
            table.add_row(entry["row"], mode, f"{entry[f'{mode}_tx_per_s']:,.0f}",
                          f"{entry[f'{mode}_msgs_per_s']:,.0f}",
                          f"{entry[f'{mode}_broker_us_per_tx']:.1f}",
                          f"{entry[f'{mode}_client_us_per_tx']:.1f}", cost)
    console = Console(width=120)
    console.print(table)
    goal = doc["target"]
    console.print(f"{goal['target']}: {goal['value']:.1f} % (target {goal['bound']} %): "
                  f"{'met' if goal['met'] else 'not met'}")
