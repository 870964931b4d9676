"""Brokers in one group: a replicating slave, and failover under a controller.

Real brokers, name server and controller on 127.0.0.1 port 0, in-process.  A broker that
"dies" here stops (it unregisters); SIGKILL is what bench.chaos --cluster and the compat
tests do.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cluster import InProcessCluster
from support.consuming import collect
from support.waiting import eventually

from txbroker.bench.chaos.process import free_port
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    SendStatus,
    TransactionListener,
    TransactionProducer,
)
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import EndTransactionRequestHeader
from txbroker.store.results import Fence


def _segments(broker) -> bytes:
    store = broker.store
    return b"".join(bytes(seg.read(0, seg.wrote)) for seg in store.commitlog.segments)


class Listener(TransactionListener):
    """Every fourth local transaction is left unknown; a check-back answers COMMIT."""

    def __init__(self) -> None:
        self.n = 0
        self.checked: list[str] = []

    def execute_local_transaction(self, msg, arg):
        self.n += 1
        return LocalTransactionState.UNKNOW if self.n % 4 == 0 else LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        self.checked.append(msg.transaction_id)
        return LocalTransactionState.COMMIT_MESSAGE


async def test_classic_slave_replicates_syncs_metadata_and_refuses_writes(
        broker_config: BrokerConfig, tmp_path: Path) -> None:
    base = broker_config.replace(metadata_sync_interval=0.2)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        master = await c.broker("broker-a", broker_role="SYNC_MASTER")
        slave = await c.broker("broker-a", broker_id=1)
        assert master.roles.is_master and not slave.roles.is_master
        await eventually(lambda: any(s.connected for s in master.roles.ha_master.slaves()))
        async with Producer("pg", c.namesrv_addr) as producer:
            results = [await producer.send(Message("Repl", b"m%d" % i)) for i in range(30)]
        # SYNC_MASTER with its slave following: acknowledged once the slave has the bytes.
        assert {r.send_status for r in results} == {SendStatus.SEND_OK}
        await eventually(lambda: slave.store.max_physical_offset == master.store.max_physical_offset)
        assert _segments(slave) == _segments(master)
        await eventually(lambda: slave.topics.get("Repl") is not None)
        # A consumer's committed offsets reach the slave by the metadata sync.
        consumer = Consumer("cg", c.namesrv_addr, from_where="first", persist_interval=0.2)
        consumer.subscribe("Repl")
        async with consumer:
            got = {m.body for m in await collect(consumer, 30)}
            assert len(got) == 30
            await consumer.poll(0.5)  # acknowledges what was delivered; persisted within 0.2 s
            await eventually(lambda: sum(slave.store.offsets.get("cg", "Repl", q) or 0
                                         for q in range(4)) == 30, timeout=10)
        # The slave takes no write: a send and an END_TRANSACTION are refused with reasons.
        client = RemotingClient(slave.broker_addr)
        try:
            from txbroker.remoting.headers import SendMessageRequestHeader
            send = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, SendMessageRequestHeader(
                producer_group="pg", topic="Repl", default_topic="TBW102", default_topic_queue_nums=4,
                queue_id=0, sys_flag=0, born_timestamp=0, flag=0, properties="", reconsume_times=0,
                unit_mode=False, batch=False).to_ext_v2(), b"x")
            resp = await client.invoke(send, 5)
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert "slave" in (resp.remark or "")
            end = RemotingCommand.request(RequestCode.END_TRANSACTION, EndTransactionRequestHeader(
                producer_group="pg", tran_state_table_offset=0, commit_log_offset=0,
                commit_or_rollback=8, from_transaction_check=False, msg_id="X",
                transaction_id="X").to_ext())
            resp = await client.invoke(end, 5)
            assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
        finally:
            await client.close()


@pytest.fixture
async def controller(tmp_path: Path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=1.0))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


def _controlled(base: BrokerConfig, ctl: ControllerProcess) -> BrokerConfig:
    return base.replace(controller_addr=ctl.addr, controller_lease=1.0,
                        controller_heartbeat_interval=0.2, metadata_sync_interval=0.2)


async def test_failover_promotes_the_slave_which_resolves_pending_halves_once(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess) -> None:
    base = _controlled(broker_config, controller)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", broker_role="SYNC_MASTER")
        b = await c.broker("broker-a", broker_id=1, broker_role="SYNC_MASTER")
        assert a.roles.is_master and a.roles.epoch == 1 and not b.roles.is_master
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        listener = Listener()
        async with TransactionProducer("pg", c.namesrv_addr, listener=listener) as producer:
            # Checks are slow on purpose: the unknown halves must still be pending at the kill.
            for i in range(12):
                await producer.send_message_in_transaction(Message("Orders", b"o%d" % i))
            await eventually(lambda: b.store.max_physical_offset == a.store.max_physical_offset)
            pending_before = a.tx.pending_count()
            c.brokers.remove(a)
            await a.stop()
            await eventually(lambda: b.roles.is_master, timeout=15)
            assert b.roles.epoch == 2
            # The new master rebuilt the transaction state from the replicated log and checks
            # back what the old master left pending; nothing stays pending.
            assert pending_before <= 3
            await eventually(lambda: b.tx.pending_count() == 0, timeout=15)
            for i in range(4):
                r = await producer.send_message_in_transaction(Message("Orders", b"p%d" % i))
                # A SYNC_MASTER whose slave is gone stores and says so (RocketMQ's status).
                assert r.send_status is SendStatus.SLAVE_NOT_AVAILABLE
            # The producer stays up: a commit it sent one-way may still need its check-back.
            consumer = Consumer("cg", c.namesrv_addr, from_where="first")
            consumer.subscribe("Orders")
            async with consumer:
                bodies = [m.body for m in await collect(consumer, 16, timeout=30)]
                extra = await consumer.poll(1.0)
                assert extra is None, extra
        # Every transaction committed exactly once: none lost, none committed twice.
        assert sorted(bodies) == sorted([b"o%d" % i for i in range(12)] + [b"p%d" % i for i in range(4)])


async def test_returning_master_becomes_a_slave_and_follows(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess) -> None:
    base = _controlled(broker_config, controller)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-a", broker_id=1)
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        async with Producer("pg", c.namesrv_addr) as producer:
            for i in range(10):
                await producer.send(Message("T", b"a%d" % i))
            await eventually(lambda: b.store.max_physical_offset == a.store.max_physical_offset)
            a_dir = a.config.data_dir
            c.brokers.remove(a)
            await a.stop()
            await eventually(lambda: b.roles.is_master, timeout=15)
            for i in range(10):
                await producer.send(Message("T", b"b%d" % i))
        # The old master comes back on its own data: the controller names b, so it follows.
        back = await c.broker("broker-a", data_dir=a_dir)
        await eventually(lambda: not back.roles.is_master and back.roles.ha_slave is not None
                         and back.roles.ha_slave.connected)
        await eventually(lambda: back.store.max_physical_offset == b.store.max_physical_offset)
        assert _segments(back) == _segments(b)
        assert back.roles.name_server_id() == 1  # b registers as 0 and left its id free


async def test_master_cut_off_from_controller_stops_writing_though_its_slave_follows(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess) -> None:
    base = _controlled(broker_config, controller)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-a", broker_id=1)
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        assert a.store.fenced is None
        assert b.roles.ha_slave is not None
        await controller.stop()
        # A master cannot tell a controller that is down from one it is cut off from (which
        # may be promoting a slave): once its lease is not known to hold, writes stop, even
        # with its in-sync slave still following.
        await eventually(lambda: a.store.fenced is Fence.LEASE_NOT_VALID, timeout=10)
        assert any(s.connected for s in a.roles.ha_master.slaves())
        assert a.roles.status()["writes"].startswith("refused: the broker's master lease")


async def test_brokers_started_before_the_controller_still_elect_their_master(
        broker_config: BrokerConfig, tmp_path: Path) -> None:
    port = free_port()
    config = ControllerConfig(listen_host="127.0.0.1", port=port,
                              data_dir=str(tmp_path / "controller"), lease=1.0)
    base = broker_config.replace(controller_addr=f"127.0.0.1:{port}", controller_lease=1.0,
                                 controller_heartbeat_interval=0.2)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-a", broker_id=1)
        assert not a.roles.is_master and not b.roles.is_master  # nobody to ask yet
        async with ControllerProcess(config):
            await eventually(lambda: a.roles.is_master and b.roles.ha_slave is not None
                             and b.roles.ha_slave.connected)
