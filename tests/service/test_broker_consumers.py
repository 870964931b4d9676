"""Consumer-side requests over TCP: routes, membership, offsets, send-back, locks, topics."""

from __future__ import annotations

import asyncio
import time

import orjson
from broker_wire import (
    PULL_COMMIT,
    PULL_SUBSCRIPTION,
    TIMEOUT,
    heartbeat_body,
    pull,
    request,
    send,
)
from support.clock import ManualClock
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode


async def _connect(addr: str) -> RemotingClient:
    client = RemotingClient(addr)
    await client.connect()
    return client


def _route_request(topic: str, version: int, **ext: str):
    cmd = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, **ext})
    cmd.version = version
    return cmd


async def test_routes_on_both_ports(broker) -> None:
    for addr in (broker.broker_addr, broker.namesrv_addr):
        client = await _connect(addr)
        try:
            old = await client.invoke(_route_request("TBW102", 63), TIMEOUT)
            assert old.code == ResponseCode.SUCCESS
            assert f'{{0:"{broker.broker_addr}"}}'.encode() in old.body  # fastjson dialect
            std = await client.invoke(_route_request("TBW102", 409), TIMEOUT)
            doc = orjson.loads(std.body)
            assert doc["brokerDatas"][0]["brokerAddrs"] == {"0": broker.broker_addr}
            assert doc["queueDatas"][0]["writeQueueNums"] == broker.config.default_queue_nums
            flagged = await client.invoke(_route_request("TBW102", 63, acceptStandardJsonOnly="true"), TIMEOUT)
            assert orjson.loads(flagged.body) == doc
            cluster = await client.invoke(request(RequestCode.GET_BROKER_CLUSTER_INFO), TIMEOUT)
            info = orjson.loads(cluster.body)
            assert info["clusterAddrTable"] == {broker.config.cluster_name: [broker.config.broker_name]}
            # A lookup never creates a topic (a producer sends on TBW102's route instead).
            fresh = await client.invoke(_route_request("Fresh", 409), TIMEOUT)
            assert fresh.code == ResponseCode.TOPIC_NOT_EXIST and "Fresh" in fresh.remark
            bad = await client.invoke(_route_request("bad name", 409), TIMEOUT)
            assert bad.code == ResponseCode.TOPIC_NOT_EXIST
            topics = await client.invoke(request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), TIMEOUT)
            assert "Fresh" not in orjson.loads(topics.body)["topicList"]
        finally:
            await client.close()


