"""A history of client operations under faults, and the checker that judges it (pure).

Vocabulary after Jepsen.  Every operation is an **invoke** and one completion: **ok** (it
happened), **fail** (it certainly did not) or **info** (indeterminate: a time-out or a dropped
connection; it may or may not have happened).  Times are ``mono`` (CLOCK_MONOTONIC, one clock
for every process of the machine) and ``wall``.  An ``ok`` names the broker that stored the
message (the ``offsetMsgId`` of a RocketMQ SendResult encodes that broker's address and the
commitlog offset) and the status it answered.  For a transactional send the operation also
carries the **decision** the producer's database holds at the end: ``commit``, ``rollback``,
or none (the half was never acknowledged, so the local transaction never ran and every
check-back is answered ROLLBACK).  Around them the history holds:

* ``master`` events: who the controller names master of a group, with the epoch, each time
  that changes (polled with GET_REPLICA_INFO; ``mono`` = when it was first seen, which is at
  or after the controller decided);
* ``read`` events: the full read after healing (a fresh consumer group from the first offset
  of every queue), one per delivered message with its queue and queue offset;
* ``pending`` events: the half messages still undecided on a group's master at the end;
* ``fault`` events: a fault's window (``mono`` to ``until``) with, where the scenario promises
  them, ``gap_bound`` (the longest write gap it may cause, seconds) and ``quorum_lost``
  (``[t0, t1]``: the control plane had no majority from t0 to t1) with ``lease``.

Events are plain dicts (one JSON object per line in a history file); :func:`check` reads them.

What the checker reports, per broker group:

=========================  ==================================================================
lost                       an ``ok`` half acknowledged ``SEND_OK`` whose decision is commit,
                           never read
lost (not replicated)      the same for a half answered with another status
                           (FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE): stored on the master
                           only, no promise of surviving a failover
duplicated                 one key read at two positions (a commit applied twice)
aborted read               a key read whose decision is rollback, whose send failed, or whose
                           half was never acknowledged (``info`` with no decision: its
                           check-backs answer ROLLBACK, so it must never appear)
indeterminate twice        an ``info`` operation with a decision "either" read at two
                           positions (at most one delivery)
pending                    halves left undecided once the run settled
split-brain write          an ``ok`` stored by a superseded master: at the invocation another
                           broker of its group was already named master in a later epoch than
                           the storing broker's last, and the storing broker was not named
                           again before it answered
write gap per fault        the longest time between successive ``ok`` completions around the
                           fault's window (from the last one before it to the first one after
                           it); above the fault's ``gap_bound`` it fails the run
acked without quorum       an ``ok`` invoked more than one lease after the control plane lost
                           its majority and completed before it was back: no master may count
                           its lease that long (fails the run), and, if no ``ok`` follows the
                           return, writes never resumed (fails the run)
=========================  ==================================================================

What each mode promises (docs/reliability.md, "Faults we test"), hence what fails a run:

* **SYNC_MASTER**: none of the above.  An acknowledged (``SEND_OK``) send is held by every
  in-sync replica, so any single failure or partition keeps it; one master per epoch, so no
  split-brain write.
* **ASYNC_MASTER**: no duplicate, no aborted read, no pending half, no split-brain write.  It
  may lose acknowledged sends that it had not yet shipped to its slave when the slave is
  promoted: those acknowledged between the last bytes the slave received and the moment the
  old master stopped writing, i.e. at most one lease (plus the replication lag) before the
  promotion.  The checker counts them (``lost``) and measures the window
  (:attr:`GroupVerdict.loss_window_s`: the longest time from such an acknowledgement to the
  promotion that followed it).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

SYNC, ASYNC = "SYNC_MASTER", "ASYNC_MASTER"
#: The send status of an acknowledged, replicated (SYNC_MASTER) or stored (ASYNC) send.
SEND_OK = "SEND_OK"
OK, FAIL, INFO, INVOKE = "ok", "fail", "info", "invoke"
COMPLETIONS = (OK, FAIL, INFO)


@dataclass
class Op:
    """One operation, invocation and completion joined."""

    key: str
    group: str
    invoked: float
    completed: float | None = None
    type: str | None = None  # ok / fail / info; None: never completed (treated as info)
    broker: str = ""
    status: str = ""
    decision: str | None = None


@dataclass
class GroupVerdict:
    group: str
    mode: str
    ops: int = 0
    oks: int = 0
    fails: int = 0
    infos: int = 0
    lost: list[str] = field(default_factory=list)
    lost_unreplicated: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    aborted_reads: list[str] = field(default_factory=list)
    indeterminate_twice: list[str] = field(default_factory=list)
    unknown_reads: list[str] = field(default_factory=list)
    pending: int | None = None
    split_brain: list[str] = field(default_factory=list)
    #: Longest seconds from a lost acknowledgement to the promotion after it (None: no loss).
    loss_window_s: float | None = None
    #: Longest gap between successive ``ok`` completions.
    longest_gap_s: float = 0.0
    #: Seconds from each fault mark to the first new master named after it.
    promotions_s: list[float | None] = field(default_factory=list)
    #: Per fault: the longest write gap around its window (None: no ``ok`` after it).
    fault_gaps_s: list[float | None] = field(default_factory=list)
    #: Per fault: the bound its scenario puts on that gap (None: no bound).
    gap_bounds_s: list[float | None] = field(default_factory=list)
    #: Sends acknowledged while the control plane had no majority, invoked more than one
    #: lease after it lost it.
    acked_without_quorum: list[str] = field(default_factory=list)
    #: Whether writes were acknowledged again after the control plane came back (None: the
    #: history has no such fault).
    resumed_after_quorum: bool | None = None

    def violations(self) -> list[str]:
        """What this mode promises against and the history shows (empty: a clean run)."""
        out = []
        if self.mode == SYNC and self.lost:
            out.append(f"{len(self.lost)} acknowledged commit(s) lost")
        if self.duplicated:
            out.append(f"{len(self.duplicated)} commit(s) delivered twice")
        if self.aborted_reads or self.unknown_reads:
            out.append(f"{len(self.aborted_reads) + len(self.unknown_reads)} aborted read(s)")
        if self.indeterminate_twice:
            out.append(f"{len(self.indeterminate_twice)} indeterminate send(s) delivered twice")
        if self.pending is not None and self.pending < 0:
            out.append("pending halves unknown (no master answered)")
        elif self.pending:
            out.append(f"{self.pending} half(s) left pending")
        if self.split_brain:
            out.append(f"{len(self.split_brain)} split-brain write(s)")
        for gap, bound in zip(self.fault_gaps_s, self.gap_bounds_s, strict=True):
            if bound is not None and (gap is None or gap > bound):
                out.append("writes never resumed after the fault" if gap is None else
                           f"write gap {gap:.1f} s above the bound {bound:.1f} s")
        if self.acked_without_quorum:
            out.append(f"{len(self.acked_without_quorum)} send(s) acknowledged more than one "
                       f"lease after the control plane lost its majority")
        if self.resumed_after_quorum is False:
            out.append("no write acknowledged after the control plane came back")
        return out

    @property
    def ok(self) -> bool:
        return not self.violations()

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL: " + "; ".join(self.violations())


def join_ops(history: list[dict[str, Any]]) -> dict[str, Op]:
    """Invocations and completions joined by key (a completion without an invocation, or a
    second completion, is a bookkeeping error of the recorder: ValueError)."""
    ops: dict[str, Op] = {}
    for ev in history:
        kind = ev["type"]
        if kind == INVOKE:
            if ev["key"] in ops:
                raise ValueError(f"key {ev['key']!r} invoked twice")
            ops[ev["key"]] = Op(ev["key"], ev["group"], ev["mono"])
        elif kind in COMPLETIONS:
            op = ops.get(ev["key"])
            if op is None or op.type is not None:
                raise ValueError(f"completion {kind} of {ev['key']!r} without one open invocation")
            op.type, op.completed = kind, ev["mono"]
            op.broker = ev.get("broker", "")
            op.status = ev.get("status", "")
            op.decision = ev.get("decision")
        elif kind == "decision":  # the producer's database decided after the completion
            ops[ev["key"]].decision = ev["decision"]
    return ops


def master_timeline(history: list[dict[str, Any]], group: str) -> list[tuple[float, str | None, int]]:
    """(mono, master address or None, epoch) for ``group``, in time order."""
    return sorted((ev["mono"], ev.get("master") or None, int(ev.get("epoch", 0)))
                  for ev in history if ev["type"] == "master" and ev["group"] == group)


def _master_at(timeline: list[tuple[float, str | None, int]], t: float) -> tuple[str | None, int] | None:
    """The last named (non-empty) master at or before ``t``."""
    named = [(m, e) for (ts, m, e) in timeline if ts <= t and m is not None]
    return named[-1] if named else None


def is_split_brain(op: Op, timeline: list[tuple[float, str | None, int]]) -> bool:
    """``op`` was stored by a superseded master: at its invocation the controller had named
    another broker in a later epoch than the last one it named the storing broker in, and
    did not name the storing broker again before it answered.  (A broker named for the first
    time just after it answered was already the newer master: polls see promotions late.)"""
    if op.type != OK or not op.broker:
        return False
    at = _master_at(timeline, op.invoked)
    if at is None or at[0] == op.broker:
        return False
    own = [e for ts, m, e in timeline if m == op.broker and ts <= op.invoked]
    if not own or max(own) >= at[1]:
        return False
    assert op.completed is not None
    renamed = any(m == op.broker and op.invoked < ts <= op.completed for ts, m, _ in timeline)
    return not renamed


def check(history: list[dict[str, Any]], group: str, mode: str) -> GroupVerdict:
    """The verdict for one broker group (``mode`` is its role: SYNC_MASTER / ASYNC_MASTER)."""
    if mode not in (SYNC, ASYNC):
        raise ValueError(f"mode must be {SYNC} or {ASYNC}, not {mode!r}")
    ops = {k: op for k, op in join_ops(history).items() if op.group == group}
    timeline = master_timeline(history, group)
    v = GroupVerdict(group, mode, ops=len(ops))
    positions: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for ev in history:
        if ev["type"] == "read" and ev["group"] == group:
            key = ev["key"]
            if key not in ops:
                v.unknown_reads.append(key)
                continue
            positions[key].add((int(ev["queue"]), int(ev["offset"])))
        elif ev["type"] == "pending" and ev["group"] == group:
            v.pending = (v.pending or 0) + int(ev["count"])
    promotions = [ts for (ts, m, e), prev in zip(timeline[1:], timeline, strict=False)
                  if m is not None and (m != prev[1] or e > prev[2])]
    ok_times = []
    for key, op in ops.items():
        t = op.type or INFO
        v.oks += t == OK
        v.fails += t == FAIL
        v.infos += t == INFO
        read = positions.get(key, set())
        if t == OK:
            assert op.completed is not None
            ok_times.append(op.completed)
            if is_split_brain(op, timeline):
                v.split_brain.append(key)
        if t == OK and op.decision == "commit":
            if not read:
                (v.lost if op.status == SEND_OK else v.lost_unreplicated).append(key)
                if op.status == SEND_OK:
                    assert op.completed is not None
                    i = bisect.bisect_right(promotions, op.completed)
                    if i < len(promotions):
                        w = promotions[i] - op.completed
                        v.loss_window_s = max(v.loss_window_s or 0.0, w)
            elif len(read) > 1:
                v.duplicated.append(key)
        elif op.decision == "either" and t == INFO:
            if len(read) > 1:
                v.indeterminate_twice.append(key)
        elif read:
            v.aborted_reads.append(key)
    ok_times.sort()
    v.longest_gap_s = max((b - a for a, b in itertools.pairwise(ok_times)), default=0.0)
    for ev in history:
        if ev["type"] == "fault":
            after = [ts for ts in promotions if ts >= ev["mono"]]
            if ev.get("until") is not None:
                after = [ts for ts in after if ts <= ev["until"]]
            v.promotions_s.append(after[0] - ev["mono"] if after else None)
            v.fault_gaps_s.append(fault_gap(ok_times, ev["mono"], ev.get("until") or ev["mono"]))
            bound = ev.get("gap_bound")
            v.gap_bounds_s.append(float(bound) if bound is not None else None)
            if ev.get("quorum_lost"):
                t0, t1 = (float(x) for x in ev["quorum_lost"])
                late = t0 + float(ev["lease"])
                v.acked_without_quorum += sorted(
                    op.key for op in ops.values()
                    if op.type == OK and op.invoked > late and op.completed is not None
                    and op.completed < t1)
                resumed = any(t > t1 for t in ok_times)
                v.resumed_after_quorum = resumed if v.resumed_after_quorum is None \
                    else v.resumed_after_quorum and resumed
    return v


def fault_gap(ok_times: list[float], start: float, until: float) -> float | None:
    """The longest gap between successive ``ok`` completions (sorted) from the last one
    before ``start`` (the first one when none came before) to the first one after ``until``
    (the last one when the load stopped before it); None when none comes after ``start``
    (writes never resumed)."""
    if not ok_times or ok_times[-1] <= start:
        return None
    i = max(bisect.bisect_left(ok_times, start) - 1, 0)
    j = min(bisect.bisect_right(ok_times, until), len(ok_times) - 1)
    window = ok_times[i:j + 1]
    return max((b - a for a, b in itertools.pairwise(window)), default=0.0)
