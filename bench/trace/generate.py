"""``bench generate``: a Spark job writing a trace as Parquet, deterministic for a seed.

Every random value of a row comes from ``xxhash64(seed, id, salt)`` (Spark SQL), never from a
random generator with state, so a row is the same whatever the partitioning or the master.

Starts need no running sum over rows (which would take one ordered pass over N rows): a
Poisson process conditioned on N arrivals in [0, T = N / rate] puts each arrival independently
at a time whose density is proportional to the intensity.  So each row maps its own uniform
through the inverse of the intensity's cumulative function: ``u x T`` for Poisson,
``(id + u) / rate`` for evenly spread slots, and for bursts and the diurnal ramp a table of
that function over one period, interpolated in a vectorised (pandas) UDF.  Zipf-skewed
producers and keys are drawn the same way, through the inverse of the Zipf distribution.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from txbroker.bench.trace.fs import WorkFS
from txbroker.bench.trace.spec import (
    DEFAULT_MIX,
    KINDS,
    MAX_UNKNOWN_BEFORE_DECISION,
    META_FILE,
    Arrival,
    BrokerSettings,
    Dist,
    SpecError,
    TraceMeta,
    parse_mix,
)

_TWO53 = float(2 ** 53)
#: Most messages one transaction may carry (a Kafka transaction's records travel in one
#: produce per partition; thousands would measure batching, not transactions).
MAX_MESSAGES = 1000
#: Points of the diurnal cumulative-intensity table over one period (linear in between: the
#: error is far below a millisecond for any period a trace uses).
_DIURNAL_POINTS = 4097
#: Zipf ranks whose weights are summed exactly; beyond, the sum is the integral of x^-s around
#: each rank, which differs from the exact one by far less than one rank's weight.
_ZIPF_HEAD = 1 << 16

# Salts of the per-row uniforms (one per random value of a row; never reuse one).
_KIND, _N_UNKNOWN, _PRODUCER, _TOPIC, _TAGS, _BODY, _START, _LOCAL = range(1, 9)
_CRASH, _RESTART, _MESSAGES, _KEY = range(9, 13)
#: Added to a salt for the second uniform a draw needs (lognormal's Box-Muller angle).
_SECOND = 100


def arrival_seconds(u: np.ndarray, arrival: Arrival, span_s: float) -> np.ndarray:
    """Start times in [0, span_s) for uniforms ``u`` under a periodic intensity (bursts,
    diurnal): the inverse of the cumulative intensity, whole periods counted directly and the
    rest read from a table of one period, so the table stays small whatever the span."""
    if arrival.kind == "bursts":
        on, off, factor = arrival.params
        period = on + off
        tau = np.array([0.0, on, period])
        mass = np.array([0.0, factor * on, factor * on + off])
    elif arrival.kind == "diurnal":
        period, amplitude = arrival.params
        tau = np.linspace(0.0, period, _DIURNAL_POINTS)
        mass = tau - amplitude * period / (2 * math.pi) * np.sin(2 * math.pi * tau / period)
    else:
        raise ValueError(f"no periodic intensity for {arrival}")
    per_period = mass[-1]
    whole = math.floor(span_s / period)
    total = whole * per_period + float(np.interp(span_s - whole * period, tau, mass))
    m = np.asarray(u, dtype=float) * total
    k = np.floor(m / per_period)
    rest = np.clip(m - k * per_period, 0.0, per_period)
    t = k * period + np.interp(rest, mass, tau)
    return np.minimum(t, np.nextafter(span_s, 0.0))


def zipf_ranks(u: np.ndarray, n: int, s: float) -> np.ndarray:
    """0-based ranks in [0, n) with P(rank k) proportional to (k + 1)^-s, for uniforms ``u``."""
    u = np.asarray(u, dtype=float)
    if s == 0:
        return np.minimum(np.floor(u * n), n - 1).astype(np.int64)
    head = min(n, _ZIPF_HEAD)
    cum = np.cumsum(np.arange(1, head + 1, dtype=float) ** -s)

    def integral(x):  # of t^-s dt, up to a constant
        return np.log(x) if s == 1 else x ** (1 - s) / (1 - s)

    def inverse(y):
        return np.exp(y) if s == 1 else ((1 - s) * y) ** (1 / (1 - s))

    tail = float(integral(n + 0.5) - integral(head + 0.5)) if n > head else 0.0
    m = u * (cum[-1] + tail)
    ranks = np.searchsorted(cum, m, side="right")
    beyond = ranks >= head
    if beyond.any():
        x = inverse(integral(head + 0.5) + (m[beyond] - cum[-1]))
        ranks[beyond] = np.floor(x + 0.5) - 1
    return np.clip(ranks, 0, n - 1).astype(np.int64)


def _uniform(F, seed: int, salt: int, *extra):
    """A uniform [0, 1) column derived from (seed, id, salt, *extra)."""
    h = F.xxhash64(F.lit(seed), F.col("id"), F.lit(salt), *extra)
    return F.pmod(h, F.lit(2 ** 53)).cast("double") / F.lit(_TWO53)


def _draw(F, dist: Dist, seed: int, salt: int):
    """A whole number drawn from ``dist`` for each row (long-tailed kinds capped)."""
    u = _uniform(F, seed, salt)
    if dist.kind == "const":
        value = F.lit(dist.a)
    elif dist.kind == "uniform":
        value = F.lit(dist.a) + u * F.lit(dist.b - dist.a + 1)
    elif dist.kind == "exp":
        value = -F.log1p(-u) * F.lit(dist.a)
    elif dist.kind == "lognormal":  # a standard normal by Box-Muller from two uniforms
        z = (F.sqrt(F.lit(-2.0) * F.log1p(-u))
             * F.cos(F.lit(2 * math.pi) * _uniform(F, seed, salt + _SECOND)))
        value = F.lit(dist.a) * F.exp(F.lit(dist.b) * z)
    else:  # pareto: MIN x (1 - u)^(-1/ALPHA)
        value = F.lit(dist.a) * F.pow(F.lit(1.0) - u, F.lit(-1.0 / dist.b))
    return F.floor(F.least(value, F.lit(dist.cap))).cast("int")


def _vectorised(fn, return_type: str):
    """A pandas UDF applying the numpy function ``fn`` to a column of uniforms."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf(return_type)
    def apply(u: pd.Series) -> pd.Series:
        return pd.Series(fn(u.to_numpy()))

    return apply


