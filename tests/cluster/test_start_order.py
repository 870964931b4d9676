"""A controller-mode group started from scratch, as the README starts one: broker processes
(``txbroker serve``), a ``txbroker namesrv`` subprocess and a controller on 127.0.0.1.

The name servers must list the master as id 0 and the slave as id 1 from each broker's first
registration, whichever process starts first: a broker that does not know its role yet must
not take another broker's id (the slave's entry would be gone until its next periodic
registration, 30 s by default; here 60 s, so a wrong entry cannot heal by itself in time).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from support.cluster import NamesrvSubprocess, cluster_info
from support.waiting import eventually

from txbroker.bench.chaos.process import free_port
from txbroker.controller import ControllerConfig, ControllerProcess

#: The name server's log line for an address it did not know (its first registration).
FIRST_REGISTRATION = re.compile(r"new broker registered: broker-a (\S+) id (\d+)")


async def _group(namesrv: str) -> dict[int, str]:
    group = (await cluster_info(namesrv)).broker_addr_table.get("broker-a")
    return dict(group.broker_addrs) if group is not None else {}


def _first_registrations(log: Path) -> dict[str, int]:
    """Broker address -> the id it first registered under, as the name server logged it."""
    return {m.group(1): int(m.group(2)) for m in FIRST_REGISTRATION.finditer(log.read_text())}


@pytest.mark.slow
@pytest.mark.parametrize("first", ["master", "slave"])
async def test_each_replica_registers_under_its_own_id_whatever_the_start_order(
        first: str, broker_process, tmp_path: Path) -> None:
    ns = NamesrvSubprocess(tmp_path / "namesrv.log").start()
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=1.0))
    await ctl.start()
    try:
        common = {"namesrv_addr": ns.addr, "namesrv_port": -1, "broker_name": "broker-a",
                  "broker_role": "SYNC_MASTER", "controller_addr": ctl.addr,
                  "controller_lease": 1.0, "controller_heartbeat_interval": 0.2,
                  "register_interval": 60.0}
        procs = {}
        for broker_id in ((0, 1) if first == "master" else (1, 0)):
            # In a thread: the controller on this loop must answer while the broker starts.
            procs[broker_id] = await asyncio.to_thread(
                broker_process, tmp_path / f"a-{broker_id}", broker_id=broker_id,
                ha_port=free_port(), **common)
        expected = {0: procs[0].broker_addr, 1: procs[1].broker_addr}
        seen: list[dict[int, str]] = []

        async def listed() -> bool:
            seen.append(await _group(ns.addr))
            return seen[-1] == expected

        await eventually(listed, 15.0, lambda: f"broker-a listed as {seen[-1:]}, want {expected}")
        # Each broker's first registration already carried its own id.
        assert _first_registrations(ns.log_path) == {addr: i for i, addr in expected.items()}
        for _ in range(5):  # and it stays so
            await asyncio.sleep(0.2)
            assert await _group(ns.addr) == expected
    finally:
        ns.stop()
        await ctl.stop()
