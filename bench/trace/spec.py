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
import math
from dataclasses import asdict, dataclass, field

from txbroker.bench.trace.fs import WorkFS, join

META_FILE = "_txbroker_trace.json"
#: Version of the trace format this code writes (it reads version 1 too).
VERSION = 2
KINDS = ("commit", "rollback", "unknown_commit", "unknown_rollback", "never")
#: A production-like mix: most transactions decide at once, a few percent are left to the
#: broker.  On the Kafka side every undecided row is a producer that dies and is replaced,
#: which costs far more than a check-back, so this mix is also what makes the designs
#: comparable.
DEFAULT_MIX = "commit=0.88,rollback=0.09,unknown_commit=0.015,unknown_rollback=0.01,never=0.005"
#: The check-back stress mix (a quarter of the rows undecided): ``--mix stress``.
STRESS_MIX = "commit=0.7,rollback=0.1,unknown_commit=0.1,unknown_rollback=0.05,never=0.05"
#: Names ``--mix`` accepts besides ``KIND=WEIGHT,...``.
NAMED_MIXES = {"production": DEFAULT_MIX, "stress": STRESS_MIX}
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
    "topic": "string: `BenchT<k>`, the topic of message 0",
    "keys": "string: the transaction's business key `key-<k>`, k < key_space (Zipf over k)",
    "tags": "string: `TagA` / `TagB` / `TagC`",
    "body_bytes": "int: body size",
    "start_ms": "bigint: scheduled start, ms from trace start",
    "local_tx_ms": "int: duration of the local transaction",
    "kind": "string: commit | rollback | unknown_commit | unknown_rollback | never",
    "first_decision": "string: commit | rollback | unknown (what execute_local_transaction returns)",
    "check_answers": "array<string>: answer to the n-th check (the last one repeats)",
    "expected_checks": "int: checks the broker must send",
    "expected_outcome": "string: commit | rollback | discard",
    "messages": "int: messages in the transaction (>= 1)",
    "topics": "array<string>: topic of message i (length messages, topics[0] = topic)",
    "crash": "boolean: the producer dies mid-transaction (only where first_decision = unknown)",
    "restart_ms": "int: how long after the death a replacement starts (null unless undecided)",
}


@dataclass(frozen=True)
class Dist:
    """A distribution of whole numbers, parsed from an option's text.

    ``const:V``, ``uniform:A:B`` (inclusive), ``exp:MEAN[:MAX]``, ``lognormal:MEDIAN:SIGMA[:MAX]``
    or ``pareto:MIN:ALPHA[:MAX]``.  The long-tailed kinds are always capped (``max``), because a
    trace is refused when its longest local transaction could outlive half the transaction
    timeout: the default cap is the 99.87th percentile for lognormal (MEDIAN x e^(3 SIGMA)) and
    the 99.9th for pareto (MIN x 1000^(1/ALPHA)), and exp's is 10 x MEAN as before.
    """

    kind: str
    a: float
    b: float
    #: Upper bound of every drawn value (``b`` for const and uniform).
    cap: float = 0.0

    @classmethod
    def parse(cls, text: str, what: str) -> Dist:
        parts = text.strip().split(":")
        try:
            nums = [float(p) for p in parts[1:]]
        except ValueError:
            raise SpecError(f"{what}: {text!r}: numbers expected after the kind") from None
        kind = parts[0]
        if any(not n >= 0 for n in nums):
            raise SpecError(f"{what}: {text!r}: values must be >= 0")
        if kind == "const" and len(nums) == 1:
            return cls(kind, nums[0], nums[0], nums[0])
        if kind == "uniform" and len(nums) == 2 and nums[0] <= nums[1]:
            return cls(kind, nums[0], nums[1], nums[1])
        if kind == "exp" and len(nums) in (1, 2) and nums[0] > 0:
            cap = nums[1] if len(nums) == 2 else nums[0] * 10
            return cls(kind, nums[0], cap, cap)
        if kind == "lognormal" and len(nums) in (2, 3) and nums[0] > 0:
            cap = nums[2] if len(nums) == 3 else nums[0] * math.exp(3 * nums[1])
            return cls(kind, nums[0], nums[1], cap)
        if kind == "pareto" and len(nums) in (2, 3) and nums[0] > 0 and nums[1] > 0:
            cap = nums[2] if len(nums) == 3 else nums[0] * 1000 ** (1 / nums[1])
            if cap < nums[0]:
                raise SpecError(f"{what}: {text!r}: MAX must be >= MIN")
            return cls(kind, nums[0], nums[1], cap)
        raise SpecError(f"{what}: {text!r}: expected const:V, uniform:A:B (A<=B), exp:MEAN[:MAX], "
                        "lognormal:MEDIAN:SIGMA[:MAX] or pareto:MIN:ALPHA[:MAX]")

    @property
    def max(self) -> float:
        return self.cap

    def __str__(self) -> str:
        if self.kind == "const":
            return f"const:{self.a:g}"
        if self.kind in ("lognormal", "pareto"):
            return f"{self.kind}:{self.a:g}:{self.b:g}:{self.cap:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


