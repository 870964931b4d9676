"""The history of Kafka clients under faults, and the checker that judges it (pure).

The Kafka counterpart of :mod:`txbroker.bench.chaos.history`, same vocabulary (Jepsen's):
an operation is an ``invoke`` and one completion, ``ok``, ``fail`` or ``info``
(indeterminate: it may or may not have happened).  Three workloads write it
(:mod:`txbroker.bench.chaos.kafka_partitions`), each event naming its workload (``wl``):

* ``idem``: one record of the idempotent producer (acks=all), ``key`` = the record's value;
  its ``ok`` carries the partition and offset the broker answered;
* ``txn``: one transaction of a transactional producer; the invocation lists its records
  (``records``: ``[value, partition, group]``) and the decision the producer took
  (``commit`` / ``abort``), the ``ok`` says that EndTxn answered it, ``info`` that it did not
  (a time-out, a lost connection: either outcome, but all or nothing);
* ``pipe``: the exactly-once consume-transform-produce pipeline of each group, which reads
  the ``idem`` records of its group's partitions and writes one output per input (value
  ``<input>|out``) in a transaction with the consumed offsets.

After healing, ``read`` events hold a full read_committed read of every topic (``topic``
``idem`` / ``txn`` / ``out``, partition, offset, value, the partition's ``group``);
``master`` and ``fault`` events are those of the RocketMQ history (the controller's view of
each group's master, when the fault began).

What the checker reports, per broker group (its partitions only):

====================  =======================================================================
lost                  an ``ok`` idempotent record never read (``idem``)
moved                 an ``ok`` idempotent record read at another offset than acknowledged
duplicated            a record value read twice (``idem``, ``txn``: idempotence and
                      transactions promise once)
txn lost              a committed transaction none of whose records in this group is read
torn                  a transaction some but not all of whose records in this group are read;
                      or one with an unknown outcome that is visible in another group and not
                      in this one (all or nothing across groups)
aborted read          a record of an aborted transaction read
pipeline missing      an input (an ``idem`` record read after healing) with no output
pipeline twice        an input with more than one output
====================  =======================================================================

What each mode promises (docs/reliability.md, "Faults we test", Kafka):

* **SYNC_MASTER**: none of the above.  acks=all is answered once every in-sync replica holds
  the records, and a commit reaches every partition before EndTxn answers.
* **ASYNC_MASTER**: no duplicate and no aborted read.  Records acknowledged but not yet
  shipped when the slave is promoted may go (``lost``, ``moved``, ``txn lost``, ``torn``), and
  with them the pipeline's inputs, outputs or offsets, so its counts are reported, not judged.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from txbroker.bench.chaos.history import (
    ASYNC,
    COMPLETIONS,
    INFO,
    INVOKE,
    OK,
    SYNC,
    master_timeline,
)

IDEM, TXN, PIPE = "idem", "txn", "pipe"
#: The suffix the pipeline appends to an input's value to make its output.
OUT_SUFFIX = "|out"


@dataclass
class KafkaOp:
    """One operation of a Kafka workload, invocation and completion joined."""

    wl: str
    key: str
    group: str
    invoked: float
    completed: float | None = None
    type: str | None = None  # ok / fail / info; None: never completed (treated as info)
    partition: int = -1
    offset: int = -1
    decision: str = ""
    #: A transaction's records: (value, partition, group).
    records: list[tuple[str, int, str]] = field(default_factory=list)


@dataclass
class KafkaGroupVerdict:
    group: str
    mode: str
    oks: int = 0
    infos: int = 0
    txn_committed: int = 0
    txn_aborted: int = 0
    txn_unknown: int = 0
    pipe_inputs: int = 0
    lost: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    txn_lost: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    aborted_reads: list[str] = field(default_factory=list)
    pipe_missing: list[str] = field(default_factory=list)
    pipe_twice: list[str] = field(default_factory=list)
    #: Longest gap between successive acknowledged idempotent records.
    longest_gap_s: float = 0.0
    #: Seconds from each fault mark to the first new master named after it.
    promotions_s: list[float | None] = field(default_factory=list)

    def violations(self) -> list[str]:
        """What this mode promises against and the history shows (empty: a clean run)."""
        out = []
        if self.duplicated:
            out.append(f"{len(self.duplicated)} record(s) read twice")
        if self.aborted_reads:
            out.append(f"{len(self.aborted_reads)} aborted read(s)")
        if self.mode == SYNC:
            for name, items in (("acknowledged record(s) lost", self.lost),
                                ("record(s) at another offset than acknowledged", self.moved),
                                ("committed transaction(s) lost", self.txn_lost),
                                ("torn transaction(s)", self.torn),
                                ("pipeline input(s) without output", self.pipe_missing),
                                ("pipeline input(s) output twice", self.pipe_twice)):
                if items:
                    out.append(f"{len(items)} {name}")
        return out

    @property
    def ok(self) -> bool:
        return not self.violations()

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL: " + "; ".join(self.violations())


def join_ops(history: list[dict[str, Any]]) -> dict[tuple[str, str], KafkaOp]:
    """Invocations and completions joined by (workload, key); a completion without an open
    invocation is a bookkeeping error of the recorder (ValueError)."""
    ops: dict[tuple[str, str], KafkaOp] = {}
    for ev in history:
        kind = ev["type"]
        if kind not in (INVOKE, *COMPLETIONS):
            continue
        k = (ev["wl"], ev["key"])
        if kind == INVOKE:
            if k in ops:
                raise ValueError(f"{k} invoked twice")
            ops[k] = KafkaOp(ev["wl"], ev["key"], ev.get("group", ""), ev["mono"],
                             partition=int(ev.get("partition", -1)), decision=ev.get("decision", ""),
                             records=[(str(v), int(p), str(g)) for v, p, g in ev.get("records", [])])
        else:
            op = ops.get(k)
            if op is None or op.type is not None:
                raise ValueError(f"completion {kind} of {k} without one open invocation")
            op.type, op.completed = kind, ev["mono"]
            op.offset = int(ev.get("offset", -1))
    return ops


def check(history: list[dict[str, Any]], group: str, mode: str) -> KafkaGroupVerdict:
    """The verdict for one broker group (``mode``: SYNC_MASTER / ASYNC_MASTER)."""
    if mode not in (SYNC, ASYNC):
        raise ValueError(f"mode must be {SYNC} or {ASYNC}, not {mode!r}")
    v = KafkaGroupVerdict(group, mode)
    reads: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    visible: Counter[str] = Counter()  # every txn record read, in any group
    for ev in history:
        if ev["type"] != "read":
            continue
        if ev["topic"] == TXN:
            visible[ev["value"]] += 1
        if ev["group"] == group:
            reads[ev["topic"]][ev["value"]].append((int(ev["partition"]), int(ev["offset"])))
    for topic in (IDEM, TXN):  # an output twice is the pipeline's count, judged by mode below
        v.duplicated += [val for val, pos in reads[topic].items() if len(pos) > 1]

    ops = join_ops(history)
    ok_times = []
    for op in ops.values():
        if op.wl == IDEM and op.group == group:
            if op.type == OK:
                v.oks += 1
                assert op.completed is not None
                ok_times.append(op.completed)
                pos = reads[IDEM].get(op.key)
                if not pos:
                    v.lost.append(op.key)
                elif (op.partition, op.offset) not in pos:
                    v.moved.append(op.key)
            elif (op.type or INFO) == INFO:
                v.infos += 1
        elif op.wl == TXN:
            mine = [val for val, _, g in op.records if g == group]
            if not mine:
                continue
            seen = [val for val in mine if reads[TXN].get(val)]
            outcome = op.decision if op.type == OK else INFO
            if outcome == "abort":
                v.txn_aborted += 1
                v.aborted_reads += seen
            elif outcome == "commit":
                v.txn_committed += 1
                if not seen:
                    v.txn_lost.append(op.key)
                elif len(seen) < len(mine):
                    v.torn.append(op.key)
            else:
                v.txn_unknown += 1
                anywhere = any(visible[val] for val, _, _ in op.records)
                if seen and len(seen) < len(mine) or anywhere and not seen:
                    v.torn.append(op.key)
    ok_times.sort()
    v.longest_gap_s = max((b - a for a, b in itertools.pairwise(ok_times)), default=0.0)

    outputs = Counter(val[: -len(OUT_SUFFIX)] for val, pos in reads["out"].items()
                      for _ in pos if val.endswith(OUT_SUFFIX))
    v.pipe_inputs = len(reads[IDEM])
    for val in reads[IDEM]:
        n = outputs.get(val, 0)
        if n == 0:
            v.pipe_missing.append(val)
        elif n > 1:
            v.pipe_twice.append(val)

    timeline = master_timeline(history, group)
    promotions = [ts for (ts, m, e), prev in zip(timeline[1:], timeline, strict=False)
                  if m is not None and (m != prev[1] or e > prev[2])]
    for ev in history:
        if ev["type"] == "fault":
            after = [ts for ts in promotions if ts >= ev["mono"] and
                     (ev.get("until") is None or ts <= ev["until"])]
            v.promotions_s.append(after[0] - ev["mono"] if after else None)
    return v
