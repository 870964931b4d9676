"""Held pulls of a consumer that left are released at once, not at their suspend deadline.

A real in-process broker whose long polls may last 30 s; the consumers are a raw remoting
client and the SDK Consumer, on real sockets; ``heldPulls`` is read through BROKER_STATUS.
"""

from __future__ import annotations

import asyncio

import pytest
from support.waiting import eventually

from txbroker.client import Consumer, Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import PULL_FLAG_SUSPEND, PullMessageRequestHeader

#: Long polls last up to this (s); every wait below is far shorter, so a hold that lasts
#: until its deadline fails the test.
SUSPEND = 30.0
#: A generous bound on "at once".
RELEASED_WITHIN = 5.0


@pytest.fixture
def broker_config(broker_config):
    return broker_config.replace(max_pull_suspend=SUSPEND)


async def _held(namesrv: str) -> int:
    async with AdminClient(namesrv) as admin:
        [doc] = (await admin.status()).values()
    return int(doc["metrics"]["heldPulls"])


def _pull(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, PullMessageRequestHeader(
        consumer_group="CG_HOLD", topic=topic, queue_id=0, queue_offset=0, max_msg_nums=32,
        sys_flag=PULL_FLAG_SUSPEND, commit_offset=-1,
        suspend_timeout_millis=int(SUSPEND * 1000)).to_ext())


async def test_a_closed_connection_releases_its_held_pull(broker) -> None:
    namesrv = broker.namesrv_addr
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("THold", 1)
    leaving, staying = RemotingClient(broker.broker_addr), RemotingClient(broker.broker_addr)
    await leaving.connect()
    await staying.connect()
    try:
        gone = asyncio.ensure_future(leaving.invoke(_pull("THold"), SUSPEND + 5))
        kept = asyncio.ensure_future(staying.invoke(_pull("THold"), SUSPEND + 5))
        await eventually(lambda: broker.holds.held() == 2, msg="both pulls held")
        await leaving.close()
        await asyncio.gather(gone, return_exceptions=True)
        await eventually(lambda: broker.holds.held() == 1, RELEASED_WITHIN,
                         msg=lambda: f"{broker.holds.held()} held after one connection closed")
        assert await _held(namesrv) == 1
        # The other connection's hold is untouched: a message still answers it at once.
        async with Producer("PG_HOLD", namesrv) as producer:
            await producer.send(Message("THold", b"wake"))
        resp = await asyncio.wait_for(kept, RELEASED_WITHIN)
        assert resp.code == ResponseCode.SUCCESS
        assert broker.holds.held() == 0
    finally:
        await leaving.close()
        await staying.close()


async def test_a_consumer_that_left_leaves_no_held_pull(broker) -> None:
    namesrv = broker.namesrv_addr
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("THold4", 4)
    consumer = Consumer("CG_HOLD4", namesrv, long_poll_timeout=SUSPEND)
    consumer.subscribe("THold4")
    await consumer.start()
    try:
        await eventually(lambda: broker.holds.held() == 4, msg="one pull held per queue")
        assert await _held(namesrv) == 4
    finally:
        await consumer.shutdown()
    await eventually(lambda: broker.holds.held() == 0, RELEASED_WITHIN,
                     msg=lambda: f"{broker.holds.held()} pulls still held after the consumer left")
    assert await _held(namesrv) == 0
