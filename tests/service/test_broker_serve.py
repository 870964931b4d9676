"""``txbroker serve`` as a real subprocess: ready line, graceful SIGTERM, config errors."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
from broker_wire import TIMEOUT, pull, send

from txbroker.config import BrokerConfig, load_config
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import ResponseCode
from txbroker.store.checkpoint import CheckpointFile

REPO_ROOT = Path(__file__).resolve().parents[2]


def _serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "txbroker", "serve", *args],
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
    log = proc.log_tail()
    # One start-up block, not a line per setting; a fresh directory is not an unclean stop.
    assert "  store            new data directory\n" in log
    assert f"  data dir         {proc.data_dir}\n" in log
    assert "  flush            async: flushed every 0.05 s\n" in log
    assert ("  commitlog        1 MiB segment files, preallocated in full: 1 MiB of disk from start "
            "(the next segment is kept ready), 2 MiB from the first message on\n"
            "                   (change with --segment-size / TXBROKER_SEGMENT_SIZE, e.g. 64MiB; sizing "
            "for production: docs/reliability.md#disk-use)\n") in log
    assert "clean=False" not in log and "config flush_mode" not in log
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
    assert "  store            clean restart: commitlog ends at offset " in proc.log_tail()


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
    assert re.search(r"  store            recovered after a crash: \d+ records, \d+ bytes checked, "
                     r"0 cut in [\d.]+ s", proc.log_tail())


def test_invalid_config_exits_2_with_one_clear_line(tmp_path) -> None:
    res = _serve("--broker-port", "70000", "--data-dir", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == \
        "error: broker_port=70000: must be a port number 0..65535"
    assert "Traceback" not in res.stderr
    res = _serve("--flush-mode", "sometimes", "--data-dir", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.splitlines() == ["error: flush_mode='sometimes': must be 'async' or 'sync'"]
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[broker]\nno_such_setting = 1\n")
    res = _serve("--config", str(bad_toml))
    assert res.returncode == 2 and "no_such_setting" in res.stderr and "Traceback" not in res.stderr


async def test_toml_and_environment_feed_the_config(tmp_path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('[broker]\nbroker_name = "from-toml"\ndefault_queue_nums = 2\n')
    env = {**os.environ, "TXBROKER_CLUSTER_NAME": "EnvCluster"}
    cmd = [sys.executable, "-P", "-m", "txbroker", "serve", "--config", str(toml),
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
    assert b"broker from-toml (cluster EnvCluster) started" in err


async def test_second_broker_on_a_data_dir_in_use_refuses_and_nothing_is_lost(broker_process) -> None:
    """Two brokers on one directory used to start both; the second's clean stop then made the
    first's crash recovery trust a stale checkpoint.  Now the second refuses, touching nothing."""
    first = broker_process()
    client = RemotingClient(first.broker_addr)
    await client.connect()
    try:
        for i in range(8):
            assert (await send(client, "Kept", b"k%d" % i)).code == ResponseCode.SUCCESS
    finally:
        await client.close()
    with pytest.raises(RuntimeError) as refused:
        broker_process(data_dir=first.data_dir)  # other (ephemeral) ports, same directory
    refusal = (f"error: data directory {first.data_dir} is in use by another broker "
               f"(pid {first.pid}); stop it or use another --data-dir")
    # The helper's error is its first line, then the process's whole stderr: that one line.
    assert str(refused.value).splitlines() == ["broker exited with 1 before ready", refusal]
    assert not CheckpointFile(first.data_dir).was_clean()  # the first's abort marker is intact
    first.kill()
    first.start()
    client = RemotingClient(first.broker_addr)
    await client.connect()
    try:
        _, msgs = await pull(client, "G", "Kept", 0, 0, timeout=TIMEOUT)
        _, more = await pull(client, "G", "Kept", 1, 0, timeout=TIMEOUT)
        assert sorted(m.body for m in msgs + more) == [b"k%d" % i for i in range(8)]
    finally:
        await client.close()


@pytest.mark.parametrize("what, option", [("broker port", "--broker-port"),
                                          ("name-server port", "--namesrv-port"),
                                          ("metrics port", "--metrics-port")])