@dataclass(frozen=True)
class Arrival:
    """When transactions start: the intensity of their arrival process over the trace's span.

    ``poisson`` (constant intensity: independent starts, exponential gaps), ``uniform`` (one
    start per 1/rate slot, jittered inside it), ``bursts:ON_S:OFF_S:FACTOR`` (periods of ON_S
    seconds at FACTOR times the intensity of the OFF_S seconds after them, a period starting
    with its burst) or ``diurnal:PERIOD_S:AMPLITUDE`` (intensity 1 - AMPLITUDE x cos(2 pi t /
    PERIOD_S): the trace starts in the trough and peaks at PERIOD_S / 2).  Every kind keeps the
    trace's mean rate: N transactions over N / rate seconds.
    """

    kind: str
    #: bursts: ON_S, OFF_S, FACTOR; diurnal: PERIOD_S, AMPLITUDE; else empty.
    params: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Arrival:
        kind, *rest = text.strip().split(":")
        usage = ("expected poisson, uniform, bursts:ON_S:OFF_S:FACTOR (ON_S, OFF_S > 0, "
                 "FACTOR >= 1) or diurnal:PERIOD_S:AMPLITUDE (PERIOD_S > 0, 0 <= AMPLITUDE <= 1)")
        try:
            nums = tuple(float(p) for p in rest)
        except ValueError:
            raise SpecError(f"--arrival: {text!r}: {usage}") from None
        ok = ((kind in ("poisson", "uniform") and not nums)
              or (kind == "bursts" and len(nums) == 3 and nums[0] > 0 and nums[1] > 0
                  and nums[2] >= 1)
              or (kind == "diurnal" and len(nums) == 2 and nums[0] > 0 and 0 <= nums[1] <= 1))
        if not ok:
            raise SpecError(f"--arrival: {text!r}: {usage}")
        return cls(kind, nums)

    def __str__(self) -> str:
        return ":".join([self.kind, *(f"{n:g}" for n in self.params)])


@dataclass(frozen=True)
class ConsumerRestart:
    """A delivery consumer stopped ``at_ms`` after the trace start for ``down_ms``."""

    at_ms: int
    consumer: int
    down_ms: int = 1000


def consumer_restarts(count: int, consumers: int, span_ms: float,
                      down_ms: int = 1000) -> list[ConsumerRestart]:
    """``count`` restarts evenly spread over the span (never at its very start or end, where
    a stopped consumer would miss nothing), of consumer i % consumers."""
    return [ConsumerRestart(round(span_ms * (i + 1) / (count + 1)), i % consumers, down_ms)
            for i in range(count)]


@dataclass(frozen=True)
class KafkaSettings:
    """What the Kafka side of a replay assumes of the broker."""

    #: The transactional producers' transaction.timeout.ms: how long a ``never`` row's open
    #: transaction blocks read_committed consumers before the broker aborts it.
    transaction_timeout_ms: int = 10_000


