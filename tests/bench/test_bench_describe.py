"""``bench describe``: what a trace contains, as figures that match the trace's own rows, and
one error line for a path that is not a trace."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from txbroker.bench.trace.describe import sparkline
from txbroker.bench.trace.generate import default_meta, generate
from txbroker.bench.trace.spec import META_FILE, ConsumerRestart, parse_mix
from txbroker.cli.main import main


@pytest.fixture(autouse=True)
def _shuffle_partitions_kept(spark):
    """The command's session() sets its own shuffle partitions on the shared session: put
    the tests' value back."""
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    yield
    spark.conf.set("spark.sql.shuffle.partitions", partitions)


@pytest.fixture(scope="module")
def trace(spark, tmp_path_factory):
    out = tmp_path_factory.mktemp("describe") / "trace"
    meta = default_meta(2000, seed=4, rate=100.0, arrival="bursts:2:8:10", producers=8,
                        producer_skew=1.0, key_space=300, key_skew=1.0, mix=parse_mix("stress"),
                        messages="uniform:1:3", consumers=3,
                        consumer_restarts=[ConsumerRestart(5000, 0), ConsumerRestart(10000, 1)])
    generate(spark, meta, out)
    return out, pq.read_table(out).to_pylist()


def _top_1pct_share(values, space) -> float:
    counts = sorted(Counter(values).values(), reverse=True)
    top = max(1, -(-space // 100))
    return sum(counts[:top]) / len(values)


def test_describe_json_matches_the_rows(spark, trace):
    out, rows = trace
    r = CliRunner().invoke(main, ["bench", "describe", str(out), "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    d = json.loads(r.stdout)
    starts = [x["start_ms"] for x in rows]
    assert d["rows"] == 2000 and d["version"] == 2
    assert d["span_s"] == (max(starts) - min(starts)) / 1000 and d["scheduled_span_s"] == 20.0
    assert sum(d["arrivals"]["counts"]) == 2000
    assert d["kinds"] == dict(Counter(x["kind"] for x in rows))
    assert d["expected_outcomes"] == dict(Counter(x["expected_outcome"] for x in rows))
    assert d["messages"]["total"] == sum(x["messages"] for x in rows)
    assert d["messages"]["per_transaction"] == {str(k): n for k, n in
                                                Counter(x["messages"] for x in rows).items()}
    assert d["topics"] == dict(Counter(t for x in rows for t in x["topics"]))
    for name, column, space in (("producers", "producer", 8), ("keys", "keys", 300)):
        values = [x[column] for x in rows]
        n = Counter(values).most_common(1)[0][1]
        assert d[name]["distinct"] == len(set(values)), name
        assert d[name]["top_share"] == n / 2000, name
        assert d[name]["top_1pct"] == -(-space // 100), name
        assert d[name]["top_1pct_share"] == pytest.approx(_top_1pct_share(values, space)), name
    assert d["producers"]["top"] == "0" and d["keys"]["top"] == "key-0"  # rank 0 is the hottest
    assert d["local_tx_ms"]["max"] == max(x["local_tx_ms"] for x in rows)
    assert d["local_tx_ms"]["p50"] <= d["local_tx_ms"]["p99"] <= d["local_tx_ms"]["max"]
    assert d["crashes"] == sum(x["crash"] for x in rows) > 0
    assert d["restarts"]["n"] == sum(x["restart_ms"] is not None for x in rows)
    assert d["consumers"] == 3
    assert d["consumer_restarts"] == [{"at_ms": 5000, "consumer": 0, "down_ms": 1000},
                                      {"at_ms": 10000, "consumer": 1, "down_ms": 1000}]
    assert d["kafka"] == {"transaction_timeout_ms": 10000}
    assert d["broker"]["transaction_check_max"] == 3
    # bursts of 2 s in every 10 s: the first buckets of each period hold most starts
    width = d["arrivals"]["bucket_s"]
    per_period = round(10 / width)
    counts = d["arrivals"]["counts"]
    on = sum(c for i, c in enumerate(counts) if i % per_period < round(2 / width))
    assert on > 0.6 * 2000, counts  # 10 x 2 / (10 x 2 + 8) = 71 % of the starts


def test_describe_text_names_every_part(spark, trace):
    out, _ = trace
    r = CliRunner().invoke(main, ["bench", "describe", str(out)])
    assert r.exit_code == 0, (r.output, r.exception)
    text = r.stdout
    lines = text.splitlines()
    for start in ("trace ", "rows: 2,000;", "arrivals per ", "kinds: ", "expected outcomes: ",
                  "messages: ", "topics (messages): ", "producers: 8 of 8 occur", "keys: ",
                  "local_tx_ms: p50 ", "producer crashes: ", "consumers: 3; restarts: consumer 0 at 5 s",
                  "broker: transaction_timeout 1 s", "kafka: transaction timeout 10,000 ms"):
        assert any(line.startswith(start) for line in lines), (start, text)
    assert "arrival bursts:2:8:10" in text and "(skew 1)" in text


def test_sparkline_scales_to_the_largest_bucket():
    assert sparkline([0, 1, 8, 16]) == " ▁▄█"
    assert sparkline([]) == ""


def test_a_path_that_is_not_a_trace_is_one_error_line(tmp_path):
    runner = CliRunner()
    missing = tmp_path / "nope"
    r = runner.invoke(main, ["bench", "describe", str(missing)])
    assert r.exit_code == 1 and r.stderr == f"error: bench describe: no such trace directory: {missing}\n"
    (tmp_path / "other").mkdir()
    r = runner.invoke(main, ["bench", "describe", str(tmp_path / "other")])
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: {tmp_path / 'other'}: not a trace (no {META_FILE}); "
                        "write one with `txbroker bench generate`\n")
