"""A real :class:`ControllerProcess` on 127.0.0.1 port 0 with a temp data dir, driven over TCP
by :class:`RemotingClient`s standing in for the brokers: registration, the first election,
heartbeats, failover when the master falls silent (with the role-change notification on the
slave's own connection), fencing of the old master, a restart that keeps the epochs, bad
headers refused."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from support.waiting import eventually

from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    BrokerHeartbeatRequestHeader,
    BrokerHeartbeatResponseHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    decode_sync_state_set,
    encode_sync_state_set,
)

LEASE = 0.5
NAME = "broker-a"
TIMEOUT = 3.0


class FakeBroker:
    """The controller-facing side of one broker: its connection, its id and the
    notifications that arrived on that connection."""

    def __init__(self, addr: str, broker_id: int) -> None:
        self.broker_id = broker_id
        self.client = RemotingClient(addr)
        self.notified: list[tuple[NotifyBrokerRoleChangedRequestHeader, frozenset[int]]] = []
        self.client.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._on_notify)
        self.epoch = 0

    def _on_notify(self, cmd: RemotingCommand) -> None:
        header = NotifyBrokerRoleChangedRequestHeader.from_ext(cmd.ext_fields)
        self.notified.append((header, decode_sync_state_set(cmd.body)[0]))

    async def call(self, code: int, header, body: bytes = b"") -> RemotingCommand:
        return await self.client.invoke(RemotingCommand.request(code, header.to_ext(), body),
                                        TIMEOUT)

    async def register(self) -> RegisterBrokerToControllerResponseHeader:
        port = 10911 + 10 * self.broker_id
        resp = await self.call(RequestCode.CONTROLLER_REGISTER_BROKER,
                               RegisterBrokerToControllerRequestHeader(
                                   cluster_name="DefaultCluster", broker_name=NAME,
                                   broker_id=self.broker_id, broker_address=f"127.0.0.1:{port}",
                                   ha_server_addr=f"127.0.0.1:{port + 1}"))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        return RegisterBrokerToControllerResponseHeader.from_ext(resp.ext_fields)

    async def heartbeat(self, max_offset: int = 0) -> RemotingCommand:
        return await self.call(RequestCode.BROKER_HEARTBEAT, BrokerHeartbeatRequestHeader(
            cluster_name="DefaultCluster", broker_addr=f"127.0.0.1:{10911 + 10 * self.broker_id}",
            broker_name=NAME,
            broker_id=self.broker_id, epoch=self.epoch, max_offset=max_offset))

    async def elect(self) -> RemotingCommand:
        return await self.call(RequestCode.CONTROLLER_ELECT_MASTER, ElectMasterRequestHeader(
            cluster_name="DefaultCluster", broker_name=NAME, broker_id=self.broker_id))

    async def replica_info(self) -> tuple[GetReplicaInfoResponseHeader, frozenset[int], int]:
        resp = await self.call(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                               GetReplicaInfoRequestHeader(broker_name=NAME))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        members, epoch = decode_sync_state_set(resp.body)
        return GetReplicaInfoResponseHeader.from_ext(resp.ext_fields), members, epoch


def start_controller(data_dir) -> ControllerProcess:
    return ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                              data_dir=str(data_dir), lease=LEASE,
                                              scan_interval=LEASE / 5))


async def keep_beating(*brokers: FakeBroker) -> None:
    while True:
        for b in brokers:
            await b.heartbeat(max_offset=100)
        await asyncio.sleep(LEASE / 5)


async def test_failover_fencing_and_restart(tmp_path) -> None:
    ctl = start_controller(tmp_path)
    await ctl.start()
    master, slave = FakeBroker(ctl.addr, 0), FakeBroker(ctl.addr, 1)
    beating = None
    try:
        # register both; no master until the configured master asks
        assert (await master.register()).master_broker_id is None
        assert (await slave.register()).master_epoch == 0
        resp = await master.elect()
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        elected = ElectMasterResponseHeader.from_ext(resp.ext_fields)
        assert (elected.master_broker_id, elected.master_epoch) == (0, 1)
        assert (elected.master_address, elected.master_ha_address) == \
            ("127.0.0.1:10911", "127.0.0.1:10912")
        master.epoch = slave.epoch = 1
        # the slave learns its master from the heartbeat answer
        resp = await slave.heartbeat()
        assert resp.code == ResponseCode.SUCCESS
        beat = BrokerHeartbeatResponseHeader.from_ext(resp.ext_fields)
        assert (beat.master_broker_id, beat.master_address) == (0, "127.0.0.1:10911")
        # the master adds the slave to the in-sync set
        resp = await master.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                                 AlterSyncStateSetRequestHeader(broker_name=NAME,
                                                                master_broker_id=0,
                                                                master_epoch=1),
                                 encode_sync_state_set({0, 1}, 1))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert AlterSyncStateSetResponseHeader.from_ext(
            resp.ext_fields).new_sync_state_set_epoch == 2
        # both heartbeat for several leases: nothing changes
        beating = asyncio.create_task(keep_beating(master, slave))
        await asyncio.sleep(LEASE * 3)
        assert (await slave.elect()).code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
        assert (await slave.replica_info())[0].master_epoch == 1
        # the first election was announced to the registered slave too
        assert [(n.master_broker_id, n.master_epoch) for n, _ in slave.notified] == [(0, 1)]
        slave.notified.clear()
        # the master falls silent: the slave is elected and told so on its own connection
        beating.cancel()
        beating = asyncio.create_task(keep_beating(slave))
        await eventually(lambda: slave.notified, msg="no NOTIFY_BROKER_ROLE_CHANGED")
        note, members = slave.notified[-1]
        assert (note.master_broker_id, note.master_epoch, note.master_address) == \
            (1, 2, "127.0.0.1:10921")
        assert note.master_ha_address == "127.0.0.1:10922" and members == {1}
        info, members, set_epoch = await slave.replica_info()
        assert (info.master_broker_id, info.master_epoch, members, set_epoch) == (1, 2, {1}, 3)
        # the old master comes back: its old-epoch heartbeat is fenced and names the new master
        resp = await master.heartbeat()
        assert resp.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
        fenced = BrokerHeartbeatResponseHeader.from_ext(resp.ext_fields)
        assert (fenced.master_broker_id, fenced.master_epoch) == (1, 2)
        assert (await master.register()).master_broker_id == 1
    finally:
        if beating is not None:
            beating.cancel()
        for b in (master, slave):
            await b.client.close()
        await ctl.stop()
    # a restart on the same directory keeps epochs and set
    ctl = start_controller(tmp_path)
    await ctl.start()
    probe = FakeBroker(ctl.addr, 1)
    try:
        info, members, set_epoch = await probe.replica_info()
        assert (info.master_broker_id, info.master_epoch, members, set_epoch) == (1, 2, {1}, 3)
        saved = orjson.loads((tmp_path / "controller.json").read_bytes())
        assert saved["groups"][0]["masterEpoch"] == 2
    finally:
        await probe.client.close()
        await ctl.stop()


async def test_a_controller_cut_off_from_every_broker_changes_no_master(tmp_path) -> None:
    """Every heartbeat stops reaching the controller for several leases (a partition around
    it): nobody can be elected, so nothing changes, no broker is told anything, and at the
    heal the master's heartbeat is answered SUCCESS under the same epoch."""
    master, slave = None, None
    async with start_controller(tmp_path) as ctl:
        master, slave = FakeBroker(ctl.addr, 0), FakeBroker(ctl.addr, 1)
        try:
            await master.register()
            await slave.register()
            assert (await master.elect()).code == ResponseCode.SUCCESS
            master.epoch = slave.epoch = 1
            resp = await master.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                                     AlterSyncStateSetRequestHeader(broker_name=NAME,
                                                                    master_broker_id=0,
                                                                    master_epoch=1),
                                     encode_sync_state_set({0, 1}, 1))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            # The last words before the cut: the slave's, then the master's, so the master's
            # lease ends last (a slave outliving a dead master would rightly be elected; the
            # cut silences both, in whichever order their leases run out on a busy machine).
            assert (await slave.heartbeat()).code == ResponseCode.SUCCESS
            assert (await master.heartbeat()).code == ResponseCode.SUCCESS
            before = await slave.replica_info()
            master.notified.clear()
            slave.notified.clear()
            await asyncio.sleep(LEASE * 4)  # 20 scans with every lease expired
            assert not ctl.state.is_alive(NAME, 0) and not ctl.state.is_alive(NAME, 1)
            assert await slave.replica_info() == before
            assert before[0].master_broker_id == 0 and before[0].master_epoch == 1
            assert master.notified == [] and slave.notified == []
            resp = await master.heartbeat()  # the heal
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert BrokerHeartbeatResponseHeader.from_ext(resp.ext_fields).master_epoch == 1
            assert (await slave.heartbeat()).code == ResponseCode.SUCCESS
        finally:
            for b in (master, slave):
                await b.client.close()


