"""``txbroker status`` across a failover, with broker processes (``txbroker serve``), a
``txbroker namesrv`` subprocess and a controller on 127.0.0.1.

Each broker is named the same way (``name@address``) before and after the failover, with the
role and epoch it reports itself; the group line shows its master, epoch and in-sync set; a
killed member is not listed; the old master, back, is a slave under the id it was started
with and says in its log whom it follows and how much it cut.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import orjson
import pytest
from support.cli_runner import cli_ok, run_cli
from support.cluster import NamesrvSubprocess
from support.waiting import eventually

from txbroker.bench.chaos.process import free_port
from txbroker.client import Message, Producer
from txbroker.controller import ControllerConfig, ControllerProcess


async def _status(namesrv: str) -> tuple[str, dict]:
    ns = ("--namesrv", namesrv)
    return cli_ok(await run_cli("status", *ns)), orjson.loads(cli_ok(await run_cli("status", "--json", *ns)))


@pytest.mark.slow
async def test_status_names_roles_epochs_and_in_sync_set_across_a_failover(
        broker_process, tmp_path: Path) -> None:
    ns = NamesrvSubprocess(tmp_path / "namesrv.log").start()
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=1.0))
    await ctl.start()
    try:
        common = {"namesrv_addr": ns.addr, "namesrv_port": -1, "broker_name": "broker-a",
                  "broker_role": "ASYNC_MASTER", "controller_addr": ctl.addr,
                  "controller_lease": 1.0, "controller_heartbeat_interval": 0.2}
        first, second = [await asyncio.to_thread(
            broker_process, tmp_path / f"a-{i}", broker_id=i, broker_port=free_port(),
            ha_port=free_port(), **common) for i in (0, 1)]
        a0, a1 = f"broker-a@{first.broker_addr}", f"broker-a@{second.broker_addr}"
        out: list[str] = [""]

        async def shows(*lines: str) -> bool:
            out[0] = (await _status(ns.addr))[0]
            return all(line in out[0] for line in lines)

        await eventually(lambda: shows(f"group broker-a: master {a0}, epoch 1, in sync: {a0}, {a1}",
                                       f"broker {a0} (master, epoch 1)",
                                       f"broker {a1} (slave, epoch 1)"),
                         20.0, lambda: out[0])
        async with Producer("pg", ns.addr) as producer:
            for i in range(5):
                await producer.send(Message("T", b"m%d" % i))

        first.kill()
        await eventually(lambda: shows(f"group broker-a: master {a1}, epoch 2, in sync: {a1}"),
                         20.0, lambda: out[0])
        text, docs = await _status(ns.addr)
        # The dead member is listed as down (the name server saw its connection close), not
        # dropped from the group, and not counted as reachable.
        assert re.search(rf"broker {re.escape(a0)}  down since \d\d:\d\d:\d\d "
                         r"\(\d+ s ago: connection closed\)", text), text
        assert "total: 1 of 2 broker(s) reachable in 1 group(s)" in text, text
        assert list(docs) == ["broker-a", a0]
        assert docs[a0]["role"] == "down" and docs[a0]["downReason"] == "connection closed"
        assert abs(docs[a0]["downSince"] / 1000 - time.time()) < 60
        assert docs["broker-a"]["label"] == a1 and docs["broker-a"]["brokerId"] == 1
        assert docs["broker-a"]["epoch"] == 2 and docs["broker-a"]["inSyncReplicas"] == [a1]

        first.start()  # the old master comes back on its data dir and port
        await eventually(lambda: shows(f"broker {a0} (slave, epoch 2)",
                                       f"group broker-a: master {a1}, epoch 2, in sync: {a0}, {a1}"),
                         20.0, lambda: out[0])
        text, docs = await _status(ns.addr)
        back = docs[a0]
        assert (back["role"], back["brokerId"], back["epoch"]) == ("slave", 0, 2)
        assert "(id 1" not in text
        log = first.log_path.read_text()
        assert re.search(rf"now following {re.escape(a1)} \(HA [^)]+\) from offset \d+, "
                         r"truncated \d+ bytes", log), log[-3000:]
    finally:
        ns.stop()
        await ctl.stop()
