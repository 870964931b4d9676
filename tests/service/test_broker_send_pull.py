"""Send and pull through a real broker over TCP (RemotingClient, not the SDK)."""

from __future__ import annotations

import asyncio

import pytest
from broker_wire import (
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    TIMEOUT,
    create_topic,
    heartbeat_body,
    pull,
    request,
    send,
    send_cmd,
)
from support.waiting import eventually

from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.store.record import decode_offset_msg_id, encode_batch


async def test_send_then_pull_with_tag_filter(broker, broker_client) -> None:
    c = broker_client
    for i, tag in enumerate(["TagA", "TagB", "TagC", "TagA"]):
        resp = await send(c, "Orders", f"m{i}".encode(), tags=tag, props={"KEYS": f"k{i}"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        ext = resp.ext_fields
        assert ext["queueId"] == "0" and ext["queueOffset"] == str(i)
        assert ext["MSG_REGION"] == "DefaultRegion" and ext["TRACE_ON"] == "true"
        host, port, _ = decode_offset_msg_id(ext["msgId"])
        assert f"{host}:{port}" == broker.broker_addr
    resp, msgs = await pull(c, "G1", "Orders", 0, 0)
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in msgs] == [b"m0", b"m1", b"m2", b"m3"]
    assert resp.ext_fields["nextBeginOffset"] == "4"
    assert resp.ext_fields["minOffset"] == "0" and resp.ext_fields["maxOffset"] == "4"
    stored = msgs[0]
    assert "WAIT" not in stored.properties
    assert stored.properties["CLUSTER"] == broker.config.cluster_name
    assert stored.properties["KEYS"] == "k0"
    resp, msgs = await pull(c, "G1", "Orders", 0, 0, subscription="TagA || TagC")
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in msgs] == [b"m0", b"m2", b"m3"]
    resp, msgs = await pull(c, "G1", "Orders", 0, 4)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and msgs == []


@pytest.mark.parametrize("expression,bodies", [
    ("A || *", [b"a", b"star"]),  # "*" among tags is the tag "*" (FilterAPI), not "all"
    (" ", []),                    # blanks name no tag: nothing matches
    ("", [b"a", b"b", b"star", b"none"]),
])
async def test_pull_reads_tag_expressions_as_rocketmq(broker, broker_client, expression, bodies) -> None:
    c = broker_client
    for body, tag in ((b"a", "A"), (b"b", "B"), (b"star", "*"), (b"none", None)):
        assert (await send(c, "TagRules", body, tags=tag)).code == ResponseCode.SUCCESS
    resp, msgs = await pull(c, "G_TAGS", "TagRules", 0, 0, subscription=expression)
    # Nothing matched among stored messages: RocketMQ's NO_MATCHED_MESSAGE answer.
    assert resp.code == (ResponseCode.SUCCESS if bodies else ResponseCode.PULL_RETRY_IMMEDIATELY)
    assert [m.body for m in msgs] == bodies


async def test_pull_with_unsplittable_expression_refused(broker, broker_client) -> None:
    assert (await send(broker_client, "TagSplit", b"x", tags="A")).code == ResponseCode.SUCCESS
    resp, _ = await pull(broker_client, "G_TAGS", "TagSplit", 0, 0, subscription="||")
    assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "'||'" in resp.remark


async def test_v2_and_batches(broker, broker_client) -> None:
    c = broker_client
    resp = await send(c, "V2Topic", b"short-keys", code=RequestCode.SEND_MESSAGE_V2, queue_id=2)
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["queueId"] == "2"
    body = encode_batch([(0, f"b{i}".encode(), {"UNIQ_KEY": f"U{i}", "WAIT": "true"})
                         for i in range(3)])
    # The C++ client sends batches as code 10 with batch="1".
    cmd = send_cmd("Batch", body, queue_id=1)
    cmd.ext_fields["batch"] = "1"
    resp = await c.invoke(cmd, TIMEOUT)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert len(resp.ext_fields["msgId"].split(",")) == 3
    resp = await send(c, "Batch", body, code=RequestCode.SEND_BATCH_MESSAGE, queue_id=1)
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["queueOffset"] == "3"
    _, msgs = await pull(c, "G", "Batch", 1, 0)
    assert [m.body for m in msgs] == [b"b0", b"b1", b"b2"] * 2
    assert msgs[1].properties["UNIQ_KEY"] == "U1" and "WAIT" not in msgs[1].properties


