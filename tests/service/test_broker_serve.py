"""``txbroker serve`` as a real subprocess: ready line, graceful SIGTERM, config errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from broker_wire import TIMEOUT, pull, send

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import ResponseCode
from txbroker.store.checkpoint import CheckpointFile

REPO_ROOT = Path(__file__).resolve().parents[2]


def _serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from cli.main import main; main()", "serve", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env,
                          check=False)


async def test_ready_line_traffic_and_graceful_stop(broker_process) -> None:
    proc = broker_process()
    assert proc.broker_addr.startswith("127.0.0.1:") and proc.namesrv_addr != proc.broker_addr
    client = RemotingClient(proc.broker_addr)
    await client.connect()
    try:
        assert (await send(client, "Served", b"hello")).code == ResponseCode.SUCCESS
    finally:
        await client.close()
    assert proc.stop() == 0
    assert CheckpointFile(proc.data_dir).was_clean()
    log = proc.log_text()
    assert "config flush_mode = 'async'" in log  # effective config logged at start
    # A graceful stop leaves the clean-shutdown marker: the restart needs no recovery, and the
    # message is still there.
    proc.restart()
    client = RemotingClient(proc.broker_addr)
    await client.connect()
    try:
        _, msgs = await pull(client, "G", "Served", 0, 0)
        assert [m.body for m in msgs] == [b"hello"]
    finally:
        await client.close()
    assert proc.stop() == 0


async def test_sigkill_then_restart_keeps_acknowledged_sync_messages(broker_process) -> None:
    proc = broker_process(flush_mode="sync")
    client = RemotingClient(proc.broker_addr)
    await client.connect()
    try:
        for i in range(20):
            assert (await send(client, "Durable", b"m%d" % i)).code == ResponseCode.SUCCESS
    finally:
        await client.close()
    proc.kill()
    assert not CheckpointFile(proc.data_dir).was_clean()  # the abort marker stayed behind
    proc.start()
    client = RemotingClient(proc.broker_addr)
    await client.connect()
    try:
        _, msgs = await pull(client, "G", "Durable", 0, 0, timeout=TIMEOUT)
        assert [m.body for m in msgs] == [b"m%d" % i for i in range(20)]
    finally:
        await client.close()


def test_invalid_config_exits_2_with_one_clear_line(tmp_path) -> None:
    res = _serve("--broker-port", "70000", "--data-dir", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == \
        "error: broker_port=70000: must be a port number 0..65535"
    assert "Traceback" not in res.stderr
    res = _serve("--flush-mode", "sometimes", "--data-dir", str(tmp_path))
    assert res.returncode == 2 and "flush_mode" in res.stderr and "Traceback" not in res.stderr
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[broker]\nno_such_setting = 1\n")
    res = _serve("--config", str(bad_toml))
    assert res.returncode == 2 and "no_such_setting" in res.stderr and "Traceback" not in res.stderr


async def test_toml_and_environment_feed_the_config(tmp_path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('[broker]\nbroker_name = "from-toml"\ndefault_queue_nums = 2\n')
    env = {**os.environ, "TXBROKER_CLUSTER_NAME": "EnvCluster"}
    cmd = [sys.executable, "-c", "from cli.main import main; main()", "serve", "--config", str(toml),
           "--broker-port", "0", "--namesrv-port", "-1", "--data-dir", str(tmp_path / "d")]
    p = await asyncio.create_subprocess_exec(*cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, env=env)
    try:
        line = await asyncio.wait_for(p.stdout.readline(), 30)
        assert line.startswith(b"txbroker ready broker=127.0.0.1:")
        broker_addr = line.split()[2].split(b"=")[1].decode()
        namesrv_addr = line.split()[3].split(b"=")[1].decode()
        assert namesrv_addr == broker_addr  # separate name-server port off: the broker answers
        client = RemotingClient(broker_addr)
        await client.connect()
        try:
            resp = await send(client, "Two", b"x", queue_id=1)
            assert resp.code == ResponseCode.SUCCESS
            resp = await send(client, "Two", b"x", queue_id=2)
            assert resp.code == ResponseCode.SYSTEM_ERROR  # 2 queues from the TOML file
        finally:
            await client.close()
    finally:
        if p.returncode is None:
            p.terminate()
        _, err = await asyncio.wait_for(p.communicate(), 20)
    assert p.returncode == 0
    assert b"config broker_name = 'from-toml'" in err
    assert b"config cluster_name = 'EnvCluster'" in err
