"""``txbroker controller`` as a real subprocess: the ready line, a request answered, a clean
stop on SIGTERM, one error line for a port in use."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import GetReplicaInfoRequestHeader

CLI = [sys.executable, "-P", "-m", "txbroker", "controller"]


async def test_ready_line_answers_and_stops_cleanly(tmp_path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--port", "0", "--data-dir", str(tmp_path / "ctl"), "--lease", "0.5",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line.startswith("txbroker controller ready addr=127.0.0.1:"), line
        client = RemotingClient(line.split("addr=", 1)[1])
        try:
            resp = await client.invoke(RemotingCommand.request(
                RequestCode.CONTROLLER_GET_REPLICA_INFO,
                GetReplicaInfoRequestHeader(broker_name="broker-a").to_ext()), 3.0)
        finally:
            await client.close()
        assert resp.code == ResponseCode.CONTROLLER_INVALID_REPLICAS
        assert "broker-a" in resp.remark
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_port_in_use_is_one_error_line_naming_the_address(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([*CLI, "--port", str(port), "--data-dir", str(tmp_path / "ctl")],
                              check=False, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "controller port" in lines[0]
    assert done.stdout == ""
    assert not (tmp_path / "ctl").exists()