async def test_membership_changes_notify_members(broker) -> None:
    a, b = await _connect(broker.broker_addr), await _connect(broker.broker_addr)
    notified: list[str] = []

    async def on_notify(cmd):
        notified.append(cmd.ext_fields.get("consumerGroup", ""))

    a.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
    try:
        resp = await a.invoke(request(RequestCode.HEART_BEAT, body=heartbeat_body("cA", "CG", "T1")), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        resp = await b.invoke(request(RequestCode.HEART_BEAT, body=heartbeat_body("cB", "CG", "T1", cpp=True)), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        lst = await a.invoke(request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"}), TIMEOUT)
        assert orjson.loads(lst.body) == {"consumerIdList": ["cA", "cB"]}
        await eventually(lambda: notified.count("CG") >= 2, 5.0)
        before = len(notified)
        await b.close()  # disconnect = leave
        await eventually(lambda: len(notified) > before, 5.0)
        lst = await a.invoke(request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"}), TIMEOUT)
        assert orjson.loads(lst.body) == {"consumerIdList": ["cA"]}
        assert broker.topics.get("%RETRY%CG") is not None
        resp = await a.invoke(request(RequestCode.UNREGISTER_CLIENT, {
            "clientID": "cA", "consumerGroup": "CG", "producerGroup": ""}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        lst = await a.invoke(request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"}), TIMEOUT)
        assert lst.code == ResponseCode.SYSTEM_ERROR
        bad = await a.invoke(request(RequestCode.HEART_BEAT, body=b"{not json"), TIMEOUT)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "JSON" in bad.remark
    finally:
        await a.close()
        await b.close()


async def test_offsets_query_update_and_persist(broker_config) -> None:
    b = Broker(broker_config)
    await b.start()
    c = await _connect(b.broker_addr)
    q = {"consumerGroup": "OG", "topic": "OffT", "queueId": "1"}
    try:
        for _ in range(3):
            await send(c, "OffT", b"x", queue_id=1)
        resp = await c.invoke(request(RequestCode.QUERY_CONSUMER_OFFSET, q), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "0"  # min is 0
        # RocketMQ 5's setZeroIfNotFound=false: no offset is not found, not 0 (the Kafka view).
        resp = await c.invoke(request(RequestCode.QUERY_CONSUMER_OFFSET,
                                      {**q, "setZeroIfNotFound": "false"}), TIMEOUT)
        assert resp.code == ResponseCode.QUERY_NOT_FOUND, resp.remark
        resp = await c.invoke(request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "2"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        resp = await c.invoke(request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "-5"}), TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        # commit-offset flag on a pull stores the offset too
        await pull(c, "OG", "OffT", 1, 2, sys_flag=PULL_COMMIT | PULL_SUBSCRIPTION, commit_offset=3)
        resp = await c.invoke(request(RequestCode.QUERY_CONSUMER_OFFSET, q), TIMEOUT)
        assert resp.ext_fields["offset"] == "3"
        resp = await c.invoke(request(RequestCode.QUERY_CONSUMER_OFFSET,
                                      {**q, "setZeroIfNotFound": "false"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "3"
    finally:
        await c.close()
        await b.stop()
    b2 = Broker(broker_config)
    await b2.start()
    c = await _connect(b2.broker_addr)
    try:
        resp = await c.invoke(request(RequestCode.QUERY_CONSUMER_OFFSET, q), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "3"
    finally:
        await c.close()
        await b2.stop()


async def test_send_back_goes_to_retry_then_dlq(broker_config) -> None:
    clock = ManualClock(follows_real_time=True)
    b = Broker(broker_config.replace(max_reconsume_times=2), clock=clock)
    await b.start()
    c = await _connect(b.broker_addr)
    try:
        await send(c, "Work", b"payload", tags="T")
        _, msgs = await pull(c, "WG", "Work", 0, 0)
        offset = msgs[0].physical_offset
        resp = await c.invoke(request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(offset), "group": "WG", "delayLevel": "0"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert b.store.max_offset("%RETRY%WG", 0) == 0  # delayed: level 3 = 10 s
        clock.advance(11)
        await eventually(lambda: b.store.max_offset("%RETRY%WG", 0) == 1, 5.0)
        _, retry = await pull(c, "WG", "%RETRY%WG", 0, 0)
        assert retry[0].body == b"payload" and retry[0].reconsume_times == 1
        assert retry[0].properties["RETRY_TOPIC"] == "Work"
        # second failure: reconsume 1 < 2 → retry again (level 4 = 30 s)
        resp = await c.invoke(request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(retry[0].physical_offset), "group": "WG", "delayLevel": "0"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        clock.advance(31)
        await eventually(lambda: b.store.max_offset("%RETRY%WG", 0) == 2, 5.0)
        _, retry2 = await pull(c, "WG", "%RETRY%WG", 0, 1)
        assert retry2[0].reconsume_times == 2
        # third failure: reconsume 2 >= max 2 → dead-letter queue, no delay
        resp = await c.invoke(request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(retry2[0].physical_offset), "group": "WG", "delayLevel": "0"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        _, dlq = await pull(c, "WG", "%DLQ%WG", 0, 0)
        assert [m.body for m in dlq] == [b"payload"]
        bad = await c.invoke(request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": "999999", "group": "WG", "delayLevel": "0"}), TIMEOUT)
        assert bad.code == ResponseCode.SYSTEM_ERROR
    finally:
        await c.close()
        await b.stop()


async def test_lock_and_unlock_batch(broker) -> None:
    a, b = await _connect(broker.broker_addr), await _connect(broker.broker_addr)
    mqs = [{"topic": "Ord", "brokerName": broker.config.broker_name, "queueId": q} for q in range(3)]

    def body(client_id: str, qs) -> bytes:
        return orjson.dumps({"consumerGroup": "LG", "clientId": client_id, "mqSet": qs})

    try:
        resp = await a.invoke(request(RequestCode.LOCK_BATCH_MQ, body=body("cA", mqs[:2])), TIMEOUT)
        assert {m["queueId"] for m in orjson.loads(resp.body)["lockOKMQSet"]} == {0, 1}
        resp = await b.invoke(request(RequestCode.LOCK_BATCH_MQ, body=body("cB", mqs)), TIMEOUT)
        assert {m["queueId"] for m in orjson.loads(resp.body)["lockOKMQSet"]} == {2}
        resp = await a.invoke(request(RequestCode.UNLOCK_BATCH_MQ, body=body("cA", mqs[:1])), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        resp = await b.invoke(request(RequestCode.LOCK_BATCH_MQ, body=body("cB", mqs)), TIMEOUT)
        assert {m["queueId"] for m in orjson.loads(resp.body)["lockOKMQSet"]} == {0, 2}
        bad = await b.invoke(request(RequestCode.LOCK_BATCH_MQ, body=b'{"consumerGroup":"LG"}'), TIMEOUT)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "clientId" in bad.remark
    finally:
        await a.close()
        await b.close()


async def test_topic_admin_and_status(broker, broker_client) -> None:
    c = broker_client
    resp = await c.invoke(request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "Made", "readQueueNums": "3", "writeQueueNums": "3", "perm": "6"}), TIMEOUT)
    assert resp.code == ResponseCode.SUCCESS
    for bad, code in (("bad/name", ResponseCode.MESSAGE_ILLEGAL),
                      ("RMQ_SYS_TRANS_OP_HALF_TOPIC", ResponseCode.NO_PERMISSION),
                      ("TBW102", ResponseCode.NO_PERMISSION)):
        resp = await c.invoke(request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": bad, "readQueueNums": "1", "writeQueueNums": "1"}), TIMEOUT)
        assert resp.code == code, (bad, resp.remark)
    resp = await c.invoke(request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "Zero", "readQueueNums": "0", "writeQueueNums": "0"}), TIMEOUT)
    assert resp.code == ResponseCode.SYSTEM_ERROR
    table = orjson.loads((await c.invoke(request(RequestCode.GET_ALL_TOPIC_CONFIG), TIMEOUT)).body)
    assert table["topicConfigTable"]["Made"]["writeQueueNums"] == 3
    await send(c, "Made", b"x", queue_id=2)
    await c.invoke(request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "SG", "topic": "Made", "queueId": "2", "commitOffset": "1"}), TIMEOUT)
    status = orjson.loads((await c.invoke(request(RequestCode.BROKER_STATUS), TIMEOUT)).body)
    queues = {q["queueId"]: q for q in status["topics"]["Made"]["queues"]}
    assert queues[2]["maxOffset"] == 1 and queues[0]["maxOffset"] == 0
    assert status["consumerGroups"]["SG"]["offsets"]["Made"]["2"] == 1
    assert status["pendingHalfMessages"] == 0
    info = orjson.loads((await c.invoke(request(RequestCode.GET_BROKER_RUNTIME_INFO), TIMEOUT)).body)
    assert info["table"]["flushMode"] == broker.config.flush_mode


async def test_metrics_endpoint_serves_prometheus_text(broker_config) -> None:
    b = Broker(broker_config.replace(metrics_port=0))
    await b.start()
    c = await _connect(b.broker_addr)
    try:
        half = await send(c, "MetricT", b"x", sys_flag=4, group="PG_M",
                          props={"TRAN_MSG": "true", "PGROUP": "PG_M", "UNIQ_KEY": "U-M"})
        assert half.code == ResponseCode.SUCCESS
        reader, writer = await asyncio.open_connection("127.0.0.1", b.metrics_port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), TIMEOUT)
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") and b"text/plain" in head
        assert b"txbroker_tx_pending 1.0" in body
        assert b"txbroker_tx_halves_total 1.0" in body
        assert b"txbroker_connections 1.0" in body
        # The held pull below is in flight on its connection when the endpoint is scraped.
        pull = asyncio.ensure_future(c.invoke(request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "CG_M", "topic": "MetricT", "queueId": "0", "queueOffset": "0",
            "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "0", "suspendTimeoutMillis": "3000",
            "subscription": "*", "subVersion": "0"}), TIMEOUT))
        await eventually(lambda: b.holds.held() == 1, msg="the pull held")
        reader, writer = await asyncio.open_connection("127.0.0.1", b.metrics_port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        body = (await asyncio.wait_for(reader.read(), TIMEOUT)).partition(b"\r\n\r\n")[2]
        writer.close()
        assert b"txbroker_requests_in_flight 1.0" in body and b"txbroker_held_pulls 1.0" in body
        pull.cancel()
        # The same figures through GET_BROKER_RUNTIME_INFO, as strings (RocketMQ's table).
        info = orjson.loads((await c.invoke(request(RequestCode.GET_BROKER_RUNTIME_INFO), TIMEOUT)).body)
        assert info["table"]["tx_halves_total"] == "1" and info["table"]["pendingHalfMessages"] == "1"
        reader, writer = await asyncio.open_connection("127.0.0.1", b.metrics_port)
        writer.write(b"GET /nope HTTP/1.0\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), TIMEOUT)
        writer.close()
        assert raw.startswith(b"HTTP/1.0 404")
    finally:
        await c.close()
        await b.stop()


async def test_offsets_after_retention_deleted_the_head(broker, broker_client) -> None:
    """Min offset > 0: a new group gets QUERY_NOT_FOUND (RocketMQ), an old offset moves."""
    c = broker_client
    body = b"r" * 16 * 1024
    n = 0
    while len(broker.store.commitlog.segments) < 3 and n < 400:  # 1 MiB segments
        assert (await send(c, "Ret", body)).code == ResponseCode.SUCCESS
        n += 1
    deleted = await broker.store.delete_expired(time.time() + broker.config.file_reserved_time + 60)
    assert deleted >= 1
    low = broker.store.min_offset("Ret", 0)
    assert low > 0
    q = {"consumerGroup": "NewGroup", "topic": "Ret", "queueId": "0"}
    resp = await c.invoke(request(RequestCode.QUERY_CONSUMER_OFFSET, q), TIMEOUT)
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    resp, msgs = await pull(c, "NewGroup", "Ret", 0, 0)
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED and msgs == []
    assert int(resp.ext_fields["nextBeginOffset"]) == low
    resp, msgs = await pull(c, "NewGroup", "Ret", 0, low, max_nums=2)
    assert resp.code == ResponseCode.SUCCESS and msgs[0].queue_offset == low


async def test_delete_topic(broker, broker_client) -> None:
    c = broker_client
    await send(c, "Doomed", b"x", queue_id=1)
    await c.invoke(request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "DG", "topic": "Doomed", "queueId": "1", "commitOffset": "1"}), TIMEOUT)
    await send(c, "Kept", b"y", queue_id=0)
    cq_dir = broker.store.root / "consumequeue" / "Doomed"
    assert cq_dir.is_dir()
    resp = await c.invoke(request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Doomed"}), TIMEOUT)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert broker.topics.get("Doomed") is None and not cq_dir.exists()
    assert broker.store.max_offset("Doomed", 1) == 0
    assert "Doomed" not in broker.store.offsets.groups().get("DG", {})
    assert broker.store.max_offset("Kept", 0) == 1  # other topics untouched
    resp = await c.invoke(request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Doomed"}), TIMEOUT)
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    for bad, code in (("../Kept", ResponseCode.MESSAGE_ILLEGAL),
                      ("RMQ_SYS_TRANS_HALF_TOPIC", ResponseCode.NO_PERMISSION),
                      ("TBW102", ResponseCode.NO_PERMISSION)):
        resp = await c.invoke(request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": bad}), TIMEOUT)
        assert resp.code == code, (bad, resp.code, resp.remark)
    assert broker.store.max_offset("Kept", 0) == 1
    # Sending again makes a fresh topic (auto-create), from offset 0.
    await send(c, "Doomed", b"z", queue_id=1)
    assert broker.store.max_offset("Doomed", 1) == 1
