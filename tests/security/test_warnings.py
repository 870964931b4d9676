"""The start-up warning of a process listening beyond loopback with open ports: the pure line,
and the real ``txbroker serve`` / ``namesrv`` / ``controller`` in subprocesses bound on
0.0.0.0 port 0 (nothing connects to them but this test, over loopback) or on 127.0.0.1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from txbroker.service.exposure import Listener, exposure_warning, is_loopback

pytestmark = pytest.mark.timeout(120)


def test_the_line_names_each_open_port_once() -> None:
    listeners = [Listener(10911, "remoting", False, False), Listener(9876, "name server", False, None),
                 Listener(9092, "kafka", False, False), Listener(10912, "HA", False, True)]
    assert exposure_warning("0.0.0.0", listeners) == (
        "warning: listening on 0.0.0.0 without TLS on ports 10911 (remoting), 9876 (name server), "
        "9092 (kafka), 10912 (HA); without authentication on ports 10911 (remoting), 9092 (kafka)")
    secured = [Listener(10911, "remoting", True, True), Listener(9092, "kafka", False, True)]
    assert exposure_warning("10.1.2.3", secured) == \
        "warning: listening on 10.1.2.3 without TLS on port 9092 (kafka)"
    assert exposure_warning("", [Listener(1, "controller", True, False)]) == \
        "warning: listening on 0.0.0.0 without authentication on port 1 (controller)"
    assert exposure_warning("0.0.0.0", [Listener(10911, "remoting", True, True)]) is None
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host) and exposure_warning(host, listeners) is None
    for host in ("0.0.0.0", "::", "", "192.168.1.5", "broker.example"):
        assert not is_loopback(host)


def _start(argv: list[str], log: Path, ready: str,
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Run the CLI until its ready line (stdout); stderr goes to ``log``."""
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "txbroker", *argv],
                                stdout=subprocess.PIPE, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith(ready):
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"not ready: {line!r}\n{log.read_text()}")
    return proc, line


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(20)
    if proc.stdout is not None:
        proc.stdout.close()


def _warnings(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("warning:")]


def test_serve_on_every_interface_warns_once_naming_the_ports(broker_process, tmp_path) -> None:
    b = broker_process(listen_host="0.0.0.0", kafka_port=0)
    broker_port = int(b.broker_addr.rsplit(":", 1)[1])
    namesrv_port = int(b.namesrv_addr.rsplit(":", 1)[1])
    kafka_port = int(b.kafka_addr.rsplit(":", 1)[1])
    lines = _warnings(tmp_path / "proc0.log")
    assert lines == [(
        f"warning: listening on 0.0.0.0 without TLS on ports {broker_port} (remoting), "
        f"{namesrv_port} (name server), {kafka_port} (kafka); without authentication on ports "
        f"{broker_port} (remoting), {kafka_port} (kafka)")]


def test_serve_on_loopback_prints_nothing_new(broker_process, tmp_path) -> None:
    broker_process(kafka_port=0)  # 127.0.0.1, the quick start's settings
    log = (tmp_path / "proc0.log").read_text()
    assert _warnings(tmp_path / "proc0.log") == [] and "without TLS" not in log


def test_name_server_and_controller_warn_on_every_interface(tmp_path) -> None:
    proc, line = _start(["namesrv", "--listen-host", "0.0.0.0", "--port", "0"],
                        tmp_path / "ns.log", "txbroker namesrv ready")
    _stop(proc)
    port = re.search(r":(\d+)$", line.strip()).group(1)
    assert _warnings(tmp_path / "ns.log") == [(
        f"warning: listening on 0.0.0.0 without TLS on port {port} (name server); without "
        f"authentication on port {port} (name server)")]

    proc, line = _start(["controller", "--listen-host", "0.0.0.0", "--port", "0",
                         "--data-dir", str(tmp_path / "ctl")],
                        tmp_path / "ctl.log", "txbroker controller ready",
                        env={"TXBROKER_CLUSTER_SECRET": "cluster-secret-1"})
    _stop(proc)
    port = re.search(r":(\d+)$", line.strip()).group(1)
    # With the secret, the controller's requests are authenticated: only TLS is missing.
    assert _warnings(tmp_path / "ctl.log") == [
        f"warning: listening on 0.0.0.0 without TLS on port {port} (controller)"]

    proc, _ = _start(["namesrv", "--port", "0"], tmp_path / "ns-local.log", "txbroker namesrv ready")
    _stop(proc)
    assert _warnings(tmp_path / "ns-local.log") == []
