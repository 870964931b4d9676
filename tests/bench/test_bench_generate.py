"""Trace generation: deterministic for a seed whatever the partitioning, expectations consistent
with the broker settings in the metadata, bad options refused with a clear message."""

from __future__ import annotations

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


def test_same_seed_same_trace_whatever_the_partitioning(spark):
    meta = default_meta(3000, seed=42)
    a = _rows(spark, meta, 2)
    b = _rows(spark, meta, 7)
    assert a == b
    other = _rows(spark, default_meta(3000, seed=43), 2)
    assert other != a
    assert [r[0] for r in a] == list(range(3000))


def test_rows_follow_the_mix_and_the_broker_settings(spark, tmp_path):
    broker = BrokerSettings(transaction_timeout=1.0, transaction_check_interval=0.5,
                            transaction_check_max=4)
    meta = default_meta(4000, seed=3, topics=3, producers=5, rate=1000.0, broker=broker,
                        body_bytes="const:100", local_tx_ms="uniform:1:5")
    generate(spark, meta, tmp_path / "t")
    rows = pq.read_table(tmp_path / "t").to_pylist()
    assert set(rows[0]) == set(TRACE_COLUMNS)
    assert TraceMeta.read(WorkFS(spark), (tmp_path / "t").as_uri()) == meta
    kinds = {k: 0 for k in KINDS}
    for r in rows:
        kinds[r["kind"]] += 1
        assert r["body_bytes"] == 100 and 1 <= r["local_tx_ms"] <= 5
        assert 0 <= r["producer"] < 5 and r["topic"] in ("BenchT0", "BenchT1", "BenchT2")
        assert r["keys"] == f"tx-{r['id']}"
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
