"""A broker process SIGKILLed right after acknowledging consumer offsets restarts with them:
the offsets file is only a checkpoint (written every ``offset_persist_interval``, here once an
hour), and recovery applies the offset records of the commitlog past it
(txbroker/store/offset_log.py)."""

from __future__ import annotations

import pytest
from support.waiting import eventually

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

pytestmark = pytest.mark.slow

TOPIC = "KilledOffsets"


async def call(addr: str, code: int, fields: dict) -> RemotingCommand:
    client = RemotingClient(addr, reconnect=False)
    try:
        return await client.invoke(RemotingCommand.request(code, fields), 5.0)
    finally:
        await client.close()


async def test_offsets_acknowledged_before_a_sigkill_are_there_after_the_restart(broker_process):
    proc = broker_process(offset_persist_interval=3600.0)
    created = await call(proc.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"})
    assert created.code == ResponseCode.SUCCESS, created.remark
    for q in range(4):
        resp = await call(proc.broker_addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                          UpdateConsumerOffsetRequestHeader(consumer_group="killed", topic=TOPIC,
                                                            queue_id=q, commit_offset=100 + q).to_ext())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    proc.kill()
    proc.start()

    async def answered() -> bool:
        try:
            await call(proc.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO, {})
        except OSError:
            return False
        return True

    await eventually(answered, timeout=20, msg="the restarted broker answers")
    for q in range(4):
        resp = await call(proc.broker_addr, RequestCode.QUERY_CONSUMER_OFFSET,
                          QueryConsumerOffsetRequestHeader(consumer_group="killed", topic=TOPIC,
                                                           queue_id=q,
                                                           set_zero_if_not_found=False).to_ext())
        assert (resp.code, resp.ext_fields.get("offset")) == (ResponseCode.SUCCESS, str(100 + q))
