"""verify on results built per the contract (multi-message rows, Kafka-style results, faults):
clean results pass, each damage done on purpose is counted where it belongs, and everything the
report needs comes out as aggregates."""

from __future__ import annotations

import pytest
from bench_helpers import read_rows, write_rows
from click.testing import CliRunner
from synthetic import T0_MS, with_messages, write_results

from txbroker.bench.trace.generate import default_meta, generate
from txbroker.bench.trace.verify import HIST_BINS, VIOLATIONS, hist_edges, verify
from txbroker.cli.main import main

N = 400


@pytest.fixture(scope="module")
def traces(spark, tmp_path_factory):
    """A 400-row trace, and a copy whose every third row has three messages over three topics."""
    base = tmp_path_factory.mktemp("verify-traces")
    single = base / "single"
    generate(spark, default_meta(N, seed=3, topics=2, producers=4, rate=400.0), single, partitions=2)
    return single, with_messages(spark, single, base / "multi", 3)


def _commit_ids(trace_dir, messages=None):
    rows, _ = read_rows(trace_dir)
    return [r["id"] for r in rows if r["expected_outcome"] == "commit"
            and (messages is None or r.get("messages", 1) == messages)]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["rocketmq", "kafka"])
def test_faithful_results_verify_clean_with_aggregates_only(spark, traces, tmp_path, protocol):
    _, multi = traces
    res = write_results(spark, multi, tmp_path / protocol, protocol=protocol, broker_cpu_seconds=1.5)
    v = verify(spark, multi, res)
    assert v["violations"] == dict.fromkeys(VIOLATIONS, 0), v["violation_samples"]
    assert v["protocol"] == protocol and v["checks_apply"] == (protocol == "rocketmq")
    rows, _ = read_rows(multi)
    commits = [r for r in rows if r["expected_outcome"] == "commit"]
    assert v["transactions"] == N and v["messages"] == sum(r["messages"] for r in rows)
    assert v["deliveries"] == sum(r["messages"] for r in commits) and v["redeliveries"] == 0
    assert v["committed"] == len(commits)
    assert v["broker_cpu_us_per_tx"] == pytest.approx(1.5e6 / len(commits))
    unknown = [r for r in rows if r["first_decision"] == "unknown"]
    assert v["abandoned"]["n"] == len(unknown) > 0 and v["abandoned"]["unresolved"] == 0
    r = CliRunner().invoke(main, ["bench", "verify", "--trace", str(multi), "--results", str(res),
                                  "--master", "local[2]"])
    assert r.exit_code == 0, r.output
    assert f"{protocol}: {len(commits):,} committed, 0 redeliveries" in r.stdout, r.stdout
    if protocol == "kafka":  # no check-back: no check figures, whatever the trace scripts
        assert "checks: none (Kafka transactions have no check-back" in r.stdout, r.stdout
        assert v["expected_checks"] == 0 and sum(v["checks"].values()) == 0
        # The replacement producer fences the old one after 300 ms; `never` waits for the timeout.
        assert v["abandoned"]["resolution_ms"]["p50"] == pytest.approx(300.0)
        assert v["abandoned"]["resolution_ms"]["max"] == pytest.approx(10_000.0)
        assert v["abandoned"]["resolution_ms"]["p999"] == pytest.approx(10_000.0)
    else:
        assert v["checks"]["expected"] == v["expected_checks"] == sum(r["expected_checks"] for r in rows)
    # Histograms: every latency counted once, in log-spaced bins from 0.1 ms to 100 s.
    hist = v["latency_hist_ms"]["end_to_end_ms"]
    assert hist["edges"] == hist_edges() and len(hist["counts"]) == HIST_BINS
    assert hist["edges"][0] == pytest.approx(0.1) and hist["edges"][-1] == pytest.approx(100_000.0)
    assert sum(hist["counts"]) + hist["under"] + hist["over"] == len(commits)
    res_hist = v["abandoned"]["resolution_hist_ms"]
    assert sum(res_hist["counts"]) == len(unknown)
    # Timeline: buckets of the report's width, counts that add up to the run.
    tl = v["timeline"]
    assert 1 <= len(tl) <= 100
    assert tl[1]["t"] - tl[0]["t"] == pytest.approx(v["timeline_bucket_s"])
    assert sum(b["started"] for b in tl) == N
    assert sum(b["committed"] for b in tl) == sum(b["delivered"] for b in tl) == len(commits)
    assert v["t0_ms"] == T0_MS + min(r["start_ms"] for r in rows)
    assert v["windows"] == [] and v["faults"] == []
    if protocol == "rocketmq":
        assert sum(b["undecided"] for b in v["check_timeline"]) == v["expected_checks"]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["rocketmq", "kafka"])
