"""``bench.grpc`` at a tiny size: the unmodified RocketMQ 5.x client and the txbroker SDK load a
real ``txbroker serve --grpc-port 0`` in load processes, and the report (``--json`` and the
table) has every row with sane figures: every message a load process stored is in its topic,
the consumers consume the backlog once (POP) or at least once (pull), the medians and ratios
are those of the passes, and the driver never loads a gRPC stub."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # brokers and rows of load processes: about 35 s in all

ROWS = [("grpc", "send"), ("remoting", "send"), ("grpc", "tx"), ("remoting", "tx"),
        ("grpc", "consume"), ("remoting", "consume"), ("grpc", "timer"), ("remoting", "timer")]
MAX_SENDS = 300
BACKLOG = 200
TINY = ["--seconds", "1", "--processes", "2", "--senders", "2", "--max-sends", str(MAX_SENDS),
        "--backlog", str(BACKLOG), "--timer-rate", "200", "--delay", "0.5", "--repeat", "2"]


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txbroker.bench.grpc", *args],
                          check=False, capture_output=True, text=True, timeout=timeout)


def test_every_row_has_sane_figures_and_every_stored_message_is_there() -> None:
    done = bench(*TINY, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["client"] == "rocketmq-python-client 5.1.2" and doc["repeat"] == 2
    assert [(r["path"], r["row"]) for r in doc["rows"]] == ROWS
    assert doc["failed"] == []
    # Odd passes run the rows in reverse, so that no row always runs first.
    assert [[(r["path"], r["row"]) for r in runs] for runs in doc["passes"]] == [ROWS, ROWS[::-1]]
    for runs in doc["passes"]:
        for r in runs:
            assert r["errors"] == 0, r
            if r["row"] == "consume":
                # Drained within the window: POP delivers each message once (the warm-up
                # receive's message is not counted), the SDK's pull at least once.
                assert r["expected"] == BACKLOG and r["messages"] <= r["found"], r
                assert r["found"] == BACKLOG if r["path"] == "grpc" else r["found"] >= BACKLOG, r
            else:
                assert 0 < r["messages"] <= 2 * MAX_SENDS, r
                assert r["found"] == r["expected"] == r["messages"] + 2, r  # + two warm-up sends
            if r["row"] == "timer":  # every timer read back, none long before or after its time
                assert -50 < r["lateness_p50_ms"] <= r["lateness_p99_ms"] < 30_000, r
                assert r["msgs_per_s"] <= 200 * 1.5, r  # paced at the asked rate
            else:
                assert r["lateness_p50_ms"] == r["lateness_p99_ms"] == 0, r
            assert r["seconds"] > 0 and r["msgs_per_s"] > 0 and r["client_us_per_msg"] > 0, r
            assert 0 < r["p50_ms"] <= r["p99_ms"] < 10_000, r
            assert r["broker_us_per_msg"] >= 0, r  # 10 ms ticks: a tiny row may read 0
    assert sum(r["broker_us_per_msg"] for runs in doc["passes"] for r in runs) > 0
    for median in doc["rows"]:
        runs = [r for p in doc["passes"] for r in p if (r["path"], r["row"]) == (median["path"], median["row"])]
        assert median["msgs_per_s"] == statistics.median(r["msgs_per_s"] for r in runs)
    for ratio in doc["ratios"]:
        pairs = [{r["path"]: r for r in p if r["row"] == ratio["row"]} for p in doc["passes"]]
        expect = statistics.median(p["grpc"]["msgs_per_s"] / p["remoting"]["msgs_per_s"] for p in pairs)
        assert ratio["msgs_per_s"] == pytest.approx(expect) and ratio["msgs_per_s"] > 0


def test_the_table_names_every_row_and_both_ratios() -> None:
    done = bench("--seconds", "0.3", "--processes", "1", "--senders", "1", "--max-sends", "50",
                 "--backlog", "50", "--repeat", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    for path, row in ROWS:
        assert f"{path} {row}" in done.stdout
    for row in ("send", "tx", "consume", "timer"):
        assert f"grpc {row} / remoting {row}" in done.stdout
    assert "late p99 ms" in done.stdout and "timers/s asked" in done.stdout


def test_rows_runs_only_the_rows_asked_for() -> None:
    done = bench(*TINY[:-1], "1", "--rows", "consume", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert [(r["path"], r["row"]) for r in doc["rows"]] == ROWS[4:6]
    assert [r["row"] for r in doc["ratios"]] == ["consume"]


def test_the_driver_loads_neither_the_5x_client_nor_the_broker_stubs() -> None:
    """Their protobuf names are the same: one process cannot hold both, so the driver holds
    neither (the broker and the load processes do)."""
    probe = ("import sys, txbroker.bench.grpc; "
             "print([m for m in sys.modules if m.startswith(('rocketmq', 'txbroker.remoting.grpc', "
             "'txbroker.service.grpc', 'google.protobuf'))])")
    out = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out


@pytest.mark.parametrize(("flag", "value"), [
    ("--processes", "0"), ("--senders", "0"), ("--repeat", "0"), ("--seconds", "0"),
    ("--backlog", "0"), ("--timer-rate", "0"), ("--delay", "-1"), ("--rows", "send,pop")])
def test_a_bad_option_is_one_error_line(flag: str, value: str) -> None:
    done = bench(flag, value, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: python -m txbroker.bench.grpc: argument {flag}: {value}: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _session(sid: int) -> list[str]:
    """Command lines of the live processes of session ``sid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(cmd)
    return out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_stops_its_broker_and_load_processes(signum: int) -> None:
    bench = subprocess.Popen([sys.executable, "-m", "txbroker.bench.grpc", "--seconds", "60",
                              "--rows", "send"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any("txbroker.bench.grpc_load" in c for c in _session(bench.pid)):
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # starting its client, or in the window: either way it must unwind
        os.kill(bench.pid, signum)
        _, err = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "python -m txbroker.bench.grpc: interrupted; the broker and load processes it started "
        "are stopped"), err
    assert "Traceback" not in err
    assert _session(bench.pid) == []


def test_a_row_fails_its_check_when_the_topic_or_the_consumer_disagrees() -> None:
    """What puts a row under "check failed" and makes the exit status 1 (``Run.problem``)."""
    from txbroker.bench.grpc import Run

    def run(row: str, expected: int, found: int, errors: int = 0) -> Run:
        return Run(path="grpc", row=row, messages=found, errors=errors, seconds=1.0,
                   msgs_per_s=1.0, p50_ms=1.0, p99_ms=1.0, broker_us_per_msg=1.0,
                   client_us_per_msg=1.0, expected=expected, found=found)

    assert run("send", 10, 10).problem() is None
    assert run("send", 10, 9).problem() == "9 in the topic of 10 stored"
    assert run("timer", 10, 11).problem() == "11 in the topic of 10 stored"
    assert run("tx", 10, 10, errors=2).problem() == "2 calls failed"
    assert run("consume", 100, 40).problem() is None  # the window ended before the backlog did
    assert run("consume", 100, 101).problem() == "101 consumed of a backlog of 100"  # one twice
    assert run("consume", 100, 0).problem() == "0 consumed of a backlog of 100"
