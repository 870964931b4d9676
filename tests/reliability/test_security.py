"""Security checks that exist: validated names, protected system topics, loopback by default,
connection / in-flight / frame-size limits."""

from __future__ import annotations

import asyncio
import struct

import pytest
from support.waiting import eventually

from txbroker.bench.chaos.fuzz import (
    SYSTEM_TOPICS,
    Case,
    pull_ext,
    request,
    run_case,
    send_ext,
)
from txbroker.broker import Broker
from txbroker.config import BrokerConfig
from txbroker.remoting.codes import RequestCode, ResponseCode

#: RocketMQ DELETE_TOPIC_IN_BROKER: refused for system topics (NO_PERMISSION).
DELETE_TOPIC_IN_BROKER = 215


def host_port(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


async def answer(addr: str, data: bytes) -> tuple[int | None, str | None]:
    host, port = host_port(addr)
    answers, _closed = await run_case(host, port, Case("probe", data, "error"), 5.0)
    return (answers[0].code, answers[0].remark) if answers else (None, None)


def test_default_listen_is_loopback():
    assert BrokerConfig().listen_host == "127.0.0.1"


async def test_broker_binds_loopback(broker):
    assert broker.broker_addr.startswith("127.0.0.1:")
    assert broker.namesrv_addr.startswith("127.0.0.1:")


@pytest.mark.parametrize("topic", SYSTEM_TOPICS)
async def test_system_topics_cannot_be_written_created_deleted_or_pulled(broker, topic):
    addr = broker.broker_addr
    for data in (request(RequestCode.SEND_MESSAGE, send_ext(topic), b"x"),
                 request(RequestCode.PULL_MESSAGE, pull_ext(topic)),
                 request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                     "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4",
                     "writeQueueNums": "4", "perm": "6", "topicFilterType": "SINGLE_TAG"}),
                 request(DELETE_TOPIC_IN_BROKER, {"topic": topic})):
        code, remark = await answer(addr, data)
        assert code not in (None, ResponseCode.SUCCESS), (topic, code, remark)
        assert remark, (topic, code)
    code, remark = await answer(addr, request(DELETE_TOPIC_IN_BROKER, {"topic": topic}))
    assert code == ResponseCode.NO_PERMISSION, (topic, code, remark)  # refused as a system topic


@pytest.mark.parametrize("topic", ["", "bad topic", "a/b", "x" * 300, "t\u00e9"])
async def test_invalid_topic_names_refused(broker, topic):
    for data in (request(RequestCode.SEND_MESSAGE, send_ext(topic), b"x"),
                 request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                     "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4",
                     "writeQueueNums": "4", "perm": "6", "topicFilterType": "SINGLE_TAG"})):
        code, remark = await answer(broker.broker_addr, data)
        assert code not in (None, ResponseCode.SUCCESS), (topic, code, remark)


@pytest.mark.parametrize("group", ["g r", "g" * 300, "g\u00e9"])
async def test_invalid_consumer_group_refused(broker, group):
    code, remark = await answer(broker.broker_addr,
                                request(RequestCode.PULL_MESSAGE, pull_ext("SecTopic", consumerGroup=group)))
    assert code not in (None, ResponseCode.SUCCESS), (group, code, remark)


@pytest.mark.parametrize("group", ["g r", "g" * 300])
async def test_invalid_producer_group_refused(broker, group):
    code, remark = await answer(broker.broker_addr,
                                request(RequestCode.SEND_MESSAGE, send_ext("SecTopic", producerGroup=group), b"x"))
    assert code not in (None, ResponseCode.SUCCESS), (group, code, remark)


async def test_connection_limit(broker_config):
    broker = Broker(broker_config.replace(max_connections=3))
    await broker.start()
    conns = []
    try:
        host, port = host_port(broker.broker_addr)
        probe = request(RequestCode.GET_MAX_OFFSET, {"topic": "SecTopic", "queueId": "0"})
        for _ in range(3):
            r, w = await asyncio.open_connection(host, port)
            w.write(probe)
            assert await asyncio.wait_for(r.read(4), 5)  # served
            conns.append((r, w))
        r, w = await asyncio.open_connection(host, port)
        w.write(probe)
        assert await asyncio.wait_for(r.read(), 5) == b""  # over the limit: closed at once
        w.close()
        conns[0][1].close()
        await eventually(lambda: len(broker.server.connections) < 3, msg="the closed connection's slot freed")
        code, _ = await answer(broker.broker_addr, probe)  # a slot is free again
        assert code is not None
    finally:
        for _r, w in conns:
            w.close()
        await broker.stop()


async def test_frame_size_limit_closes_only_that_connection(broker_config):
    broker = Broker(broker_config.replace(max_frame_size=64 * 1024, max_message_size=16 * 1024))
    await broker.start()
    try:
        host, port = host_port(broker.broker_addr)
        r, w = await asyncio.open_connection(host, port)
        w.write(struct.pack(">ii", 100 * 1024, 2) + b"{}")  # announces a 100 KiB frame
        assert await asyncio.wait_for(r.read(), 5) == b""
        w.close()
        code, _ = await answer(broker.broker_addr, request(RequestCode.SEND_MESSAGE, send_ext("SecTopic"), b"ok"))
        assert code == ResponseCode.SUCCESS
    finally:
        await broker.stop()


async def test_inflight_limit_stops_reading_until_a_slot_frees(broker_config):
    broker = Broker(broker_config.replace(max_inflight_per_connection=2))
    await broker.start()
    try:
        host, port = host_port(broker.broker_addr)
        assert (await answer(broker.broker_addr, request(RequestCode.SEND_MESSAGE, send_ext("HoldTopic"),
                                                         b"x")))[0] == ResponseCode.SUCCESS
        r, w = await asyncio.open_connection(host, port)
        from txbroker.remoting.codec import FrameDecoder, encode
        from txbroker.remoting.command import RemotingCommand
        held = pull_ext("HoldTopic", queueOffset="1", suspendTimeoutMillis="1500", sysFlag="2")
        for opaque in (1, 2):  # two long polls on an empty position: both held
            w.write(encode(RemotingCommand.request(RequestCode.PULL_MESSAGE, held, opaque=opaque)))
        w.write(encode(RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "HoldTopic", "queueId": "0"},
                                               opaque=3)))
        decoder = FrameDecoder()
        order: list[int] = []
        while len(order) < 3:
            chunk = await asyncio.wait_for(r.read(65536), 10)
            assert chunk
            order += [c.opaque for c in decoder.feed(chunk)]
        w.close()
        # The quick request waited behind the two held pulls: the limit is enforced.
        assert order.index(3) > 0, order
    finally:
        await broker.stop()
