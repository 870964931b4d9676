"""Typed headers and JSON bodies: conversions, validation, both writers' dialects."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txbroker.remoting.bodies import (
    BodyError,
    BrokerData,
    ClusterInfo,
    ConsumeFromWhere,
    ConsumerListBody,
    ConsumeType,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    QueueData,
    TopicRouteData,
    wants_standard_json,
)
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.headers import (
    CheckTransactionStateRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    GetRouteInfoRequestHeader,
    HeaderError,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    TxnDecideRequestHeader,
    TxnListRequestHeader,
    TxnShowRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors"

SEND = {"producerGroup": "PG", "topic": "T", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "2", "sysFlag": "4", "bornTimestamp": "1795348921082", "flag": "0",
        "properties": "TRAN_MSG\x01true\x02", "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}


def test_send_v1_v2_and_batch_are_one_type() -> None:
    v1 = SendMessageRequestHeader.from_ext(SEND)
    assert v1.queue_id == 2 and v1.sys_flag == 4 and v1.born_timestamp == 1795348921082
    assert v1.batch is False and v1.unit_mode is False and v1.max_reconsume_times is None
    v2_ext = v1.to_ext_v2()
    assert v2_ext["a"] == "PG" and v2_ext["e"] == "2" and v2_ext["m"] == "false"
    assert SendMessageRequestHeader.from_command(RequestCode.SEND_MESSAGE_V2, v2_ext) == v1
    batch = SendMessageRequestHeader.from_command(RequestCode.SEND_BATCH_MESSAGE, v2_ext)
    assert batch.batch is True
    assert SendMessageRequestHeader.from_ext(v1.to_ext()) == v1
    # negative queue id: the broker picks
    assert SendMessageRequestHeader.from_ext({**SEND, "queueId": "-1"}).queue_id == -1


@pytest.mark.parametrize("text, value", [("true", True), ("TRUE", True), ("1", True), (" True ", True),
                                         ("0", False), ("false", False), ("", False)])
def test_booleans(text: str, value: bool) -> None:
    assert SendMessageRequestHeader.from_ext({**SEND, "batch": text}).batch is value


@pytest.mark.parametrize("text", ["yes", "maybe", "2", "tru"])
def test_ill_typed_booleans_are_refused(text: str) -> None:
    with pytest.raises(HeaderError, match="'batch' must be a boolean") as info:
        SendMessageRequestHeader.from_ext({**SEND, "batch": text})
    assert info.value.code == ResponseCode.SYSTEM_ERROR


@pytest.mark.parametrize("ext, field", [
    ({k: v for k, v in SEND.items() if k != "topic"}, "missing header field 'topic'"),
    ({**SEND, "topic": ""}, "header field 'topic' is empty"),
    ({**SEND, "queueId": "x"}, "'queueId' must be an integer"),
    ({**SEND, "queueId": "1.5"}, "'queueId' must be an integer"),
    ({**SEND, "queueId": "1_0"}, "'queueId' must be an integer"),
    ({**SEND, "queueId": "\u00b2"}, "'queueId' must be an integer"),  # a digit int() refuses
    ({**SEND, "unitMode": "yes"}, "'unitMode' must be a boolean"),
    ({**SEND, "queueId": "4294967296"}, "'queueId' = 4294967296 is out of range"),
    ({**SEND, "bornTimestamp": "-5"}, "'bornTimestamp' = -5 must be >= 0"),
    ({**SEND, "sysFlag": "abc"}, "'sysFlag' must be an integer"),
])
def test_send_header_errors_name_the_field(ext, field: str) -> None:
    with pytest.raises(HeaderError) as info:
        SendMessageRequestHeader.from_ext(ext)
    assert field in info.value.remark and info.value.code == ResponseCode.SYSTEM_ERROR


def test_v2_errors_name_the_short_key() -> None:
    ext = SendMessageRequestHeader.from_ext(SEND).to_ext_v2()
    del ext["b"]
    with pytest.raises(HeaderError, match=r"'b' \(topic\)"):
        SendMessageRequestHeader.from_ext_v2(ext)


def test_send_response_header_strings_only() -> None:
    h = SendMessageResponseHeader(msg_id="7F000001000051AF0000000000000000", queue_id=1, queue_offset=42)
    ext = h.to_ext()
    assert ext == {"msgId": "7F000001000051AF0000000000000000", "queueId": "1", "queueOffset": "42",
                   "MSG_REGION": "DefaultRegion", "TRACE_ON": "false"}
    assert SendMessageResponseHeader.from_ext(ext) == h


PULL = {"commitOffset": "-1", "consumerGroup": "CID", "maxMsgNums": "32", "queueId": "0",
        "queueOffset": "0", "subVersion": "0", "subscription": "*", "suspendTimeoutMillis": "20000",
        "sysFlag": "7", "topic": "TopicTest"}


def test_pull_header_and_ranges() -> None:
    h = PullMessageRequestHeader.from_ext(PULL)
    assert h.commit_offset == -1 and h.commit_offset_enabled and h.suspend and h.has_subscription
    assert PullMessageRequestHeader.from_ext(h.to_ext()) == h
    for key, bad in (("maxMsgNums", "0"), ("queueId", "-1"), ("queueOffset", "-3")):
        with pytest.raises(HeaderError, match=key):
            PullMessageRequestHeader.from_ext({**PULL, key: bad})
    resp = PullMessageResponseHeader(next_begin_offset=5, min_offset=0, max_offset=5).to_ext()
    assert resp == {"suggestWhichBrokerId": "0", "nextBeginOffset": "5", "minOffset": "0", "maxOffset": "5"}


def test_transaction_headers() -> None:
    end = {"producerGroup": "PG", "tranStateTableOffset": "3", "commitLogOffset": "1000",
           "commitOrRollback": "8", "fromTransactionCheck": "1", "msgId": "AB"}
    h = EndTransactionRequestHeader.from_ext(end)
    assert h.commit_or_rollback == 8 and h.from_transaction_check is True and h.transaction_id is None
    with pytest.raises(HeaderError, match="commitOrRollback"):
        EndTransactionRequestHeader.from_ext({**end, "commitOrRollback": "5"})
    check = CheckTransactionStateRequestHeader(tran_state_table_offset=0, commit_log_offset=0,
                                               msg_id="U", transaction_id="U", offset_msg_id="O")
    assert check.to_ext() == {"tranStateTableOffset": "0", "commitLogOffset": "0", "msgId": "U",
                              "transactionId": "U", "offsetMsgId": "O"}


def test_admin_and_misc_headers() -> None:
    assert TxnListRequestHeader.from_ext({}).state == "pending"
    with pytest.raises(HeaderError, match="'state' must be one of"):
        TxnListRequestHeader.from_ext({"state": "weird"})
    assert TxnShowRequestHeader.from_ext({"id": "X"}).id == "X"
    d = TxnDecideRequestHeader.from_ext({"id": "X", "decision": "rollback", "operator": "ann"})
    assert d.decision == "rollback" and d.reason is None
    with pytest.raises(HeaderError, match="'decision' must be one of commit, rollback, resume"):
        TxnDecideRequestHeader.from_ext({"id": "X", "decision": "maybe", "operator": "ann"})
    with pytest.raises(HeaderError, match="missing header field 'operator'"):
        TxnDecideRequestHeader.from_ext({"id": "X", "decision": "commit"})
    assert GetRouteInfoRequestHeader.from_ext({"topic": "T", "acceptStandardJsonOnly": "true"}).accept_standard_json_only
    u = UnregisterClientRequestHeader.from_ext({"clientID": "c", "consumerGroup": "", "producerGroup": "P"})
    assert u.consumer_group == "" and u.producer_group == "P"
    back = ConsumerSendMsgBackRequestHeader.from_ext({"delayLevel": "0", "group": "G", "offset": "1000"})
    assert back.offset == 1000 and back.origin_msg_id is None
    t = CreateTopicRequestHeader.from_ext({"topic": "T", "readQueueNums": "8", "writeQueueNums": "8"})
    assert t.perm == 6 and t.default_topic == "TBW102" and not t.order
    with pytest.raises(HeaderError, match="readQueueNums"):
        CreateTopicRequestHeader.from_ext({"topic": "T", "readQueueNums": "0", "writeQueueNums": "8"})
    q = {"consumerGroup": "G", "topic": "T", "queueId": "1"}
    assert QueryConsumerOffsetRequestHeader.from_ext(q).queue_id == 1
    assert UpdateConsumerOffsetRequestHeader.from_ext({**q, "commitOffset": "7"}).commit_offset == 7
    assert SearchOffsetRequestHeader.from_ext({"topic": "T", "queueId": "0", "timestamp": "5"}).timestamp == 5
    assert OffsetResponseHeader(offset=9).to_ext() == {"offset": "9"}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(SEND) + ["a", "b", "zz"]), st.text(max_size=12), max_size=14))
def test_header_decoding_only_raises_header_error(ext) -> None:
    for cls in (SendMessageRequestHeader, PullMessageRequestHeader, EndTransactionRequestHeader):
        try:
            h = cls.from_ext(ext)
        except HeaderError as exc:
            assert exc.remark
        else:
            assert cls.from_ext(h.to_ext()) == h
    try:
        h = SendMessageRequestHeader.from_ext_v2(ext)
    except HeaderError as exc:
        assert exc.remark
    else:
        assert SendMessageRequestHeader.from_ext_v2(h.to_ext_v2()) == h


# --- bodies ------------------------------------------------------------------------------------


def _captured_bodies(code: int):
    for path in sorted(VECTORS.glob("*.jsonl")):
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            if line.get("dir") == "in" and line["code"] == code and isinstance(line.get("body"), dict):
                yield orjson.dumps(line["body"]["json"])


def test_cpp_heartbeats_parse() -> None:
    bodies = list(_captured_bodies(RequestCode.HEART_BEAT))
    assert bodies
    kinds = set()
    for body in bodies:
        hb = HeartbeatData.decode(body)
        assert hb.client_id.endswith("@DEFAULT")
        for c in hb.consumer_data_set:
            kinds.add(c.consume_type)
            assert c.message_model == MessageModel.CLUSTERING
            assert c.consume_from_where == ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
            for s in c.subscription_data_set:
                assert s.sub_version >= 0 and s.topic
    assert kinds == {ConsumeType.CONSUME_ACTIVELY, ConsumeType.CONSUME_PASSIVELY}


def test_java_heartbeat_round_trip() -> None:
    java = {"clientID": "c1", "producerDataSet": [{"groupName": "PG"}], "consumerDataSet": [{
        "groupName": "CG", "consumeType": "CONSUME_PASSIVELY", "messageModel": "BROADCASTING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "T", "subString": "A || B", "tagsSet": ["A", "B"],
                                 "codeSet": [65, 66], "subVersion": 17, "expressionType": "TAG",
                                 "classFilterMode": False}]}]}
    hb = HeartbeatData.decode(orjson.dumps(java))
    assert hb.producer_data_set[0].group_name == "PG"
    c = hb.consumer_data_set[0]
    assert c.message_model == MessageModel.BROADCASTING and c.subscription_data_set[0].code_set == [65, 66]
    assert HeartbeatData.decode(hb.encode()) == hb
    only_producer = HeartbeatData.decode(b'{"clientID":"x","producerDataSet":[{"groupName":"P"}]}')
    assert only_producer.consumer_data_set == []


@pytest.mark.parametrize("body, message", [
    (b"", "empty"), (b"{nope", "not valid JSON"), (b"[]", "JSON object"),
    (b'{"producerDataSet":[]}', "missing 'clientID'"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":9}]}', "ConsumeType"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","messageModel":"X"}]}', "MessageModel"),
    (b'{"clientID":"c","consumerDataSet":[1]}', "must be objects"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"topic":"t","subVersion":"x"}]}]}', "subVersion"),
])
def test_bad_heartbeats(body: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message) as info:
        HeartbeatData.decode(body)
    assert isinstance(info.value, HeaderError)


def test_route_fastjson_and_standard_forms() -> None:
    route = TopicRouteData(queue_datas=[QueueData("broker-a", 4, 4, 6, 0)],
                           broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})])
    old = route.encode()
    assert b'"brokerAddrs":{0:"127.0.0.1:10911"}' in old
    std = route.encode(standard_json=True)
    assert orjson.loads(std)["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
    assert TopicRouteData.decode(old) == TopicRouteData.decode(std) == route
    assert wants_standard_json(409) and not wants_standard_json(63)
    assert wants_standard_json(63, accept_standard_json_only=True)


def test_route_decode_of_captured_answer_and_tricky_strings() -> None:
    captured = (VECTORS / "send_sync.jsonl").read_text().splitlines()
    answers = [json.loads(x) for x in captured]
    body = next(a["body"] for a in answers if a.get("dir") == "out" and a.get("code") == 0
                and isinstance(a.get("body"), str) and "brokerDatas" in a["body"])
    route = TopicRouteData.decode(body.encode())
    assert route.broker_datas[0].master_addr() == "127.0.0.1:20911"
    # a string value that looks like a numeric key must be left alone
    tricky = BrokerData("c,1:x", "b{2:y", {0: "h,3:z", 1: "127.0.0.2:1"})
    r2 = TopicRouteData(broker_datas=[tricky], order_topic_conf="b:4")
    assert TopicRouteData.decode(r2.encode()) == r2


def test_other_bodies_round_trip() -> None:
    assert ConsumerListBody.decode(ConsumerListBody(["a", "b"]).encode()).consumer_id_list == ["a", "b"]
    mqs = [MessageQueue("T", "broker-a", i) for i in range(3)]
    req = LockBatchRequestBody("CG", "cid", mqs)
    assert LockBatchRequestBody.decode(req.encode()) == req
    cpp = b'{"clientId":"c","consumerGroup":"G","mqSet":[{"brokerName":"b","queueId":0,"topic":"T"},' \
          b'{"brokerName":"b","queueId":0,"topic":"T"}]}'
    assert LockBatchRequestBody.decode(cpp).mq_set == [MessageQueue("T", "b", 0)]  # a set
    with pytest.raises(BodyError, match="queueId"):
        LockBatchRequestBody.decode(b'{"clientId":"c","consumerGroup":"G","mqSet":[{"brokerName":"b","topic":"T"}]}')
    resp = LockBatchResponseBody(mqs[:2])
    assert LockBatchResponseBody.decode(resp.encode()) == resp
    kv = KVTable({"b": "2", "a": "1"})
    assert kv.encode() == b'{"table":{"a":"1","b":"2"}}' and KVTable.decode(kv.encode()) == kv
    info = ClusterInfo({"broker-a": BrokerData("C", "broker-a", {0: "127.0.0.1:1"})}, {"C": ["broker-a"]})
    assert b"{0:" in info.encode() and ClusterInfo.decode(info.encode()) == info
    assert ClusterInfo.decode(info.encode(standard_json=True)) == info
