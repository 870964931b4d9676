"""``bench.kafka`` at a tiny size: every row (Kafka plain, transactions of 1/10/100 messages,
the read_committed consumer, the RocketMQ-protocol rows) runs against a real ``txbroker serve
--kafka-port 0`` and prints positive figures, and the three targets are judged (the benchmark
itself is not timed: met or not met is not asserted)."""

from __future__ import annotations

import json

import pytest

from txbroker.bench.kafka import main

pytestmark = pytest.mark.slow  # a broker process and six bounded rows: about 10 s

ROWS = ["kafka plain", "kafka txn 1", "kafka txn 10", "kafka txn 100", "kafka read_committed",
        "rocketmq tx", "rocketmq plain"]
TINY = ["--seconds", "0.3", "--max-messages", "400", "--in-flight", "50", "--rmq-producers", "4"]


def test_every_row_has_positive_figures_and_the_targets_are_judged(capsys) -> None:
    doc = main([*TINY, "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(doc))
    assert [r["row"] for r in doc["rows"]] == ROWS
    for r in doc["rows"]:
        assert r["messages"] > 0 and r["seconds"] > 0 and r["msgs_per_s"] > 0, r
        assert r["broker_us_per_msg"] >= 0 and r["client_us_per_msg"] > 0, r  # broker: 10 ms ticks, may be 0
    assert sum(r["broker_us_per_msg"] for r in doc["rows"]) > 0
    by = {r["row"]: r for r in doc["rows"]}
    assert by["kafka txn 100"]["messages"] % 100 == 0
    produced = sum(by[name]["messages"] for name in ROWS[:4])
    assert by["kafka read_committed"]["messages"] == produced  # every committed message, once
    assert [t["met"] in (True, False) for t in doc["targets"]] == [True, True, True]


def test_the_table_names_every_row_and_target(capsys) -> None:
    main(TINY)
    out = capsys.readouterr().out
    for name in ROWS:
        assert name in out
    assert out.count(" met") + out.count("not met") >= 3
    assert "read_committed consumer msgs/s" in out


CLUSTER_ROWS = [f"{setup}: kafka {row}" for setup in ("one broker", "two groups")
                for row in ("plain", "txn 10", "txn 100")]


def test_cluster_rows_and_the_failover_stall(capsys) -> None:
    """``--cluster``: the same rows on one broker and on two broker groups, then a master
    SIGKILLed under load: both producers resume (their longest stall is measured)."""
    doc = main([*TINY, "--cluster", "--json"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(doc))
    assert [r["row"] for r in doc["rows"]] == CLUSTER_ROWS
    for r in doc["rows"]:
        assert r["messages"] > 0 and r["msgs_per_s"] > 0 and r["client_us_per_msg"] > 0, r
    f = doc["failover"]
    assert f["first_ack_after_kill_s"] is not None and f["first_ack_after_kill_s"] > 0, f
    assert f["plain_longest_gap_s"] >= f["first_ack_after_kill_s"] - 0.5, f
    assert f["txn_committed"] > 0 and f["txn_longest_gap_s"] > 0, f
