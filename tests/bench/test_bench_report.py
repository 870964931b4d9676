"""``bench report`` of two protocols side by side, from ``verify.json`` alone: the results'
Parquet is removed before the report runs, so nothing per transaction can reach the driver."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from bench_helpers import read_rows
from click.testing import CliRunner
from synthetic import T0_MS, with_messages, write_results

from txbroker.bench.trace.generate import default_meta, generate
from txbroker.bench.trace.report import FILES
from txbroker.bench.trace.verify import VIOLATIONS, verify
from txbroker.cli.main import main

N = 600
#: tab:red, the colour of the fault marks.
FAULT_RGB = np.array([0xD6, 0x27, 0x28]) / 255.0


@pytest.fixture(scope="module")
def verified(spark, tmp_path_factory):
    """A RocketMQ and a Kafka results directory of the same trace, verified, one master kill
    during both, then stripped of their Parquet."""
    base = tmp_path_factory.mktemp("report")
    single = base / "single"
    generate(spark, default_meta(N, seed=5, topics=2, producers=4, rate=300.0), single, partitions=2)
    trace = with_messages(spark, single, base / "trace", 2)
    t0 = T0_MS + min(r["start_ms"] for r in read_rows(trace)[0])
    kill = [{"at_ms": t0 + 800, "action": "kill", "target": "broker-a", "until_ms": t0 + 1300}]
    dirs = []
    for protocol in ("rocketmq", "kafka"):
        res = write_results(spark, trace, base / protocol, protocol=protocol, faults=kill)
        v = verify(spark, trace, res)
        assert v["violation_total"] == 0, v["violation_samples"]
        shutil.rmtree(res / "transactions")
        shutil.rmtree(res / "deliveries")
        dirs.append(res)
    return dirs


def _pixels(path):
    from matplotlib.image import imread

    return imread(path)[..., :3]


def _fault_ink(pixels) -> int:
    return int(np.all(np.abs(pixels - FAULT_RGB) < 0.03, axis=-1).sum())


@pytest.mark.slow
def test_two_protocols_side_by_side_from_verify_json_only(spark, verified, tmp_path):
    rocketmq, kafka = verified
    out = tmp_path / "report"
    r = CliRunner().invoke(main, ["bench", "report", "--results", str(rocketmq),
                                  "--results", str(kafka), "--out", str(out), "--master", "local[2]"])
    assert r.exit_code == 0, r.output
    for name in FILES[1:]:
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        pixels = _pixels(path)
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 800, (name, pixels.shape)
        ink = np.any(pixels < 0.9, axis=-1).mean()
        colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
        assert ink > 0.02 and colours > 20, (name, ink, colours)
    # Fault marks on every time plot (two panels each for throughput and latency over time).
    for name in ("throughput.png", "latency_over_time.png", "checks.png"):
        assert _fault_ink(_pixels(out / name)) > 100, name
    # The CDFs of both designs share one axis: blue (RocketMQ) and orange (Kafka) lines.
    cdf = _pixels(out / "latency_cdf.png")
    for rgb in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        assert np.all(np.abs(cdf - np.array(rgb) / 255.0) < 0.03, axis=-1).sum() > 200, rgb

    md = (out / "report.md").read_text()
    assert "| figure | rocketmq | kafka |" in md
    assert "**PASS** rocketmq" in md and "**PASS** kafka" in md
    lines = md.splitlines()
    top = lines.index("| figure | rocketmq | kafka |")
    summary = lines[top:lines.index("", top)]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in summary}
    for figure in ("committed tx/s", "end to end p50 / p99 / p99.9 (ms)",
                   "broker CPU per committed transaction (µs)",
                   "abandoned until it stops mattering p50 / p99 (ms)",
                   "redeliveries (same offset again)", *VIOLATIONS):
        assert figure in rows, figure
        assert rows[figure].count(" | ") == 2, rows[figure]  # one column per protocol
    assert rows["missing_checks"] == "| missing_checks | 0 | n/a¹ |"
    assert "check figures apply to RocketMQ only" in md
    assert "| during kill broker-a | 0.8 | 1.3 |" in md
    for name in FILES[1:]:
        assert f"]({name})" in md, name


@pytest.mark.slow
def test_report_refuses_three_results_and_a_dir_without_verify_json(spark, verified, tmp_path):
    rocketmq, kafka = verified
    r = CliRunner().invoke(main, ["bench", "report", "--results", str(rocketmq), "--results",
                                  str(kafka), "--results", str(kafka), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "at most two results directories" in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "report", "--results", str(tmp_path),
                                  "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no verify.json" in r.output and str(tmp_path) in r.output, r.output
    assert "Traceback" not in r.output
