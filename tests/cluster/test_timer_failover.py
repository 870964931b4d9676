"""Timer messages across a master failover under a controller (in-process brokers, real
sockets): a slave indexes nothing and delivers nothing; once promoted it rebuilds the pending
timers from the replicated log and delivers them at their time, a recall made on the old master
stays a recall, and a committed transactional timer is delivered while a rolled-back one is not."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.cluster import InProcessCluster
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import RecallMessageRequestHeader

pytestmark = pytest.mark.slow


class _Fixed(TransactionListener):
    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, msg, arg):
        return self.state

    def check_local_transaction(self, msg):
        return self.state


@pytest.fixture
async def controller(tmp_path: Path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=1.0))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


async def test_promoted_slave_delivers_the_old_masters_timers(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess) -> None:
    base = broker_config.replace(controller_addr=controller.addr, controller_lease=1.0,
                                 controller_heartbeat_interval=0.2, metadata_sync_interval=0.2)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", broker_role="SYNC_MASTER")
        b = await c.broker("broker-a", broker_id=1, broker_role="SYNC_MASTER")
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        due = int(time.time() * 1000) + 5000
        async with Producer("pg_timer", c.namesrv_addr) as producer:
            sent = [await producer.send(Message("Reminders", b"t%d" % i, deliver_time_ms=due))
                    for i in range(6)]
            await producer.recall("Reminders", sent[0].recall_handle)
        async with TransactionProducer("pg_commit", c.namesrv_addr,
                                       listener=_Fixed(LocalTransactionState.COMMIT_MESSAGE)) as tx:
            await tx.send_message_in_transaction(Message("Reminders", b"tx", deliver_time_ms=due))
        async with TransactionProducer("pg_rollback", c.namesrv_addr,
                                       listener=_Fixed(LocalTransactionState.ROLLBACK_MESSAGE)) as tx:
            await tx.send_message_in_transaction(Message("Reminders", b"rb", deliver_time_ms=due))
        await eventually(lambda: a.tx.pending_count() == 0, msg="both transactions decided")
        await eventually(lambda: b.store.max_physical_offset == a.store.max_physical_offset,
                         msg="the slave holds everything")
        # t1..t5 and the commit wait on the master; a slave indexes nothing
        await eventually(lambda: a.timer.pending == 6, msg="six timers pending on the master")
        assert not b.timer.active
        slave = RemotingClient(b.broker_addr)  # a recall sent to the slave is refused
        await slave.connect()
        try:
            resp = await slave.invoke(RemotingCommand.request(
                RequestCode.RECALL_MESSAGE, RecallMessageRequestHeader(
                    topic="Reminders", recall_handle=sent[1].recall_handle).to_ext()), 5.0)
        finally:
            await slave.close()
        assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
        assert "is not its group's master" in resp.remark
        c.brokers.remove(a)
        await a.stop()
        await eventually(lambda: b.roles.is_master, timeout=15, msg="the slave promoted")
        assert b.timer.pending == 6
        consumer = Consumer("cg_timer", c.namesrv_addr, from_where="first", long_poll_timeout=1.0)
        consumer.subscribe("Reminders")
        async with consumer:
            got = await collect(consumer, 6, timeout=30)
            assert await consumer.poll(1.0) is None
    assert sorted(m.body for m in got) == [b"t1", b"t2", b"t3", b"t4", b"t5", b"tx"]
    assert all(m.store_timestamp >= due for m in got)