async def test_bad_requests_are_refused_and_the_connection_stays(tmp_path) -> None:
    async with start_controller(tmp_path) as ctl:
        b = FakeBroker(ctl.addr, 0)
        try:
            resp = await b.client.invoke(RemotingCommand.request(
                RequestCode.CONTROLLER_REGISTER_BROKER, {"brokerName": NAME, "brokerId": "x"}),
                TIMEOUT)
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert "clusterName" in resp.remark or "brokerId" in resp.remark
            resp = await b.heartbeat()
            assert resp.code == ResponseCode.CONTROLLER_INVALID_REPLICAS
            assert "not registered" in resp.remark
            await b.register()
            resp = await b.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                                AlterSyncStateSetRequestHeader(broker_name=NAME,
                                                               master_broker_id=0,
                                                               master_epoch=0), b"[1,")
            assert resp.code == ResponseCode.SYSTEM_ERROR and "SyncStateSet" in resp.remark
            assert (await b.elect()).code == ResponseCode.SUCCESS
        finally:
            await b.client.close()


async def test_a_second_controller_on_the_same_directory_is_refused(tmp_path) -> None:
    from txbroker.store.lock import DataDirInUseError

    async with start_controller(tmp_path):
        with pytest.raises(DataDirInUseError):
            await start_controller(tmp_path).start()