async def test_negative_queue_id_picks_a_queue(broker, broker_client) -> None:
    qids = set()
    for _ in range(8):
        resp = await send(broker_client, "Spread", b"x", queue_id=-1)
        assert resp.code == ResponseCode.SUCCESS
        qids.add(int(resp.ext_fields["queueId"]))
    assert qids <= {0, 1, 2, 3} and len(qids) > 1


async def test_long_poll_answers_on_arrival(broker, broker_client) -> None:
    c = broker_client
    await create_topic(c, "Poll")
    held = asyncio.create_task(pull(c, "G", "Poll", 0, 0, suspend_ms=20_000,
                                    sys_flag=PULL_SUSPEND | PULL_SUBSCRIPTION, timeout=30))
    await eventually(lambda: broker.holds.held() == 1, msg="the pull held")
    assert not held.done()
    resp = await send(c, "Poll", b"arrived")
    assert resp.code == ResponseCode.SUCCESS
    resp, msgs = await asyncio.wait_for(held, 10)
    assert resp.code == ResponseCode.SUCCESS and [m.body for m in msgs] == [b"arrived"]


async def test_long_poll_times_out_with_not_found(broker, broker_client) -> None:
    await send(broker_client, "Quiet", b"first")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    resp, msgs = await pull(broker_client, "G", "Quiet", 0, 1, suspend_ms=400,
                            sys_flag=PULL_SUSPEND | PULL_SUBSCRIPTION)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and msgs == []
    assert loop.time() - t0 >= 0.35
    assert resp.ext_fields["nextBeginOffset"] == "1"
    assert broker.holds.held() == 0  # the timed-out hold is forgotten, not left to a put


async def test_eight_held_pulls_do_not_block_other_requests(broker, broker_client) -> None:
    c = broker_client
    topic = "Many"
    await create_topic(c, topic, queues=8)
    held = [asyncio.create_task(pull(c, "G", topic, q, 0, suspend_ms=15_000, timeout=30,
                                     sys_flag=PULL_SUSPEND | PULL_SUBSCRIPTION))
            for q in range(8)]
    await eventually(lambda: broker.holds.held() == 8, msg="eight pulls held")
    for _ in range(5):
        resp = await c.invoke(request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}), 3)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "0"
    assert not any(t.done() for t in held)
    for q in range(8):
        assert (await send(c, topic, f"q{q}".encode(), queue_id=q)).code == ResponseCode.SUCCESS
    results = await asyncio.wait_for(asyncio.gather(*held), 10)
    assert sorted(m.body for _, msgs in results for m in msgs) == sorted(f"q{q}".encode() for q in range(8))


async def test_offsets_min_max_and_search(broker, broker_client) -> None:
    c = broker_client
    for i in range(3):
        await send(c, "Offs", b"x%d" % i)
    q = {"topic": "Offs", "queueId": "0"}
    assert (await c.invoke(request(RequestCode.GET_MIN_OFFSET, q), TIMEOUT)).ext_fields["offset"] == "0"
    assert (await c.invoke(request(RequestCode.GET_MAX_OFFSET, q), TIMEOUT)).ext_fields["offset"] == "3"
    resp = await c.invoke(request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": "0"}), TIMEOUT)
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "0"
    _, msgs = await pull(c, "G", "Offs", 0, 1, max_nums=1)
    view = await c.invoke(request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(msgs[0].physical_offset)}), TIMEOUT)
    assert view.code == ResponseCode.SUCCESS and b"x1" in view.body


