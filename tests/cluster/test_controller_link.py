"""The broker's controller link (``txbroker.cluster.controller_link``) against a real
:class:`ControllerProcess` on 127.0.0.1 port 0, reached through a relay that can lose an
answer after the controller applied the request, or against a listener that accepts and never
answers: the in-sync set converges after a lost ALTER_SYNC_STATE_SET answer, concurrent
time-outs fail as controller errors, and overtaken views are never applied."""

from __future__ import annotations

import asyncio

import pytest
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.cluster.controller_link import (
    ControllerError,
    ControllerLink,
    IdentityTaken,
    MasterInfo,
    ReplicaState,
)
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import (
    BrokerHeartbeatRequestHeader,
    RegisterBrokerToControllerRequestHeader,
)

LEASE = 3.0
NAME = "broker-a"


def link_for(addr: str, on_master=None, *, request_timeout: float = 3.0) -> ControllerLink:
    config = BrokerConfig(broker_name=NAME, broker_id=0, controller_addr=addr,
                          controller_lease=LEASE)
    applied: list[MasterInfo] = []

    async def record(info: MasterInfo) -> None:
        applied.append(info)

    link = ControllerLink(config, broker_addr="127.0.0.1:10911", ha_addr="127.0.0.1:10912",
                          state=lambda: ReplicaState(), on_master=on_master or record,
                          request_timeout=request_timeout)
    link.applied = applied  # type: ignore[attr-defined]
    return link


async def register_slave(ctl_addr: str, broker_id: int) -> RemotingClient:
    """A second replica, registered and heartbeating once (alive for a lease)."""
    client = RemotingClient(ctl_addr)
    addr = f"127.0.0.1:{10911 + 10 * broker_id}"
    for code, header in (
            (RequestCode.CONTROLLER_REGISTER_BROKER, RegisterBrokerToControllerRequestHeader(
                cluster_name="DefaultCluster", broker_name=NAME, broker_id=broker_id,
                broker_address=addr, ha_server_addr=f"127.0.0.1:{10912 + 10 * broker_id}")),
            (RequestCode.BROKER_HEARTBEAT, BrokerHeartbeatRequestHeader(
                cluster_name="DefaultCluster", broker_addr=addr, broker_name=NAME,
                broker_id=broker_id, epoch=1))):
        resp = await client.invoke(RemotingCommand.request(code, header.to_ext()), 3.0)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    return client


async def test_a_lost_alter_answer_does_not_wedge_the_in_sync_set(tmp_path) -> None:
    ctl = ControllerProcess(ControllerConfig(port=0, data_dir=str(tmp_path), lease=LEASE))
    await ctl.start()
    alter_sent = False

    def lose_alter_answers(to_server: bool, chunk: bytes) -> bool:
        """Forward ALTER_SYNC_STATE_SET to the controller, then cut the connection instead of
        forwarding its answer (the controller has applied the change by then)."""
        nonlocal alter_sent
        if to_server:
            alter_sent = alter_sent or b'{"code":%d,' % RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET in chunk
            return False
        if alter_sent and lose:
            alter_sent = False
            return True
        return False

    lose = False
    proxy = await FaultProxy("127.0.0.1", ctl.port, cut_when=lose_alter_answers).start()
    link = link_for(proxy.addr)
    slave = None
    try:
        await link.register()
        first = await link.elect()
        assert (first.master_id, first.master_epoch, first.sync_state_set) == (0, 1, frozenset({0}))
        slave = await register_slave(ctl.addr, 1)

        lose = True
        with pytest.raises(ControllerError, match="no controller answers"):
            await link.alter_sync_state_set({0, 1}, 1)
        lose = False
        applied = ctl.state.replica_info(NAME)
        assert applied.sync_state_set == {0, 1}, "the controller applied the lost request"
        assert link.master.sync_state_set_epoch < applied.sync_state_set_epoch  # stale now

        # Slave 1 falls behind: the set must shrink back to {0}, which is what the link last
        # learned, yet the controller holds {0, 1}; the request goes, is refused for its stale
        # set epoch with the current set, and goes again with that epoch.
        view = await link.alter_sync_state_set({0}, 1)
        assert view.sync_state_set == {0} == ctl.state.replica_info(NAME).sync_state_set
        assert view.sync_state_set_epoch == ctl.state.replica_info(NAME).sync_state_set_epoch
        # It catches up again: the set grows.
        view = await link.alter_sync_state_set({0, 1}, 1)
        assert view.sync_state_set == {0, 1} == ctl.state.replica_info(NAME).sync_state_set
        # A set already known to be the controller's costs no request.
        before = proxy.stats.chunks
        assert (await link.alter_sync_state_set({0, 1}, 1)).sync_state_set == {0, 1}
        assert proxy.stats.chunks == before
        # Set-only changes never troubled the broker's role: one master applied.
        assert [(i.master_id, i.master_epoch) for i in link.applied] == [(None, 0), (0, 1)]
    finally:
        if slave is not None:
            await slave.close()
        await link.close()
        await proxy.close()
        await ctl.stop()


