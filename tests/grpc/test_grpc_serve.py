"""``txbroker serve --grpc-port``: the listener's errors are one line naming the address, the
settings it cannot run with are refused at start, and a gRPC producer's transaction survives a
broker SIGKILL (its half is pending again after the restart and a new producer's check answer
commits it)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from txbroker.bench.chaos.process import free_port
from txbroker.client.admin import AdminClient

TXBROKER = str(Path(sys.executable).with_name("txbroker"))


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TXBROKER, "serve", "--data-dir", str(tmp_path / "d"), "--broker-port",
                           "0", "--namesrv-port", "-1", "--segment-size", "1MiB",
                           "--max-message-size", "64KiB", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_grpc_port_in_use_is_one_error_line_naming_it(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        run = serve(tmp_path, "--grpc-port", str(port))
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1, run.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port} (gRPC port)"), lines
    assert not (tmp_path / "d").exists()  # refused before anything was written


@pytest.mark.parametrize(("args", "reason"), [
    (["--workers", "2"], "not with workers > 1"),
    (["--grpc-max-body-size", "1MiB"], "at most max_message_size"),
])
def test_settings_the_endpoint_cannot_run_with_are_refused(tmp_path, args, reason) -> None:
    run = serve(tmp_path, "--grpc-port", "0", *args)
    assert run.returncode == 2, run.stderr
    assert reason in run.stderr and "Traceback" not in run.stderr


def test_the_start_up_block_and_ready_line_name_the_endpoint(broker_process) -> None:
    port = free_port()
    proc = broker_process(grpc_port=port)
    assert proc.grpc_addr == f"127.0.0.1:{port}"
    assert f"grpc             127.0.0.1:{port} (RocketMQ 5.x clients)" in proc.log_tail()


@pytest.mark.slow
async def test_a_grpc_half_survives_a_broker_sigkill_and_is_committed_by_check(
        broker_process, py5) -> None:
    proc = broker_process(grpc_port=0, transaction_timeout=1.0)
    doomed = await py5.start("tx", proc.grpc_addr, "GKill", 1, "--end", "none", "--prefix", "k")
    events = await py5.events_until(doomed, "ended")
    tid = next(e["transaction_id"] for e in events if "half" in e)
    doomed.kill()
    await doomed.wait()
    proc.kill()
    proc.start()  # same data dir, new ports
    async with AdminClient(proc.namesrv_addr) as admin:
        assert (await admin.txn_show(tid))["state"] == "pending"
    await py5("check", proc.grpc_addr, "GKill", 1, "--answer", "commit")
    async with AdminClient(proc.namesrv_addr) as admin:
        row = await admin.txn_show(tid)
    assert (row["state"], row["source"]) == ("committed", "check")
