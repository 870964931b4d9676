"""Trace generation: deterministic for a seed whatever the partitioning, expectations consistent
with the broker settings in the metadata, bad options refused with a clear message."""

from __future__ import annotations

import itertools

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from txbroker.bench.trace.fs import WorkFS
from txbroker.bench.trace.generate import build, default_meta, generate
from txbroker.bench.trace.spec import (
    KINDS,
    TRACE_COLUMNS,
    BrokerSettings,
    Dist,
    SpecError,
    TraceMeta,
    parse_mix,
)
from txbroker.cli.main import main


def _rows(spark, meta, partitions):
    return sorted(tuple(r) for r in build(spark, meta, partitions).collect())


#: Every version-2 generator option away from its default, so determinism covers each draw.
RICH = {"arrival": "bursts:1:4:10", "producer_skew": 1.1, "key_skew": 0.9, "key_space": 500,
        "messages": "uniform:1:3", "local_tx_ms": "lognormal:5:1:200", "restart_ms": "pareto:100:1.5"}


@pytest.mark.slow
def test_same_seed_same_trace_whatever_the_partitioning(spark):
    meta = default_meta(3000, seed=42, **RICH)
    a = _rows(spark, meta, 2)
    b = _rows(spark, meta, 7)
    assert a == b
    other = _rows(spark, default_meta(3000, seed=43, **RICH), 2)
    assert other != a
    assert [r[0] for r in a] == list(range(3000))


def test_rows_follow_the_mix_and_the_broker_settings(spark, tmp_path):
    broker = BrokerSettings(transaction_timeout=1.0, transaction_check_interval=0.5,
                            transaction_check_max=4)
    meta = default_meta(4000, seed=3, topics=3, producers=5, rate=1000.0, broker=broker,
                        body_bytes="const:100", local_tx_ms="uniform:1:5", arrival="uniform",
                        mix=parse_mix("stress"))
    generate(spark, meta, tmp_path / "t")
    rows = pq.read_table(tmp_path / "t").to_pylist()
    assert set(rows[0]) == set(TRACE_COLUMNS)
    assert TraceMeta.read(WorkFS(spark), (tmp_path / "t").as_uri()) == meta
    kinds = {k: 0 for k in KINDS}
    for r in rows:
        kinds[r["kind"]] += 1
        assert r["body_bytes"] == 100 and 1 <= r["local_tx_ms"] <= 5
        assert 0 <= r["producer"] < 5 and r["topic"] in ("BenchT0", "BenchT1", "BenchT2")
        assert r["keys"].startswith("key-") and 0 <= int(r["keys"][4:]) < meta.key_space
        assert r["id"] <= r["start_ms"] < r["id"] + 1  # 1000/s: one slot per millisecond
        if r["kind"] in ("commit", "rollback"):
            assert r["first_decision"] == r["expected_outcome"] == r["kind"]
            assert r["check_answers"] == [] and r["expected_checks"] == 0
        elif r["kind"] == "never":
            assert r["first_decision"] == "unknown" and r["check_answers"] == ["unknown"]
            assert r["expected_checks"] == 4 and r["expected_outcome"] == "discard"
        else:
            final = r["kind"].removeprefix("unknown_")
            assert r["first_decision"] == "unknown" and r["expected_outcome"] == final
            assert r["check_answers"][-1] == final
            assert set(r["check_answers"][:-1]) <= {"unknown"}
            assert r["expected_checks"] == len(r["check_answers"]) <= 3
    for kind, share in meta.mix.items():
        assert abs(kinds[kind] / len(rows) - share) < 0.03, (kind, kinds)


def test_a_mix_of_one_kind(spark):
    meta = default_meta(500, mix=parse_mix("never=1"),
                        broker=BrokerSettings(transaction_check_max=1))
    rows = build(spark, meta, 2).collect()
    assert {(r["kind"], r["expected_checks"], r["expected_outcome"]) for r in rows} == {
        ("never", 1, "discard")}