@pytest.mark.parametrize("mutate, code, words", [
    (lambda e: e.pop("topic"), ResponseCode.SYSTEM_ERROR, "topic"),
    (lambda e: e.pop("producerGroup"), ResponseCode.SYSTEM_ERROR, "producerGroup"),
    (lambda e: e.update(queueId="zero"), ResponseCode.SYSTEM_ERROR, "queueId"),
    (lambda e: e.update(queueId="99"), ResponseCode.SYSTEM_ERROR, "queueId"),
    (lambda e: e.update(bornTimestamp="yesterday"), ResponseCode.SYSTEM_ERROR, "bornTimestamp"),
    (lambda e: e.update(sysFlag="8"), ResponseCode.MESSAGE_ILLEGAL, "sysFlag"),
    (lambda e: e.update(sysFlag="4"), ResponseCode.MESSAGE_ILLEGAL, "TRAN_MSG"),
    (lambda e: e.update(topic="bad topic!"), ResponseCode.MESSAGE_ILLEGAL, "topic"),
    (lambda e: e.update(topic="x" * 250), ResponseCode.MESSAGE_ILLEGAL, "249"),
    (lambda e: e.update(topic="RMQ_SYS_TRANS_HALF_TOPIC"), ResponseCode.NO_PERMISSION, "forbidden"),
    (lambda e: e.update(topic="TRANS_CHECK_MAX_TIME_TOPIC"), ResponseCode.NO_PERMISSION, "forbidden"),
    (lambda e: e.update(batch="maybe"), ResponseCode.SYSTEM_ERROR, "batch"),
])
async def test_bad_send_fields_get_clear_errors(broker, broker_client, mutate, code, words) -> None:
    cmd = send_cmd("Valid", b"body")
    mutate(cmd.ext_fields)
    resp = await broker_client.invoke(cmd, TIMEOUT)
    assert resp.code == code, resp.remark
    assert words in (resp.remark or "")
    assert broker.store.max_offset("Valid", 0) == 0


async def test_huge_body_and_properties_refused(broker, broker_client) -> None:
    c = broker_client
    resp = await send(c, "Big", b"x" * (broker.config.max_message_size + 1))
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "exceeds" in resp.remark
    resp = await send(c, "Big", b"x", props={"huge": "v" * 33_000})
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "properties" in resp.remark
    resp = await send(c, "Big", b"")
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    assert broker.store.max_offset("Big", 0) == 0
    # the connection still works
    assert (await send(c, "Big", b"ok")).code == ResponseCode.SUCCESS


async def test_bad_pull_fields(broker, broker_client) -> None:
    c = broker_client
    resp, _ = await pull(c, "G", "NoSuchTopic", 0, 0)
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    for system in ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                   "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX"):
        resp, msgs = await pull(c, "G", system, 0, 0)
        assert resp.code == ResponseCode.NO_PERMISSION and msgs == []
    await send(c, "P", b"x")
    resp, _ = await pull(c, "G", "P", 9, 0)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "queueId" in resp.remark
    cmd = request(RequestCode.PULL_MESSAGE, {"consumerGroup": "G", "topic": "P", "queueId": "0"})
    resp = await c.invoke(cmd, TIMEOUT)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "queueOffset" in resp.remark


