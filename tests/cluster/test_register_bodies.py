"""REGISTER_BROKER bodies: the JSON and the compressed (zlib, length-prefixed) forms, and a
real name server refusing a body whose bodyCrc32 does not match or reading an old broker's bare
topic table."""

from __future__ import annotations

import struct
import zlib

import orjson
import pytest
from support.clock import ManualClock
from support.cluster import route, start_namesrv

from txbroker.remoting.bodies import (
    BodyError,
    DataVersion,
    RegisterBrokerBody,
    TopicConfigData,
    TopicConfigSerializeWrapper,
    body_crc32,
)
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
)


def _body() -> RegisterBrokerBody:
    return RegisterBrokerBody(TopicConfigSerializeWrapper(DataVersion(1700000000000, 7), {
        "Orders": TopicConfigData("Orders", 4, 4, 6, topic_sys_flag=0, order=False),
        "RMQ_SYS_TRANS_HALF_TOPIC": TopicConfigData("RMQ_SYS_TRANS_HALF_TOPIC", 1, 1, 6),
    }), ["127.0.0.1:1"])


def test_json_form_round_trips_with_rocketmq_field_names() -> None:
    body = _body()
    raw = body.encode()
    doc = orjson.loads(raw)
    assert doc["topicConfigSerializeWrapper"]["dataVersion"] == {"counter": 7,
                                                                "timestamp": 1700000000000}
    tc = doc["topicConfigSerializeWrapper"]["topicConfigTable"]["Orders"]
    assert set(tc) == {"topicName", "readQueueNums", "writeQueueNums", "perm",
                       "topicFilterType", "topicSysFlag", "order"}
    assert RegisterBrokerBody.decode(raw) == body


def test_compressed_form_is_zlib_of_length_prefixed_items() -> None:
    body = _body()
    raw = zlib.decompress(body.encode(compressed=True))
    (n,) = struct.unpack_from(">i", raw, 0)
    assert orjson.loads(raw[4:4 + n]) == {"counter": 7, "timestamp": 1700000000000}
    (count,) = struct.unpack_from(">i", raw, 4 + n)
    assert count == 2
    (m,) = struct.unpack_from(">i", raw, 8 + n)
    assert raw[12 + n:12 + n + m] == b"Orders 4 4 6 SINGLE_TAG"
    assert RegisterBrokerBody.decode(body.encode(compressed=True), compressed=True) == body


def test_compressed_form_refuses_garbage_and_truncation() -> None:
    with pytest.raises(BodyError, match="zlib"):
        RegisterBrokerBody.decode(b"not zlib", compressed=True)
    raw = zlib.decompress(_body().encode(compressed=True))
    with pytest.raises(BodyError, match="truncated"):
        RegisterBrokerBody.decode(zlib.compress(raw[:30]), compressed=True)


def _register_cmd(body: bytes, *, crc: int | None = None, compressed: bool = False,
                  broker_id: int = 0, addr: str = "127.0.0.1:10911") -> RemotingCommand:
    header = RegisterBrokerRequestHeader(
        broker_name="broker-a", broker_addr=addr, cluster_name="DefaultCluster",
        ha_server_addr="127.0.0.1:10912", broker_id=broker_id, compressed=compressed,
        body_crc32=body_crc32(body) if crc is None else crc)
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), body)


@pytest.mark.parametrize("compressed", [False, True])
async def test_name_server_reads_both_forms_and_checks_the_crc(compressed: bool) -> None:
    server = await start_namesrv()
    client = RemotingClient(server.addr)
    try:
        raw = _body().encode(compressed=compressed)
        bad = await client.invoke(_register_cmd(raw, crc=body_crc32(raw) ^ 1,
                                                compressed=compressed), 5.0)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "crc32 not match" in bad.remark
        assert await route(server.addr, "Orders") is None
        ok = await client.invoke(_register_cmd(raw, compressed=compressed), 5.0)
        assert ok.code == ResponseCode.SUCCESS
        got = await route(server.addr, "Orders")
        assert got.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
        assert got.queue_datas[0].write_queue_nums == 4
        # A slave learns the master's address and HA address from the answer.
        slave = await client.invoke(_register_cmd(raw, broker_id=1, crc=0, addr="127.0.0.1:10921",
                                                  compressed=compressed), 5.0)
        answer = RegisterBrokerResponseHeader.from_ext(slave.ext_fields)
        assert (answer.master_addr, answer.ha_server_addr) == ("127.0.0.1:10911", "127.0.0.1:10912")
    finally:
        await client.close()
        await server.stop()


async def test_old_broker_body_and_unknown_codes() -> None:
    server = await start_namesrv()
    client = RemotingClient(server.addr)
    try:
        cmd = _register_cmd(_body().topic_config_wrapper.encode(), crc=0)
        cmd.version = 36  # before V3_0_11: a bare TopicConfigSerializeWrapper
        assert (await client.invoke(cmd, 5.0)).code == ResponseCode.SUCCESS
        assert await route(server.addr, "Orders") is not None
        unknown = await client.invoke(RemotingCommand.request(RequestCode.END_TRANSACTION), 5.0)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        broken = await client.invoke(_register_cmd(b"{not json"), 5.0)
        assert broken.code == ResponseCode.SYSTEM_ERROR
        assert (await client.invoke(_register_cmd(_body().encode()), 5.0)).code == ResponseCode.SUCCESS
    finally:
        await client.close()
        await server.stop()


async def test_query_data_version_says_changed_and_refreshes_liveness() -> None:
    clock = ManualClock()
    server = await start_namesrv(clock=clock)
    client = RemotingClient(server.addr)
    try:
        assert (await client.invoke(_register_cmd(_body().encode()), 5.0)).code == ResponseCode.SUCCESS
        ext = QueryDataVersionRequestHeader(broker_name="broker-a", broker_addr="127.0.0.1:10911",
                                            cluster_name="DefaultCluster", broker_id=0).to_ext()
        clock.advance(100)
        same = await client.invoke(RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION, ext, DataVersion(1700000000000, 7).encode()), 5.0)
        assert same.code == ResponseCode.SUCCESS
        assert QueryDataVersionResponseHeader.from_ext(same.ext_fields).changed is False
        assert DataVersion.decode(same.body) == DataVersion(1700000000000, 7)
        assert server.routes.live["127.0.0.1:10911"].last_update == clock()
        newer = await client.invoke(RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION, ext, DataVersion(1700000000000, 8).encode()), 5.0)
        assert QueryDataVersionResponseHeader.from_ext(newer.ext_fields).changed is True
    finally:
        await client.close()
        await server.stop()
