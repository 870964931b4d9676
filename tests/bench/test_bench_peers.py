"""``bench.peers``: a server whose package is missing is one line naming the package, the
txbroker rows run at a tiny size against real brokers, and (where the packages are installed)
RabbitMQ and NATS are started, driven and stopped by the benchmark itself.  Nothing here is
timed: the figures only have to be ones a run can produce."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txbroker.bench.peer_servers import find_server
from txbroker.bench.peers import BY_KEY, Figures, main, rows_of

TINY = ["--messages", "200", "--producers", "4", "--repeat", "1"]
TXBROKER_CASES = ["txbroker-tx", "txbroker-tx-sync", "txbroker-plain"]


def _peer_processes() -> list[str]:
    """Command lines of live processes a peers run started (its temp dirs and node names)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if b"txbroker-peers-" in cmdline:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _check_rows(rows: list[dict], cases: list[str]) -> None:
    assert [r["case"] for r in rows] == cases
    for r in rows:
        assert r["messages"] == 200 and r["seconds"] > 0 and r["msgs_per_s"] > 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        # Server CPU comes in 10 ms clock ticks, which 200 messages may not fill.
        assert r["server_us_per_msg"] >= 0 and r["client_us_per_msg"] > 0, r


def test_a_missing_server_is_one_line_naming_its_package(tmp_path: Path) -> None:
    """With neither program on PATH, each peer's rows are skipped with one line naming the
    package to install; no traceback, no row, exit 0."""
    out = tmp_path / "peers.json"
    run = subprocess.run(
        [sys.executable, "-m", "txbroker.bench.peers", "--cases", "rabbitmq-tx,nats-ack",
         *TINY, "--json", str(out)],
        env=dict(os.environ, PATH=str(tmp_path)), capture_output=True, text=True, timeout=120,
        check=False)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stdout.splitlines()
    for server, package in (("rabbitmq", "rabbitmq-server"), ("nats", "nats-server")):
        named = [line for line in lines if line.startswith(f"{server}: skipped")]
        line = (f"{server}: skipped: {package} not found on PATH (package {package}: "
                f"apt-get install {package})")
        assert named == [line], run.stdout
    doc = json.loads(out.read_text())
    assert doc["rows"] == [] and len(doc["skipped"]) == 2
    assert doc["machine"]["cores"] >= 1 and doc["date"]


def test_ratios_are_to_the_named_peer_rows_only_when_those_ran() -> None:
    def fig(rate: float) -> Figures:
        return Figures(200, 1.0, rate, 1.0, 2.0, 10.0, 10.0)

    cases = [BY_KEY[k] for k in ("nats-ack", "txbroker-tx", "txbroker-tx-sync")]
    rows = rows_of(cases, {"nats-ack": [fig(1000), fig(3000), fig(2000)],
                           "txbroker-tx": [fig(500)], "txbroker-tx-sync": [fig(100)]})
    by = {r["case"]: r for r in rows}
    assert by["nats-ack"]["msgs_per_s"] == 2000 and by["nats-ack"]["ratio"] is None
    assert (by["txbroker-tx"]["ratio"], by["txbroker-tx"]["ratio_to"]) == (0.25, "nats-ack")
    # RabbitMQ did not run: no ratio rather than a ratio to nothing.
    assert (by["txbroker-tx-sync"]["ratio"], by["txbroker-tx-sync"]["ratio_to"]) == (None, None)


@pytest.mark.slow  # three broker processes
def test_txbroker_rows_at_a_tiny_size(tmp_path: Path, capsys) -> None:
    out = tmp_path / "peers.json"
    doc = main(["--cases", ",".join(TXBROKER_CASES), *TINY, "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    _check_rows(doc["rows"], TXBROKER_CASES)
    assert doc["versions"]["txbroker"] and doc["skipped"] == []
    printed = capsys.readouterr().out
    for case in TXBROKER_CASES:
        assert BY_KEY[case].label in printed
    assert "machine: " in printed and "date: " in printed


@pytest.mark.slow  # a RabbitMQ node boots in seconds
@pytest.mark.skipif(find_server("rabbitmq-server") is None or find_server("nats-server") is None,
                    reason="rabbitmq-server and nats-server are not installed")
def test_peer_servers_are_started_driven_and_stopped(tmp_path: Path) -> None:
    pytest.importorskip("aio_pika")
    pytest.importorskip("nats")
    cases = ["rabbitmq-tx", "nats-ack", "nats-ack-shared", "txbroker-tx-sync"]
    doc = main(["--cases", ",".join(cases), *TINY])
    _check_rows(doc["rows"], cases)
    assert doc["versions"]["rabbitmq"] and doc["versions"]["nats"]
    sync = doc["rows"][-1]
    assert sync["ratio_to"] == "rabbitmq-tx" and sync["ratio"] > 0
    assert _peer_processes() == []


@pytest.mark.slow  # a server start and a bounded load
@pytest.mark.skipif(find_server("nats-server") is None, reason="nats-server is not installed")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_stops_the_server_it_started(signum: int) -> None:
    pytest.importorskip("nats")
    bench = subprocess.Popen(
        [sys.executable, "-m", "txbroker.bench.peers", "--cases", "nats-ack", "--repeat", "1",
         "--messages", "10000000", "--max-seconds", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any("nats-server" in c for c in _peer_processes()):
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # into the load, or still connecting: either way it must unwind
        bench.send_signal(signum)
        _, err = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "python -m txbroker.bench.peers: interrupted; every server it started is stopped"), err
    assert "Traceback" not in err
    assert _peer_processes() == []
