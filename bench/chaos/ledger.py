"""Bookkeeping and verification for transactional chaos runs (pure: no I/O, no clock).

The producer's listener state is the truth for every decision.  What is provable with a
one-way END_TRANSACTION: the client never learns whether its END arrived, so "acknowledged"
means the half SEND was answered (the half is durable) and the listener reached a final
decision.  From then on the broker must end the transaction in that decision — by the END or,
when the END was lost in a kill, by a check-back — so every such commit must be consumed and
no such rollback may ever be.  A half whose SEND answer was lost has no local transaction;
the listener answers ROLLBACK for it, so it must never be delivered either.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

KINDS = ("commit", "rollback", "unknown-commit", "unknown-rollback")
#: Listener states of one key.
SENDING, FAILED, DECIDED = "sending", "failed", "decided"


@dataclass
class Txn:
    key: str
    kind: str
    state: str = SENDING
    #: The final decision the producer's database holds ("commit"/"rollback"), once known.
    truth: str | None = None
    half_acked: bool = False
    end_sent: str | None = None
    checks: int = 0
    check_answers: list[str] = field(default_factory=list)


@dataclass
class Report:
    kills: int = 0
    outcomes: Counter = field(default_factory=Counter)
    half_send_failed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    redelivered: int = 0
    wrongly_delivered: list[str] = field(default_factory=list)
    unknown_delivered: list[str] = field(default_factory=list)
    checks_expected: int = 0
    checks_unexpected: int = 0
    checks_duplicate: int = 0
    unexpected_check_keys: list[str] = field(default_factory=list)
    offsets_moved_back: list[str] = field(default_factory=list)
    pending_at_end: int | None = None
    recovery_seconds: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.wrongly_delivered or self.unknown_delivered
                    or self.checks_unexpected or self.offsets_moved_back or self.pending_at_end)

    def rows(self) -> list[tuple[str, str]]:
        rec = self.recovery_seconds
        rows = [("kills survived", str(self.kills))]
        for kind in KINDS:
            rows.append((f"transactions {kind}", str(self.outcomes.get(kind, 0))))
        rows += [
            ("half send failed (rolled back by check)", str(self.half_send_failed)),
            ("lost (acknowledged commit not consumed)", str(len(self.lost))),
            ("duplicated (committed twice)", str(len(self.duplicated))),
            ("redelivered (same position, at-least-once)", str(self.redelivered)),
            ("wrongly delivered (rolled back / never executed)",
             str(len(self.wrongly_delivered) + len(self.unknown_delivered))),
            ("checks expected", str(self.checks_expected)),
            ("checks unexpected", str(self.checks_unexpected)),
            ("checks duplicate", str(self.checks_duplicate)),
            ("consumer offsets moved back", str(len(self.offsets_moved_back))),
            ("pending halves at end", "-" if self.pending_at_end is None else str(self.pending_at_end)),
            ("recovery s (min/avg/max)",
             "-" if not rec else f"{min(rec):.2f} / {sum(rec) / len(rec):.2f} / {max(rec):.2f}"),
        ]
        return rows

    def table(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        lines = [f"{'metric':<{width}}  value", f"{'-' * width}  -----"]
        lines += [f"{k:<{width}}  {v}" for k, v in rows]
        if self.recovery_seconds:
            lines.append("recovery per restart: " + " ".join(f"{s:.2f}" for s in self.recovery_seconds))
        lines.append("RESULT: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


class Ledger:
    """What producers were told and decided, what consumers received, what checks arrived."""

    def __init__(self) -> None:
        self.txns: dict[str, Txn] = {}
        #: key -> set of (queue_id, queue_offset) positions it was delivered at.
        self.positions: dict[str, set[tuple[int, int]]] = defaultdict(set)
        self.deliveries: Counter = Counter()
        self.foreign_deliveries: list[str] = []
        self.foreign_checks: list[str] = []
        #: queue -> [(kind, offset)] in time order; kind "persisted" (read from the offsets file
        #: of a killed broker) or "live" (the restarted broker's answer).
        self.offset_samples: dict[str, list[tuple[str, int]]] = defaultdict(list)
        self.kills = 0
        self.recovery_seconds: list[float] = []

    # --- producer side -------------------------------------------------------------------
    def begin(self, key: str, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        if key in self.txns:
            raise ValueError(f"duplicate key {key!r}")
        self.txns[key] = Txn(key, kind)

    def send_failed(self, key: str) -> None:
        t = self.txns[key]
        if t.state == SENDING:
            t.state, t.truth = FAILED, "rollback"

    def execute(self, key: str) -> str:
        """The local transaction runs: the half SEND was answered.  Returns what to tell the
        broker now ("commit", "rollback" or "unknown"); the truth is fixed here either way."""
        t = self.txns[key]
        t.half_acked = True
        t.state = DECIDED
        t.truth = "commit" if t.kind.endswith("commit") else "rollback"
        decision = "unknown" if t.kind.startswith("unknown") else t.truth
        if decision != "unknown":
            t.end_sent = decision
        return decision

    def check(self, key: str) -> str:
        """A check-back arrived; returns the answer ("commit", "rollback" or "unknown")."""
        t = self.txns.get(key)
        if t is None:
            self.foreign_checks.append(key)
            return "unknown"
        t.checks += 1
        answer = "unknown" if t.state == SENDING else t.truth
        t.check_answers.append(answer)
        return answer

    # --- consumer side -------------------------------------------------------------------
    def delivered(self, key: str, queue_id: int, queue_offset: int) -> None:
        if key not in self.txns:
            self.foreign_deliveries.append(key)
            return
        self.deliveries[key] += 1
        self.positions[key].add((queue_id, queue_offset))

    def offset_sample(self, queue: str, offset: int, kind: str = "live") -> None:
        self.offset_samples[queue].append((kind, offset))

    # --- verdict -------------------------------------------------------------------------
    def missing_commits(self) -> list[str]:
        return [k for k, t in self.txns.items() if t.truth == "commit" and not self.deliveries[k]]

    def verify(self, pending_at_end: int | None = None) -> Report:
        r = Report(kills=self.kills, pending_at_end=pending_at_end,
                   recovery_seconds=list(self.recovery_seconds))
        for key, t in self.txns.items():
            if t.state == FAILED:
                r.half_send_failed += 1
            elif t.state == DECIDED:
                r.outcomes[t.kind] += 1
            n = self.deliveries[key]
            if t.truth == "commit" and n == 0:
                r.lost.append(key)
            if t.truth == "rollback" and n:
                r.wrongly_delivered.append(key)
            if t.state == SENDING and n:
                r.unknown_delivered.append(key)
            if len(self.positions[key]) > 1:
                r.duplicated.append(key)
            r.redelivered += max(0, n - len(self.positions[key]))
            # A check is expected while the broker cannot know the outcome: the decision was
            # unknown, or the END may have been lost (any check past the first answer that
            # carried the final decision is a duplicate: harmless after a kill, but counted).
            answered_final = False
            for answer in t.check_answers:
                if answered_final:
                    r.checks_duplicate += 1
                else:
                    r.checks_expected += 1
                answered_final = answered_final or answer != "unknown"
        r.unknown_delivered += self.foreign_deliveries
        r.checks_unexpected = len(self.foreign_checks)
        r.unexpected_check_keys = list(self.foreign_checks)
        for queue, samples in self.offset_samples.items():
            persisted = -1
            for kind, value in samples:
                if value < persisted:
                    r.offsets_moved_back.append(f"{queue}: persisted {persisted}, then {kind} {value}")
                if kind == "persisted":
                    persisted = max(persisted, value)
        return r