def _ranks(F, n: int, skew: float, seed: int, salt: int):
    """A rank column in [0, n): uniform when ``skew`` is 0, else Zipf with that exponent."""
    u = _uniform(F, seed, salt)
    if skew == 0:
        return F.floor(u * F.lit(n)).cast("int")
    return _vectorised(functools.partial(zipf_ranks, n=n, s=skew), "bigint")(u).cast("int")


def _start_ms(F, meta: TraceMeta):
    u = _uniform(F, meta.seed, _START)
    arrival = Arrival.parse(meta.arrival)
    if arrival.kind == "uniform":
        t = (F.col("id") + u) * F.lit(1000.0 / meta.rate)
    elif arrival.kind == "poisson":
        t = u * F.lit(meta.span_ms)
    else:
        seconds = functools.partial(arrival_seconds, arrival=arrival, span_s=meta.span_ms / 1000)
        t = _vectorised(seconds, "double")(u) * F.lit(1000.0)
    return F.floor(t).cast("bigint")


def _topic(F, meta: TraceMeta, *extra):
    k = F.floor(_uniform(F, meta.seed, _TOPIC, *extra) * F.lit(meta.topics)).cast("int")
    return F.concat(F.lit("BenchT"), k.cast("string"))


def build(spark, meta: TraceMeta, partitions: int | None = None):
    """The trace as a DataFrame (not yet written)."""
    from pyspark.sql import functions as F

    seed = meta.seed
    df = spark.range(0, meta.transactions, numPartitions=partitions or
                     max(2, min(64, meta.transactions // 100_000 + 1)))
    u_kind = _uniform(F, seed, _KIND)
    kind = None
    acc = 0.0
    for name in KINDS:
        acc += meta.mix[name]
        cond = u_kind < F.lit(acc if name != KINDS[-1] else 2.0)
        kind = F.when(cond, F.lit(name)) if kind is None else kind.when(cond, F.lit(name))
    # The decisive answer comes before the last check the broker allows: an answer to the
    # last check that arrives after the next pass has started finds the half already
    # discarded (the broker discards at the pass after its check-max-th check), which is a
    # timing race of the design, not an outcome a trace can promise.
    max_unknown = max(0, min(MAX_UNKNOWN_BEFORE_DECISION, meta.broker.transaction_check_max - 2))
    n_unknown = F.floor(_uniform(F, seed, _N_UNKNOWN) * F.lit(max_unknown + 1)).cast("int")
    check_max = meta.broker.transaction_check_max
    messages_dist = Dist.parse(meta.messages, "--messages")
    messages = F.greatest(_draw(F, messages_dist, seed, _MESSAGES), F.lit(1))
    if messages_dist.max < 2:  # one message: no per-message draws to make
        topics = F.array(_topic(F, meta))
    else:
        # Message 0's topic is the row's topic; message i's is drawn on its own, so a
        # transaction of several messages spans several topics.
        topics = F.transform(F.sequence(F.lit(0), F.col("messages") - 1),
                             lambda i: F.when(i == 0, _topic(F, meta)).otherwise(_topic(F, meta, i)))
    df = (df.withColumn("kind", kind)
          .withColumn("producer", _ranks(F, meta.producers, meta.producer_skew, seed, _PRODUCER))
          .withColumn("messages", messages)
          .withColumn("topics", topics)
          .withColumn("topic", F.col("topics")[0])
          .withColumn("keys", F.concat(F.lit("key-"), _ranks(F, meta.key_space, meta.key_skew,
                                                             seed, _KEY).cast("string")))
          .withColumn("tags", F.element_at(F.array(F.lit("TagA"), F.lit("TagB"), F.lit("TagC")),
                                           (F.floor(_uniform(F, seed, _TAGS) * F.lit(3)) + 1).cast("int")))
          .withColumn("body_bytes", F.greatest(_draw(F, Dist.parse(meta.body_bytes, "--body-bytes"),
                                                     seed, _BODY), F.lit(1)))
          .withColumn("start_ms", _start_ms(F, meta))
          .withColumn("local_tx_ms", _draw(F, Dist.parse(meta.local_tx_ms, "--local-tx-ms"), seed, _LOCAL))
          .withColumn("n_unknown", n_unknown))
    k = F.col("kind")
    undecided = k.isin("unknown_commit", "unknown_rollback", "never")
    df = (df.withColumn("first_decision",
                        F.when(k == "commit", "commit").when(k == "rollback", "rollback").otherwise("unknown"))
          .withColumn("check_answers",
                      F.when(k == "unknown_commit",
                             F.concat(F.array_repeat(F.lit("unknown"), F.col("n_unknown")), F.array(F.lit("commit"))))
                      .when(k == "unknown_rollback",
                            F.concat(F.array_repeat(F.lit("unknown"), F.col("n_unknown")), F.array(F.lit("rollback"))))
                      .when(k == "never", F.array(F.lit("unknown")))
                      .otherwise(F.array().cast("array<string>")))
          .withColumn("expected_checks",
                      F.when(k.startswith("unknown_"), F.col("n_unknown") + 1)
                      .when(k == "never", F.lit(check_max)).otherwise(F.lit(0)).cast("int"))
          .withColumn("expected_outcome",
                      F.when(k.isin("commit", "unknown_commit"), "commit")
                      .when(k.isin("rollback", "unknown_rollback"), "rollback").otherwise("discard"))
          .withColumn("crash", undecided & (_uniform(F, seed, _CRASH) < F.lit(meta.crash_fraction)))
          .withColumn("restart_ms", F.when(undecided, _draw(F, Dist.parse(meta.restart_ms, "--restart-ms"),
                                                             seed, _RESTART))))
    return df.select("id", "producer", "topic", "keys", "tags", "body_bytes", "start_ms",
                     "local_tx_ms", "kind", "first_decision", "check_answers", "expected_checks",
                     "expected_outcome", "messages", "topics", "crash", "restart_ms")


def validate(meta: TraceMeta) -> None:
    if meta.transactions < 1:
        raise SpecError("--transactions must be >= 1")
    if meta.topics < 1 or meta.producers < 1:
        raise SpecError("--topics and --producers must be >= 1")
    if not meta.rate > 0:
        raise SpecError("--rate must be > 0")
    meta.broker.validate()
    Arrival.parse(meta.arrival)
    if not (meta.producer_skew >= 0 and meta.key_skew >= 0):
        raise SpecError("--producer-skew and --key-skew must be >= 0 (0: uniform)")
    if meta.key_space < 1:
        raise SpecError("--key-space must be >= 1")
    if not 0 <= meta.crash_fraction <= 1:
        raise SpecError(f"--crash-fraction {meta.crash_fraction:g}: must be between 0 and 1")
    if meta.consumers < 1:
        raise SpecError("--consumers must be >= 1")
    if meta.kafka.transaction_timeout_ms < 1:
        raise SpecError("--kafka-transaction-timeout must be > 0")
    Dist.parse(meta.body_bytes, "--body-bytes")
    Dist.parse(meta.restart_ms, "--restart-ms")
    messages = Dist.parse(meta.messages, "--messages")
    if messages.max > MAX_MESSAGES:
        raise SpecError(f"--messages {messages}: at most {MAX_MESSAGES} messages per transaction")
    local = Dist.parse(meta.local_tx_ms, "--local-tx-ms")
    # A local transaction outliving the immunity time gets checked while it runs; the trace's
    # check counts would then be wrong, so such a trace is refused rather than mis-verified.
    if local.max >= meta.broker.transaction_timeout * 1000 / 2:
        raise SpecError(f"--local-tx-ms {local}: the longest local transaction must stay under "
                        f"half the transaction timeout ({meta.broker.transaction_timeout:g} s)")


def generate(spark, meta: TraceMeta, out: str | Path, partitions: int | None = None) -> int:
    """Write the trace to ``out`` (a path or URI; replaced) and return its row count."""
    validate(meta)
    fs = WorkFS(spark)
    uri = fs.qualify(out)
    fs.replace_dir(uri, META_FILE, "trace")
    build(spark, meta, partitions).write.parquet(uri)
    meta.write(fs, uri)
    return meta.transactions


def default_meta(transactions: int, seed: int = 1, topics: int = 4, producers: int = 16,
                 rate: float = 2000.0, mix: dict[str, float] | None = None,
                 body_bytes: str = "uniform:64:512", local_tx_ms: str = "uniform:0:20",
                 broker: BrokerSettings | None = None, **v2) -> TraceMeta:
    """A trace's metadata with the generator's defaults; ``v2``: any other field of
    :class:`TraceMeta` (``arrival``, ``key_skew``, ...)."""
    return TraceMeta(transactions=transactions, seed=seed, topics=topics, producers=producers,
                     rate=rate, mix=mix or parse_mix(DEFAULT_MIX), body_bytes=body_bytes,
                     local_tx_ms=local_tx_ms, broker=broker or BrokerSettings(), **v2)
