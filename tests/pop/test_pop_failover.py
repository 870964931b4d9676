"""POP state on a failover: the slave holds the POP log, and once promoted it serves POP from
the state it rebuilt (acks kept, in-flight handles valid, no message lost)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.client import Message, Producer
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.service.pop import PopError, PopErrorKind

G = "GID_FAILOVER"


@pytest.fixture
async def controller(tmp_path: Path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=1.0))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


@pytest.mark.slow
async def test_promoted_slave_serves_pop_from_the_replicated_state(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess) -> None:
    base = broker_config.replace(controller_addr=controller.addr, controller_lease=1.0,
                                 controller_heartbeat_interval=0.2, metadata_sync_interval=0.2,
                                 pop_min_invisible_ms=100)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", broker_role="SYNC_MASTER")
        b = await c.broker("broker-a", broker_id=1, broker_role="SYNC_MASTER")
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        async with Producer("pg", c.namesrv_addr) as producer:
            for i in range(4):
                await producer.send(Message("TFail", b"m%d" % i))
        got = await a.pop.pop(G, "TFail", batch_size=4, invisible_ms=60_000)
        handles = {p.message.body: p.handle for p in got}
        assert sorted(handles) == [b"m0", b"m1", b"m2", b"m3"]
        await a.pop.ack(G, handles[b"m0"])
        await a.pop.ack(G, handles[b"m1"])
        handles[b"m2"] = (await a.pop.change_invisible(G, handles[b"m2"], 200)).handle
        await eventually(lambda: b.topics.get("TFail") is not None, msg="topic synced")
        with pytest.raises(PopError) as exc:   # a slave serves no POP
            await b.pop.pop(G, "TFail", invisible_ms=60_000)
        assert exc.value.kind is PopErrorKind.NOT_SERVING
        await eventually(lambda: b.store.max_physical_offset == a.store.max_physical_offset)
        c.brokers.remove(a)
        await a.stop()
        await eventually(lambda: b.roles.is_master, timeout=15)
        with pytest.raises(PopError, match="already acknowledged"):
            await b.pop.ack(G, handles[b"m0"])
        # m2 is visible again: it alone comes back, attempt 2; m3 stays in flight.
        again: list = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            again += await b.pop.pop(G, "TFail", batch_size=4, invisible_ms=60_000, poll_ms=300)
        assert [(p.message.body, p.attempt) for p in again] == [(b"m2", 2)]
        await b.pop.ack(G, again[0].handle)
        await b.pop.ack(G, handles[b"m3"])
        assert b.pop.state.inflight(G) == 0
