"""``bench generate``: a Spark job writing a trace as Parquet, deterministic for a seed.

Every random value of a row comes from ``xxhash64(seed, id, salt)`` (Spark SQL), never from a
random generator with state, so a row is the same whatever the partitioning or the master.
Scheduled starts are ``(id + jitter) / rate``: arrivals at the requested mean rate without a
running sum (which would need one ordered pass).
"""

from __future__ import annotations

from pathlib import Path

from txbroker.bench.trace.fs import WorkFS
from txbroker.bench.trace.spec import (
    KINDS,
    MAX_UNKNOWN_BEFORE_DECISION,
    META_FILE,
    BrokerSettings,
    Dist,
    SpecError,
    TraceMeta,
)

_TWO53 = float(2 ** 53)


def _uniform(F, seed: int, salt: int):
    """A uniform [0, 1) column derived from (seed, id, salt)."""
    h = F.xxhash64(F.lit(seed), F.col("id"), F.lit(salt))
    return F.pmod(h, F.lit(2 ** 53)).cast("double") / F.lit(_TWO53)


def _draw(F, dist: Dist, u):
    if dist.kind == "const":
        value = F.lit(dist.a)
    elif dist.kind == "uniform":
        value = F.lit(dist.a) + u * F.lit(dist.b - dist.a + 1)
    else:  # exp, capped
        value = F.least(-F.log1p(-u) * F.lit(dist.a), F.lit(dist.b))
    return F.floor(value).cast("int")


def build(spark, meta: TraceMeta, partitions: int | None = None):
    """The trace as a DataFrame (not yet written)."""
    from pyspark.sql import functions as F

    seed = meta.seed
    body = Dist.parse(meta.body_bytes, "--body-bytes")
    local = Dist.parse(meta.local_tx_ms, "--local-tx-ms")
    df = spark.range(0, meta.transactions, numPartitions=partitions or
                     max(2, min(64, meta.transactions // 100_000 + 1)))
    u_kind = _uniform(F, seed, 1)
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
    n_unknown = F.floor(_uniform(F, seed, 2) * F.lit(max_unknown + 1)).cast("int")
    check_max = meta.broker.transaction_check_max
    df = (df.withColumn("kind", kind)
          .withColumn("producer", F.floor(_uniform(F, seed, 3) * F.lit(meta.producers)).cast("int"))
          .withColumn("topic", F.concat(F.lit("BenchT"),
                                        F.floor(_uniform(F, seed, 4) * F.lit(meta.topics)).cast("int").cast("string")))
          .withColumn("keys", F.concat(F.lit("tx-"), F.col("id").cast("string")))
          .withColumn("tags", F.element_at(F.array(F.lit("TagA"), F.lit("TagB"), F.lit("TagC")),
                                           (F.floor(_uniform(F, seed, 5) * F.lit(3)) + 1).cast("int")))
          .withColumn("body_bytes", F.greatest(_draw(F, body, _uniform(F, seed, 6)), F.lit(1)))
          .withColumn("start_ms", F.floor((F.col("id") + _uniform(F, seed, 7)) * F.lit(1000.0 / meta.rate))
                      .cast("bigint"))
          .withColumn("local_tx_ms", _draw(F, local, _uniform(F, seed, 8)))
          .withColumn("n_unknown", n_unknown))
    k = F.col("kind")
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
                      .when(k.isin("rollback", "unknown_rollback"), "rollback").otherwise("discard")))
    return df.select("id", "producer", "topic", "keys", "tags", "body_bytes", "start_ms",
                     "local_tx_ms", "kind", "first_decision", "check_answers", "expected_checks",
                     "expected_outcome")


def validate(meta: TraceMeta) -> None:
    if meta.transactions < 1:
        raise SpecError("--transactions must be >= 1")
    if meta.topics < 1 or meta.producers < 1:
        raise SpecError("--topics and --producers must be >= 1")
    if not meta.rate > 0:
        raise SpecError("--rate must be > 0")
    meta.broker.validate()
    Dist.parse(meta.body_bytes, "--body-bytes")
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


def default_meta(transactions: int, seed: int = 1, topics: int = 4, producers: int = 4,
                 rate: float = 2000.0, mix: dict[str, float] | None = None,
                 body_bytes: str = "uniform:64:512", local_tx_ms: str = "uniform:0:20",
                 broker: BrokerSettings | None = None) -> TraceMeta:
    from txbroker.bench.trace.spec import DEFAULT_MIX, parse_mix

    return TraceMeta(transactions=transactions, seed=seed, topics=topics, producers=producers,
                     rate=rate, mix=mix or parse_mix(DEFAULT_MIX), body_bytes=body_bytes,
                     local_tx_ms=local_tx_ms, broker=broker or BrokerSettings())