async def test_auto_create_off_refuses_unknown_topic(broker_config, tmp_path) -> None:
    from txbroker.broker import Broker
    from txbroker.remoting.client import RemotingClient

    b = Broker(broker_config.replace(auto_create_topic=False))
    await b.start()
    client = RemotingClient(b.broker_addr)
    await client.connect()
    try:
        resp = await send(client, "Unknown", b"x")
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        # No auto-creation: the template topic has no route, so producers do not try.
        resp = await client.invoke(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}), TIMEOUT)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        resp = await client.invoke(request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": "Known", "readQueueNums": "2", "writeQueueNums": "2"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        assert (await send(client, "Known", b"x", queue_id=1)).code == ResponseCode.SUCCESS
    finally:
        await client.close()
        await b.stop()


async def test_shutdown_answers_held_pulls(broker_config) -> None:
    from txbroker.broker import Broker
    from txbroker.remoting.client import RemotingClient

    b = Broker(broker_config.replace(shutdown_grace=30.0))
    await b.start()
    client = RemotingClient(b.broker_addr)
    await client.connect()
    try:
        await create_topic(client, "Held")
        held = asyncio.create_task(pull(client, "G", "Held", 0, 0, suspend_ms=60_000, timeout=60,
                                        sys_flag=PULL_SUSPEND | PULL_SUBSCRIPTION))
        await eventually(lambda: b.holds.held() == 1, msg="the pull held")
        await asyncio.wait_for(b.stop(), 20)  # would take the whole 30 s grace if not woken
        resp, msgs = await asyncio.wait_for(held, 5)
        assert resp.code == ResponseCode.PULL_NOT_FOUND and msgs == []
    finally:
        await client.close()
        await b.stop()


async def test_failed_start_leaves_no_trace(broker_config) -> None:
    """Every listener is bound before the data dir is created: a clash on the last one bound
    (metrics) leaves nothing on disk and nothing locked, and a later start works."""
    import socket

    from txbroker.broker import Broker, ListenError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        b = Broker(broker_config.replace(metrics_port=port))
        with pytest.raises(ListenError, match=f"127.0.0.1:{port} \\(metrics port\\)"):
            await b.start()
        assert not broker_config.data_path.exists()
    finally:
        taken.close()
    b2 = Broker(broker_config)
    await b2.start()
    await b2.stop()


async def test_client_resend_to_retry_topic_goes_to_dlq_past_max(broker, broker_client) -> None:
    c = broker_client
    # The group heartbeats first (that makes it known and creates its retry topic).
    hb = await c.invoke(request(RequestCode.HEART_BEAT, body=heartbeat_body("c1", "RG", "T")), TIMEOUT)
    assert hb.code == ResponseCode.SUCCESS
    cmd = send_cmd("%RETRY%RG", b"again", queue_id=0)
    cmd.ext_fields["reconsumeTimes"] = "1"
    assert (await c.invoke(cmd, TIMEOUT)).code == ResponseCode.SUCCESS
    cmd = send_cmd("%RETRY%RG", b"dead", queue_id=0)
    cmd.ext_fields["reconsumeTimes"] = str(broker.config.max_reconsume_times)
    assert (await c.invoke(cmd, TIMEOUT)).code == ResponseCode.SUCCESS
    _, retry = await pull(c, "RG", "%RETRY%RG", 0, 0)
    _, dlq = await pull(c, "RG", "%DLQ%RG", 0, 0)
    assert [m.body for m in retry] == [b"again"] and [m.body for m in dlq] == [b"dead"]


async def test_send_to_retry_topic_of_unknown_group_refused(broker, broker_client) -> None:
    c = broker_client
    for topic, group in (("%RETRY%", "''"), ("%RETRY%nosuchgroup", "'nosuchgroup'")):
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
            resp = await send(c, topic, b"x", code=code)
            assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST == 26, resp.remark
            assert "subscription group not exist" in resp.remark and group in resp.remark
        assert broker.topics.get(topic) is None and broker.store.max_offset(topic, 0) == 0
    # A group that heartbeated may write its retry topic through a plain send.
    hb = await c.invoke(request(RequestCode.HEART_BEAT, body=heartbeat_body("c1", "known", "T")), TIMEOUT)
    assert hb.code == ResponseCode.SUCCESS
    assert (await send(c, "%RETRY%known", b"x")).code == ResponseCode.SUCCESS


async def test_consuming_requests_never_create_topics(broker, broker_client) -> None:
    c = broker_client
    for topic in ("NoSuchTopic", "%RETRY%NoSuchGroup", "%DLQ%NoSuchGroup"):
        resp, _ = await pull(c, "G", topic, 0, 0)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST == 17
        assert resp.remark == f"topic[{topic}] not exist, apply first please!"
        resp = await c.invoke(request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "G", "topic": topic, "queueId": "0", "commitOffset": "3"}), TIMEOUT)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST and topic in resp.remark
        resp = await c.invoke(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), TIMEOUT)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        assert broker.topics.get(topic) is None
    hb = await c.invoke(request(RequestCode.HEART_BEAT, body=heartbeat_body("c1", "G", "NoSuchTopic")),
                        TIMEOUT)
    assert hb.code == ResponseCode.SUCCESS
    assert broker.topics.get("NoSuchTopic") is None
    assert broker.topics.get("%RETRY%G") is not None  # the group's retry topic, as RocketMQ
    assert "G" not in broker.store.offsets.groups()


async def test_bad_group_names_are_named_as_groups(broker, broker_client) -> None:
    c = broker_client
    resp = await send(c, "T", b"x", group="bad group")
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert resp.remark.startswith("producer group name 'bad group' is invalid"), resp.remark
    resp, _ = await pull(c, "bad group", "T", 0, 0)
    assert resp.remark.startswith("consumer group name 'bad group' is invalid"), resp.remark
    resp = await c.invoke(request(RequestCode.HEART_BEAT, body=heartbeat_body("c1", "bad group", "T")),
                          TIMEOUT)
    assert resp.remark.startswith("consumer group name 'bad group' is invalid"), resp.remark