def test_port_clash_names_the_listener_and_creates_nothing(tmp_path, what, option) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        ports = {"--broker-port": "0", "--namesrv-port": "0", "--metrics-port": "0", option: str(port)}
        data = tmp_path / "data"
        res = _serve("--data-dir", str(data), *[x for kv in ports.items() for x in kv])
    finally:
        taken.close()
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port} ({what}): address already in use"]
    assert not data.exists()


def test_print_config_prints_the_effective_settings_and_touches_nothing(tmp_path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "TXBROKER_FLUSH_MODE": "sync"}
    res = _serve("--print-config", "--data-dir", str(data), "--broker-port", "1234",
                 "--no-auto-create-topic", env=env)
    assert res.returncode == 0 and res.stderr == ""
    printed = tmp_path / "printed.toml"
    printed.write_text(res.stdout)
    assert tomllib.loads(res.stdout)["broker"]["segment_size"] == 1024 ** 3
    assert load_config(None, {}, printed) == BrokerConfig(
        data_dir=str(data), broker_port=1234, flush_mode="sync", auto_create_topic=False)
    assert not data.exists()


def test_help_shows_units_choices_and_real_defaults() -> None:
    res = _serve("--help")
    assert res.returncode == 0
    entries: dict[str, str] = {}  # "--flag" -> its whole help entry, unwrapped
    flag = ""
    for line in res.stdout.split("Options:", 1)[1].splitlines():
        if line.startswith("  -"):
            flag = line.split()[0]
            entries[flag] = line.strip()
        elif flag:
            entries[flag] += " " + line.strip()
    text = " ".join(entries.values())
    assert "VALUE" not in text and "None" not in text
    for f in fields(BrokerConfig):
        entry = entries.get("--" + f.name.replace("_", "-"))
        assert entry is not None, f"no option for {f.name}"
        assert re.search(r"\[default: [^\]]+\]$", entry), entry
    assert entries["--flush-mode"].startswith("--flush-mode [async|sync] ")
    assert entries["--auto-create-topic"].startswith("--auto-create-topic / --no-auto-create-topic")
    assert entries["--auto-create-topic"].endswith("[default: on]")
    assert entries["--segment-size"].startswith("--segment-size BYTES ")
    assert entries["--segment-size"].endswith("[default: 1073741824 (1 GiB)]")
    assert entries["--transaction-check-interval"].startswith("--transaction-check-interval SECONDS ")
    assert entries["--transaction-check-interval"].endswith("[default: 60]")
    assert entries["--metrics-port"].endswith("[default: -1 (off)]")


async def test_a_data_dir_keeps_its_segment_size(broker_process) -> None:
    """A quick-start data dir (small segments) opened later with another --segment-size used to
    grow its files in place, misplacing every later record.  Now the broker refuses in one line
    naming both sizes, nothing in the directory changes, and the original size still opens."""
    first = broker_process(segment_size="512KiB")  # the unit form, as the README writes it
    client = RemotingClient(first.broker_addr)
    await client.connect()
    try:
        assert (await send(client, "Sized", b"kept")).code == ResponseCode.SUCCESS
    finally:
        await client.close()
    assert first.stop() == 0
    segments = sorted((first.data_dir / "commitlog").glob("0" * 20))
    assert [p.stat().st_size for p in segments] == [512 * 1024]
    with pytest.raises(RuntimeError) as refused:
        broker_process(data_dir=first.data_dir, segment_size=1024 * 1024)
    assert str(refused.value).splitlines()[1:] == [
        (f"error: data dir {first.data_dir} holds 512 KiB commitlog segments, --segment-size is "
         f"1 MiB: a data dir keeps the segment size it was created with; start with "
         f"--segment-size 524288 or use another --data-dir")]
    assert [p.stat().st_size for p in segments] == [512 * 1024]
    again = broker_process(data_dir=first.data_dir, segment_size=524288)
    client = RemotingClient(again.broker_addr)
    await client.connect()
    try:
        _, msgs = await pull(client, "G", "Sized", 0, 0, timeout=TIMEOUT)
        assert [m.body for m in msgs] == [b"kept"]
    finally:
        await client.close()
