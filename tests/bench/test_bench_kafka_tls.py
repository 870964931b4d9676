"""``bench.kafka --tls`` at a tiny size: both rows run on a plaintext and an enforcing-TLS
``txbroker serve`` (aiokafka over SSL, verifying a throwaway CA), both modes print positive
figures and the TLS cost is judged against the target (the benchmark itself is not timed: met
or not met is not asserted); and the comparison's arithmetic on made-up samples."""

from __future__ import annotations

import json

import pytest

from txbroker.bench.kafka import main
from txbroker.bench.kafka_tls import COST_MAX_PCT, ROWS, summarise, target

TINY = ["--seconds", "0.3", "--max-messages", "300", "--in-flight", "50", "--txn-producers", "2"]


def _sample(row: str, mode: str, tx_per_s: float, round_no: int) -> dict:
    return {"row": row, "mode": mode, "round": round_no, "tx_per_s": tx_per_s,
            "msgs_per_s": tx_per_s * 10, "broker_us_per_tx": 100.0, "client_us_per_tx": 50.0}


def test_the_cost_is_the_median_of_each_rounds_pair_on_the_transaction_row() -> None:
    txn, plain = ROWS[0][0], ROWS[1][0]
    # Per round (plaintext, tls): costs 20 %, 99 %, 30 %: the median is 30 %, whatever the
    # machine did between rounds (round 2 ran five times faster).
    samples = [_sample(txn, "plaintext", v, i) for i, v in enumerate((1000.0, 900.0, 5000.0))]
    samples += [_sample(txn, "tls", v, i) for i, v in enumerate((800.0, 9.0, 3500.0))]
    samples += [_sample(plain, m, 100.0, 0) for m in ("plaintext", "tls")]
    summary = summarise(samples)
    assert [s["row"] for s in summary] == [txn, plain]
    assert summary[0]["plaintext_tx_per_s"] == 1000.0 and summary[0]["tls_tx_per_s"] == 800.0
    assert summary[0]["tls_cost_pct"] == pytest.approx(30.0)
    assert summary[1]["tls_cost_pct"] == pytest.approx(0.0)
    goal = target(summary)
    assert goal["value"] == pytest.approx(30.0) and goal["met"] is False
    assert COST_MAX_PCT == 25.0


@pytest.mark.slow  # two broker processes and four bounded rows: about 10 s
def test_tls_mode_runs_both_modes_and_judges_the_cost(capsys) -> None:
    doc = main([*TINY, "--tls", "--rounds", "1", "--json"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(doc))
    assert sorted((s["row"], s["mode"]) for s in doc["samples"]) == sorted(
        (row, mode) for row, _ in ROWS for mode in ("plaintext", "tls"))
    for s in doc["samples"]:
        assert s["messages"] > 0 and s["tx_per_s"] > 0 and s["client_us_per_tx"] > 0, s
    assert [s["row"] for s in doc["summary"]] == [row for row, _ in ROWS]
    assert doc["target"]["met"] in (True, False)
    main([*TINY, "--tls", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "tls" in out and "plaintext" in out and "TLS cost in % of plaintext tx/s" in out