def parse_mix(text: str) -> dict[str, float]:
    """``commit=0.7,...`` (or a name of :data:`NAMED_MIXES`) → normalised weights over
    :data:`KINDS` (missing kinds weigh 0)."""
    text = NAMED_MIXES.get(text.strip(), text)
    mix = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in mix:
            raise SpecError(f"--mix: {part!r}: expected KIND=WEIGHT with KIND one of "
                            f"{', '.join(KINDS)}, or a named mix: {', '.join(NAMED_MIXES)}")
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
    """``_txbroker_trace.json``: how a trace was generated and what its expectations assume.

    Version 2 added the arrival process, skew, multi-message transactions, producer crashes,
    consumer restarts and the Kafka settings; a version-1 file reads with their defaults (which
    describe what a version-1 trace is: Poisson-free uniform slots, one message, no crash).
    """

    transactions: int
    seed: int
    topics: int
    producers: int
    rate: float
    mix: dict[str, float]
    body_bytes: str
    local_tx_ms: str
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    version: int = VERSION
    arrival: str = "poisson"
    producer_skew: float = 0.0
    key_skew: float = 0.0
    key_space: int = 100_000
    messages: str = "const:1"
    crash_fraction: float = 0.5
    restart_ms: str = "uniform:100:500"
    consumers: int = 2
    consumer_restarts: list[ConsumerRestart] = field(default_factory=list)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)

    def write(self, fs: WorkFS, trace_uri: str) -> None:
        fs.write_text(join(trace_uri, META_FILE), json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, fs: WorkFS, trace_uri: str) -> TraceMeta:
        path = join(trace_uri, META_FILE)
        try:
            raw = json.loads(fs.read_text(path))
            version = raw.get("version")
            if version not in (1, VERSION):
                raise SpecError(f"{path}: trace version {version} is not supported")
            if version == 1:
                # What a version-1 trace is, in version-2 terms.
                raw.update(arrival="uniform", key_space=raw["transactions"], crash_fraction=0.0)
            meta = cls.from_dict(raw)
        except FileNotFoundError:
            raise SpecError(f"{trace_uri}: not a trace (no {META_FILE}); "
                            "write one with `txbroker bench generate`") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"{path}: invalid trace metadata: {exc}") from None
        return meta

    @classmethod
    def from_dict(cls, raw: dict) -> TraceMeta:
        """The meta :func:`dataclasses.asdict` wrote, with its nested settings rebuilt (the
        trace's metadata file and a run's ``run.json`` both hold it)."""
        raw = dict(raw)
        raw["broker"] = BrokerSettings(**raw["broker"])
        raw["consumer_restarts"] = [ConsumerRestart(**c) for c in raw.get("consumer_restarts", [])]
        raw["kafka"] = KafkaSettings(**raw.get("kafka", {}))
        return cls(**raw)

    def topic_names(self) -> list[str]:
        return [f"BenchT{k}" for k in range(self.topics)]

    @property
    def span_ms(self) -> float:
        """The span the starts are drawn over: N transactions at the mean rate."""
        return self.transactions * 1000.0 / self.rate

    @property
    def expected_commits(self) -> float:
        return self.transactions * (self.mix["commit"] + self.mix["unknown_commit"])


def read_trace(spark, trace_uri: str, meta: TraceMeta):
    """The trace's rows as a DataFrame with the version-2 columns, whatever its version: a
    version-1 trace gains ``messages`` 1, ``topics`` [topic], ``crash`` false and
    ``restart_ms`` null, so every reader is written against one schema."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(trace_uri)
    if meta.version == 1:
        df = (df.withColumn("messages", F.lit(1))
              .withColumn("topics", F.array(F.col("topic")))
              .withColumn("crash", F.lit(False))
              .withColumn("restart_ms", F.lit(None).cast("int")))
    return df.select(*TRACE_COLUMNS)


def producer_group(index: int) -> str:
    return f"bench-p{index}"