def test_dropped_or_duplicated_messages_fail_a_redelivery_does_not(spark, traces, tmp_path, protocol):
    """Per (tx, msg): a message of a three-message commit dropped (and so a partial delivery),
    another duplicated at a second offset, a rolled-back message delivered, a message index the
    row does not have; and one received twice at the same offset, which a restarting consumer
    does and which is no violation."""
    _, multi = traces
    res = write_results(spark, multi, tmp_path / protocol, protocol=protocol)
    trace, _ = read_rows(multi)
    triple = [r["id"] for r in trace if r["expected_outcome"] == "commit" and r["messages"] == 3]
    dropped, duplicated, redelivered = triple[:3]
    rolled_back = next(r for r in trace if r["kind"] == "rollback" and r["messages"] == 1)
    deliveries, schema = read_rows(res / "deliveries")
    at = {(d["tx"], d["msg"]): d for d in deliveries}
    deliveries = [d for d in deliveries if (d["tx"], d["msg"]) != (dropped, 1)]
    deliveries.append({**at[duplicated, 2], "queue_offset": 10 ** 9, "recv_ms": at[duplicated, 2]["recv_ms"] + 50})
    deliveries.append({**at[redelivered, 0], "recv_ms": at[redelivered, 0]["recv_ms"] + 900})
    deliveries.append({**at[redelivered, 0], "msg": 5, "queue_offset": 10 ** 9 + 1})
    deliveries.append({**at[duplicated, 0], "tx": rolled_back["id"], "queue_offset": 10 ** 9 + 2})
    write_rows(res / "deliveries", deliveries, schema)

    v = verify(spark, multi, res)
    want = dict.fromkeys(VIOLATIONS, 0)
    want.update(committed_not_delivered=1, partial_delivery=1, delivered_twice=1,
                unknown_delivery=1, aborted_but_delivered=1)
    assert v["violations"] == want, v["violation_samples"]
    assert v["redeliveries"] == 1
    s = v["violation_samples"]
    assert s["committed_not_delivered"] == s["partial_delivery"] == [dropped]
    assert s["delivered_twice"] == [duplicated] and s["unknown_delivery"] == [redelivered]
    assert s["aborted_but_delivered"] == [rolled_back["id"]]


@pytest.mark.slow
def test_windows_count_violations_and_commits_around_each_fault(spark, traces, tmp_path):
    """faults.json beside the results: before the first fault, during each (until_ms, or 10 s
    without one) and after it, by transaction start time."""
    single, _ = traces
    trace, _ = read_rows(single)
    t0 = T0_MS + min(r["start_ms"] for r in trace)
    faults = [{"at_ms": t0 + 300, "action": "kill", "target": "broker-a", "until_ms": t0 + 500},
              {"at_ms": t0 + 700, "action": "partition", "target": "broker-b", "until_ms": None}]
    res = write_results(spark, single, tmp_path / "res", faults=faults)
    during = next(r for r in trace if r["expected_outcome"] == "commit"
                  and 350 <= T0_MS + r["start_ms"] - t0 < 450)
    deliveries, schema = read_rows(res / "deliveries")
    write_rows(res / "deliveries", [d for d in deliveries if d["tx"] != during["id"]], schema)

    v = verify(spark, single, res)
    assert v["violation_total"] == 1 and v["faults"] == sorted(faults, key=lambda f: f["at_ms"])
    w = v["windows"]
    assert [x["name"] for x in w] == ["before the first fault", "during kill broker-a",
                                      "after kill broker-a", "during partition broker-b",
                                      "after partition broker-b"]
    assert [x["violations"] for x in w] == [0, 1, 0, 0, 0]
    assert sum(x["transactions"] for x in w) == N
    assert w[1]["from_ms"] == t0 + 300 and w[1]["to_ms"] == t0 + 500
    assert w[3]["to_ms"] == t0 + 700 + 10_000  # no until_ms: 10 s
    starts = [T0_MS + r["start_ms"] for r in trace]
    assert w[0]["transactions"] == sum(s < t0 + 300 for s in starts)
    committed = sum(r["expected_outcome"] == "commit" and T0_MS + r["start_ms"] < t0 + 300
                    for r in trace)
    assert w[0]["committed"] == committed
    assert w[0]["committed_tx_per_s"] == pytest.approx(committed / 0.3)
    r = CliRunner().invoke(main, ["bench", "verify", "--trace", str(single), "--results", str(res),
                                  "--master", "local[2]"])
    assert r.exit_code == 1, r.output
    assert f"window before the first fault: {w[0]['transactions']:,} started, " \
           f"{committed / 0.3:,.0f} committed tx/s, 0 violations" in r.stdout, r.stdout
    assert "window during kill broker-a:" in r.stdout and ", 1 violations" in r.stdout
