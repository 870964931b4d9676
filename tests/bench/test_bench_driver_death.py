"""A bench driver killed with SIGKILL takes its processes with it: the cluster's controller,
name server and brokers (one of them restarted from a thread that has ended since, as a fault
plan restarts a killed master) and the embedded broker all die with the driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from txbroker.bench.chaos.lifeline import dies_with_parent

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("clusters"),
              pytest.mark.skipif(not dies_with_parent(), reason="needs Linux prctl")]

DRIVER = textwrap.dedent("""
    import json, sys, threading, time
    from txbroker.bench.trace.cluster import EmbeddedCluster
    from txbroker.bench.trace.embedded import EmbeddedBroker
    from txbroker.bench.trace.spec import BrokerSettings

    settings = BrokerSettings(transaction_timeout=1.0, transaction_check_interval=0.5,
                              transaction_check_max=2)
    with EmbeddedCluster(1, settings, root=sys.argv[1], kafka=False) as cluster, \\
            EmbeddedBroker(settings) as broker:
        cluster.kill("broker-a-1")
        restarter = threading.Thread(target=cluster.restart, args=("broker-a-1",))
        restarter.start()
        restarter.join()
        pids = {name: p.proc.pid for name, p in cluster.processes().items()}
        pids["embedded"] = broker.proc.pid
        print(json.dumps(pids), flush=True)
        time.sleep(600)
""")


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its new parent to reap it counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_children_die_with_a_killed_driver(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "cluster")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: dict[str, int] = {}
    try:
        line = driver.stdout.readline()  # the cluster starts in seconds; bounded by its own timeouts
        assert line, f"driver printed nothing: {driver.stderr.read()[-3000:]}"
        pids = json.loads(line)
        assert set(pids) == {"controller", "namesrv", "broker-a-0", "broker-a-1", "embedded"}
        time.sleep(0.5)  # the restarting thread ended before the pids were printed
        assert not any(_gone(pid) for pid in pids.values()), pids
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids.values()):
            time.sleep(0.1)
        left = {name: pid for name, pid in pids.items() if not _gone(pid)}
        assert not left, f"still running after the driver's SIGKILL: {left}"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        for pid in pids.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