@pytest.mark.parametrize("text,message", [
    ("commit=x", "not a number"), ("bogus=1", "expected KIND=WEIGHT"),
    ("commit=0", "sum to 0"), ("commit=-1", ">= 0"),
])
def test_bad_mix(text, message):
    with pytest.raises(SpecError, match=message):
        parse_mix(text)


@pytest.mark.parametrize("text", ["", "const", "uniform:5:1", "exp:0", "normal:1:2", "const:-1",
                                  "uniform:a:b"])
def test_bad_distribution(text):
    with pytest.raises(SpecError, match="--x"):
        Dist.parse(text, "--x")


def test_cli_refuses_bad_options_before_starting_spark(tmp_path):
    runner = CliRunner()
    for args, message in [
        (["--mix", "commit=1,oops=2"], "expected KIND=WEIGHT"),
        (["--local-tx-ms", "const:900"], "half the transaction timeout"),
        (["--transactions", "0"], "--transactions must be >= 1"),
        (["--check-max", "0"], "transaction_check_max"),
    ]:
        argv = ["bench", "generate", "--transactions", "10", "--out", str(tmp_path / "t"), *args]
        r = runner.invoke(main, argv)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output, (args, r.output)
    assert not (tmp_path / "t").exists()


def test_generate_will_not_overwrite_a_foreign_directory(spark, tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a trace.*refusing to overwrite it"):
        generate(spark, default_meta(10), tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def _starts(spark, n, rate, arrival, seed=5):
    """Start times (s) of a trace, sorted; every start inside the span N / rate."""
    meta = default_meta(n, seed=seed, rate=rate, arrival=arrival)
    starts = sorted(r[0] / 1000 for r in build(spark, meta, 3).select("start_ms").collect())
    assert len(starts) == n and 0 <= starts[0] and starts[-1] < n / rate
    return starts


def _per_bucket(starts, width, buckets):
    counts = [0] * buckets
    for t in starts:
        counts[int(t // width)] += 1
    return counts


def _gap_cv(starts):
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    mean = sum(gaps) / len(gaps)
    return (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean


@pytest.mark.slow
def test_poisson_arrivals_have_exponential_gaps_and_uniform_ones_do_not(spark):
    # 100/s: a 10 ms mean gap, so millisecond starts keep the gaps' shape.
    poisson = _starts(spark, 4000, 100.0, "poisson")
    assert 0.85 < _gap_cv(poisson) < 1.15  # exponential gaps: coefficient of variation 1
    counts = _per_bucket(poisson, 5.0, 8)
    assert all(350 < c < 650 for c in counts), counts  # flat at the mean rate (500 per 5 s)
    assert _gap_cv(_starts(spark, 4000, 100.0, "uniform")) < 0.7  # one start per 10 ms slot


def test_bursts_alternate_between_on_and_off(spark):
    # 1 s at 10x the intensity of the 4 s after it: per period 10/14 of the starts in the burst.
    starts = _starts(spark, 4000, 100.0, "bursts:1:4:10")
    counts = _per_bucket(starts, 1.0, 40)
    on = [c for i, c in enumerate(counts) if i % 5 == 0]
    off = [c for i, c in enumerate(counts) if i % 5 != 0]
    assert min(on) > 3 * max(off), counts
    assert 250 < sum(on) / len(on) < 450 and 20 < sum(off) / len(off) < 60, counts


def test_diurnal_ramps_from_trough_to_peak(spark):
    # One 40 s period over the 40 s span: trough at 0, peak at 20 s, trough again at 40 s.
    starts = _starts(spark, 4000, 100.0, "diurnal:40:0.8")
    counts = _per_bucket(starts, 5.0, 8)
    assert counts[0] < counts[1] < counts[2] < counts[3], counts
    assert counts[7] < counts[6] < counts[5] < counts[4], counts
    assert counts[3] + counts[4] > 4 * (counts[0] + counts[7]), counts


def _top_share(spark, meta, column):
    from pyspark.sql import functions as F

    counts = build(spark, meta, 2).groupBy(column).count()
    return counts.agg(F.max("count")).first()[0] / meta.transactions


@pytest.mark.slow
def test_zipf_skew_concentrates_keys_and_producers(spark):
    shares = [_top_share(spark, default_meta(3000, key_space=1000, key_skew=s), "keys")
              for s in (0.0, 0.8, 1.2)]
    assert shares[0] < 0.01 < shares[1] < shares[2], shares
    # Zipf 1.2 over 1000 keys: the top key weighs 1 / H(1000, 1.2) ~ 0.23.
    assert 0.17 < shares[2] < 0.29, shares
    flat = _top_share(spark, default_meta(3000, producers=16), "producer")
    skewed = _top_share(spark, default_meta(3000, producers=16, producer_skew=1.0), "producer")
    assert flat < 0.1 and 0.25 < skewed < 0.36, (flat, skewed)  # 1 / H(16) ~ 0.30


def test_zipf_ranks_beyond_the_exact_head_follow_the_law():
    """Past the exactly summed head the ranks come from an integral: the share of the ranks
    beyond it still matches the exact sum of their weights."""
    from txbroker.bench.trace.generate import _ZIPF_HEAD, zipf_ranks

    n, s = 4 * _ZIPF_HEAD, 0.7
    weights = [(k + 1) ** -s for k in range(n)]
    expected = sum(weights[_ZIPF_HEAD:]) / sum(weights)
    u = [(i + 0.5) / 200_000 for i in range(200_000)]
    ranks = zipf_ranks(u, n, s)
    assert ranks.min() == 0 and ranks.max() < n
    assert abs((ranks >= _ZIPF_HEAD).mean() - expected) < 0.005, expected
    assert (ranks[1:] >= ranks[:-1]).all()  # an inverse CDF: monotonic in u


def test_messages_span_topics_and_crashes_are_only_undecided(spark):
    meta = default_meta(3000, seed=9, topics=4, mix=parse_mix("stress"), messages="uniform:1:4",
                        crash_fraction=0.5, restart_ms="uniform:100:500")
    rows = build(spark, meta, 3).collect()
    names = set(meta.topic_names())
    multi = 0
    for r in rows:
        assert 1 <= r["messages"] <= 4 and len(r["topics"]) == r["messages"], r
        assert r["topics"][0] == r["topic"] and set(r["topics"]) <= names, r
        multi += len(set(r["topics"])) > 1
        if r["first_decision"] == "unknown":
            assert 100 <= r["restart_ms"] <= 500, r
        else:
            assert not r["crash"] and r["restart_ms"] is None, r
    assert 2.3 < sum(r["messages"] for r in rows) / len(rows) < 2.7
    assert multi > len(rows) / 2
    undecided = [r for r in rows if r["first_decision"] == "unknown"]
    crashed = sum(r["crash"] for r in undecided)
    assert 0.4 < crashed / len(undecided) < 0.6, (crashed, len(undecided))


def test_production_mix_is_the_default():
    mix = default_meta(10).mix
    assert mix == parse_mix("production")
    assert mix["commit"] == pytest.approx(0.88) and mix["never"] == pytest.approx(0.005)
    assert parse_mix("stress")["unknown_commit"] == pytest.approx(0.1)


def test_long_tailed_distributions_are_capped():
    assert Dist.parse("lognormal:5:1", "--x").max == pytest.approx(5 * 2.718281828 ** 3)
    assert Dist.parse("lognormal:5:1:80", "--x").max == 80
    assert Dist.parse("pareto:2:1", "--x").max == pytest.approx(2000)
    assert str(Dist.parse("pareto:2:1.5:40", "--x")) == "pareto:2:1.5:40"


def test_long_tailed_local_times_stay_under_their_cap(spark):
    meta = default_meta(3000, local_tx_ms="pareto:2:1.2:300")
    s = build(spark, meta, 2).selectExpr("min(local_tx_ms)", "max(local_tx_ms)",
                                         "percentile(local_tx_ms, 0.5)").first()
    assert s[0] >= 2 and s[1] == 300 and 2 <= s[2] <= 4  # median 2 x 2^(1/1.2) ~ 3.5


def test_a_version_1_trace_reads_with_the_new_columns(spark, tmp_path):
    import json

    from txbroker.bench.trace.describe import describe
    from txbroker.bench.trace.spec import META_FILE, read_trace

    meta = default_meta(200, arrival="uniform")
    generate(spark, meta, tmp_path / "t")
    v1 = tmp_path / "v1"
    old_columns = ["id", "producer", "topic", "keys", "tags", "body_bytes", "start_ms", "local_tx_ms",
                   "kind", "first_decision", "check_answers", "expected_checks", "expected_outcome"]
    spark.read.parquet(str(tmp_path / "t")).select(*old_columns).write.parquet(str(v1))
    raw = json.loads((tmp_path / "t" / META_FILE).read_text())
    keep = {"transactions", "seed", "topics", "producers", "rate", "mix", "body_bytes",
            "local_tx_ms", "broker"}
    (v1 / META_FILE).write_text(json.dumps({**{k: raw[k] for k in keep}, "version": 1}))
    old = TraceMeta.read(WorkFS(spark), v1.as_uri())
    assert (old.version, old.arrival, old.messages, old.crash_fraction) == (1, "uniform", "const:1", 0)
    assert old.consumer_restarts == [] and old.kafka.transaction_timeout_ms == 10_000
    rows = read_trace(spark, v1.as_uri(), old).collect()
    assert len(rows) == 200 and list(rows[0].asDict()) == list(TRACE_COLUMNS)
    for r in rows:
        assert (r["messages"], r["topics"], r["crash"], r["restart_ms"]) == (1, [r["topic"]], False, None)
    d = describe(spark, v1.as_uri())
    assert (d["version"], d["rows"], d["messages"]["total"], d["crashes"]) == (1, 200, 200, 0)
    assert d["keys"]["top_1pct"] == 2  # a version-1 key space: one key per transaction
    (v1 / META_FILE).write_text(json.dumps({**raw, "version": 3}))
    with pytest.raises(SpecError, match="trace version 3 is not supported"):
        TraceMeta.read(WorkFS(spark), v1.as_uri())


def test_cli_refuses_bad_generator_options_before_starting_spark(tmp_path):
    runner = CliRunner()
    for args, message in [
        (["--arrival", "bursts:1:0:10"], "--arrival: 'bursts:1:0:10': expected poisson"),
        (["--arrival", "weekly"], "expected poisson, uniform"),
        (["--arrival", "diurnal:60:1.5"], "0 <= AMPLITUDE <= 1"),
        (["--key-skew", "-1"], "--producer-skew and --key-skew must be >= 0"),
        (["--key-space", "0"], "--key-space must be >= 1"),
        (["--messages", "uniform:1:5000"], "at most 1000 messages"),
        (["--crash-fraction", "1.5"], "--crash-fraction 1.5: must be between 0 and 1"),
        (["--restart-ms", "pareto:0:1"], "--restart-ms: 'pareto:0:1'"),
        (["--local-tx-ms", "lognormal:100:2"], "half the transaction timeout"),
        (["--consumers", "0"], "--consumers must be >= 1"),
        (["--consumer-restarts", "-1"], "--consumer-restarts must be >= 0"),
        (["--kafka-transaction-timeout", "0"], "--kafka-transaction-timeout must be > 0"),
        (["--mix", "calm"], "or a named mix: production, stress"),
    ]:
        argv = ["bench", "generate", "--transactions", "10", "--out", str(tmp_path / "t"), *args]
        r = runner.invoke(main, argv)
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.count("\n") == 1 and message in r.stderr, (args, r.output)
    assert not (tmp_path / "t").exists()
