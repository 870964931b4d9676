"""Trace and results schemas, the transaction mix, value distributions and trace metadata.

A trace row is one transaction and carries its own expected outcome, computed from the broker
settings stored in the trace metadata (``_txbroker_trace.json``): a ``never`` row (every check
answered UNKNOW) is checked exactly ``transaction_check_max`` times and then discarded, so the
expectation is only right for a broker configured like the metadata says.  ``replay`` refuses to
run a trace against settings it was not generated for only when it starts the broker itself;
against ``--namesrv`` the operator vouches for the broker's settings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from txbroker.bench.trace.fs import WorkFS, join

META_FILE = "_txbroker_trace.json"
KINDS = ("commit", "rollback", "unknown_commit", "unknown_rollback", "never")
DEFAULT_MIX = "commit=0.7,rollback=0.1,unknown_commit=0.1,unknown_rollback=0.05,never=0.05"
#: Most UNKNOW answers an ``unknown_*`` row gives before its decisive one (bounded by check max).
MAX_UNKNOWN_BEFORE_DECISION = 2
#: Property naming the trace row on every message (a real app would use a business key).
PROP_TX = "BENCH_TX"
#: Property naming the replay run, so deliveries of older runs on the same broker are ignored.
PROP_RUN = "BENCH_RUN"


class SpecError(ValueError):
    """An option or a file does not describe a valid trace; the message says which and why."""


TRACE_COLUMNS = {
    "id": "bigint: row number, 0..N-1, unique",
    "producer": "int: producer index; producer group is `bench-p<producer>`",
    "topic": "string: `BenchT<k>`",
    "keys": "string: message key `tx-<id>`",
    "tags": "string: `TagA` / `TagB` / `TagC`",
    "body_bytes": "int: body size",
    "start_ms": "bigint: scheduled start, ms from trace start",
    "local_tx_ms": "int: duration of the local transaction",
    "kind": "string: commit | rollback | unknown_commit | unknown_rollback | never",
    "first_decision": "string: commit | rollback | unknown (what execute_local_transaction returns)",
    "check_answers": "array<string>: answer to the n-th check (the last one repeats)",
    "expected_checks": "int: checks the broker must send",
    "expected_outcome": "string: commit | rollback | discard",
}


@dataclass(frozen=True)
class Dist:
    """``const:V``, ``uniform:A:B`` or ``exp:MEAN[:MAX]`` (integers; exp capped at MAX)."""

    kind: str
    a: float
    b: float

    @classmethod
    def parse(cls, text: str, what: str) -> Dist:
        parts = text.strip().split(":")
        try:
            nums = [float(p) for p in parts[1:]]
        except ValueError:
            raise SpecError(f"{what}: {text!r}: numbers expected after the kind") from None
        kind = parts[0]
        if any(n < 0 for n in nums):
            raise SpecError(f"{what}: {text!r}: values must be >= 0")
        if kind == "const" and len(nums) == 1:
            return cls(kind, nums[0], nums[0])
        if kind == "uniform" and len(nums) == 2 and nums[0] <= nums[1]:
            return cls(kind, nums[0], nums[1])
        if kind == "exp" and len(nums) in (1, 2) and nums[0] > 0:
            cap = nums[1] if len(nums) == 2 else nums[0] * 10
            return cls(kind, nums[0], cap)
        raise SpecError(f"{what}: {text!r}: expected const:V, uniform:A:B (A<=B) or exp:MEAN[:MAX]")

    @property
    def max(self) -> float:
        return self.b

    def __str__(self) -> str:
        if self.kind == "const":
            return f"const:{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def parse_mix(text: str) -> dict[str, float]:
    """``commit=0.7,...`` → normalised weights over :data:`KINDS` (missing kinds weigh 0)."""
    mix = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in mix:
            raise SpecError(f"--mix: {part!r}: expected KIND=WEIGHT with KIND one of {', '.join(KINDS)}")
        try:
            w = float(value)
        except ValueError:
            raise SpecError(f"--mix: {part!r}: weight is not a number") from None
        if not w >= 0:
            raise SpecError(f"--mix: {part!r}: weight must be >= 0")
        mix[name] = w
    total = sum(mix.values())
    if total <= 0:
        raise SpecError("--mix: weights sum to 0")
    return {k: v / total for k, v in mix.items()}


@dataclass(frozen=True)
class BrokerSettings:
    """The broker settings the trace's expectations assume (and ``bench run`` starts with)."""

    transaction_timeout: float = 1.0
    transaction_check_interval: float = 0.5
    transaction_check_max: int = 3

    def validate(self) -> None:
        if not self.transaction_timeout > 0 or not self.transaction_check_interval > 0:
            raise SpecError("transaction_timeout and transaction_check_interval must be > 0")
        if self.transaction_check_max < 1:
            raise SpecError("transaction_check_max must be >= 1")

    def settle_seconds(self) -> float:
        """Upper bound on how long after its start a transaction can still be checked."""
        return (self.transaction_timeout
                + (self.transaction_check_max + 2) * self.transaction_check_interval + 2.0)


@dataclass(frozen=True)
class TraceMeta:
    transactions: int
    seed: int
    topics: int
    producers: int
    rate: float
    mix: dict[str, float]
    body_bytes: str
    local_tx_ms: str
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    version: int = 1

    def write(self, fs: WorkFS, trace_uri: str) -> None:
        fs.write_text(join(trace_uri, META_FILE), json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, fs: WorkFS, trace_uri: str) -> TraceMeta:
        path = join(trace_uri, META_FILE)
        try:
            raw = json.loads(fs.read_text(path))
            raw["broker"] = BrokerSettings(**raw["broker"])
            meta = cls(**raw)
        except FileNotFoundError:
            raise SpecError(f"{trace_uri}: not a trace (no {META_FILE}); "
                            "write one with `txbroker bench generate`") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"{path}: invalid trace metadata: {exc}") from None
        if meta.version != 1:
            raise SpecError(f"{path}: trace version {meta.version} is not supported")
        return meta

    def topic_names(self) -> list[str]:
        return [f"BenchT{k}" for k in range(self.topics)]

    @property
    def expected_commits(self) -> float:
        return self.transactions * (self.mix["commit"] + self.mix["unknown_commit"])


def producer_group(index: int) -> str:
    return f"bench-p{index}"