async def test_a_stale_set_epoch_refusal_is_retried_with_the_learned_epoch(tmp_path) -> None:
    ctl = ControllerProcess(ControllerConfig(port=0, data_dir=str(tmp_path), lease=LEASE))
    await ctl.start()
    link = link_for(ctl.addr)
    slave = slave2 = None
    try:
        await link.register()
        await link.elect()
        slave = await register_slave(ctl.addr, 1)
        slave2 = await register_slave(ctl.addr, 2)
        # The set changed at the controller behind the link's back (an answer it never saw).
        ctl.state.alter_sync_state_set(NAME, 0, 1, {0, 1}, 1)
        assert link.master.sync_state_set_epoch == 1
        view = await link.alter_sync_state_set({0, 1, 2}, 1)
        assert view.sync_state_set == {0, 1, 2} == ctl.state.replica_info(NAME).sync_state_set
        assert view.sync_state_set_epoch == 3
    finally:
        for client in (slave, slave2):
            if client is not None:
                await client.close()
        await link.close()
        await ctl.stop()


async def test_concurrent_time_outs_fail_as_controller_errors() -> None:
    """Two requests on the shared connection time out together: each is a ControllerError
    naming the controller, not a crash in the error path."""
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    link = link_for(addr, request_timeout=0.3)
    try:
        results = await asyncio.wait_for(asyncio.gather(
            link.heartbeat(), link.register(), link.elect(), return_exceptions=True), 10)
        for result in results:
            assert isinstance(result, ControllerError), repr(result)
            assert "no controller answers" in str(result) and addr in str(result)
        # The link recovers: a fresh connection is made for the next call.
        with pytest.raises(ControllerError, match="no controller answers"):
            await asyncio.wait_for(link.heartbeat(), 10)
    finally:
        await link.close()
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_views_apply_in_order_and_set_changes_are_kept() -> None:
    link = link_for("127.0.0.1:1")
    v = MasterInfo
    await link._learn(v(0, "a:1", "a:2", 2, 5, frozenset({0})))
    await link._learn(v(0, "a:1", "a:2", 2, 6, frozenset({0, 1})))   # the set grew
    assert link.master.sync_state_set == {0, 1} and link.master.sync_state_set_epoch == 6
    await link._learn(v(0, "a:1", "a:2", 2, 5, frozenset({0})))      # an overtaken answer
    assert link.master.sync_state_set == {0, 1}
    await link._learn(v(1, "b:1", "b:2", 1, 9, frozenset({1})))      # an older master
    assert link.master.master_id == 0
    assert [(i.master_id, i.master_epoch) for i in link.applied] == [(0, 2)]
    await link.close()


@pytest.mark.slow
async def test_a_broker_identity_held_by_a_live_process_is_refused(broker_config,
                                                                   tmp_path) -> None:
    """Two brokers started as broker-a id 0: the second stops at start naming the identity and
    the address holding it; the first stays master.  Its restart (same address) is accepted."""
    ctl = ControllerProcess(ControllerConfig(port=0, data_dir=str(tmp_path / "ctl"), lease=1.0))
    await ctl.start()
    base = broker_config.replace(controller_addr=ctl.addr, controller_lease=1.0,
                                 controller_heartbeat_interval=0.2)
    try:
        async with InProcessCluster(base, tmp_path) as c:
            await c.namesrv()
            a = await c.broker("broker-a")
            assert a.roles.is_master
            with pytest.raises(IdentityTaken) as err:
                await c.broker("broker-a", data_dir=tmp_path / "twin")
            text = str(err.value)
            assert "broker-a id 0" in text and a.broker_addr in text and "\n" not in text
            assert ctl.state.replicas("broker-a")[0][0] == a.broker_addr
            await asyncio.sleep(0.5)
            assert a.roles.is_master and a.store.fenced is None
            assert ctl.state.replica_info("broker-a").master_epoch == 1
            # A heartbeat from another address under the held id renews nothing.
            twin = link_for(ctl.addr)
            with pytest.raises(IdentityTaken):
                await twin.heartbeat()
            assert twin.renewed_at == float("-inf")
            await twin.close()
            # The holder restarts on its own address: accepted, it is master again.
            addr, data_dir = a.broker_addr, a.config.data_dir
            c.brokers.remove(a)
            await a.stop()
            port = int(addr.rsplit(":", 1)[1])
            again = await c.broker("broker-a", data_dir=data_dir, broker_port=port,
                                   ha_port=0)  # its HA port may be anyone's by now
            await eventually(lambda: again.roles.is_master, 10, "the restarted broker is master")
    finally:
        await ctl.stop()
