"""Request builders for the broker tests: RocketMQ frames exactly as clients send them."""

from __future__ import annotations

import time

import orjson

from txbroker.remoting.codec import RemotingCommand
from txbroker.remoting.codes import RequestCode
from txbroker.store.record import decode_records, properties_to_string

V2_KEYS = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d",
           "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i",
           "reconsumeTimes": "j", "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m"}

PULL_COMMIT = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
TIMEOUT = 10.0


def send_ext(topic: str, *, group: str = "PG_TEST", queue_id: int = 0, sys_flag: int = 0,
             props: dict[str, str] | None = None, batch: bool = False) -> dict[str, str]:
    return {
        "producerGroup": group, "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": str(sys_flag),
        "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": properties_to_string(props or {}), "reconsumeTimes": "0",
        "unitMode": "false", "batch": "true" if batch else "false",
    }


def send_cmd(topic: str, body: bytes, *, code: int = RequestCode.SEND_MESSAGE, tags: str | None = None,
             props: dict[str, str] | None = None, **kw) -> RemotingCommand:
    p = dict(props or {})
    if tags:
        p["TAGS"] = tags
    p.setdefault("WAIT", "true")
    ext = send_ext(topic, props=p, **kw)
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        ext = {V2_KEYS[k]: v for k, v in ext.items()}
    return RemotingCommand.request(code, ext, body)


async def send(client, topic: str, body: bytes, **kw) -> RemotingCommand:
    return await client.invoke(send_cmd(topic, body, **kw), TIMEOUT)


def pull_cmd(group: str, topic: str, queue_id: int, offset: int, *, max_nums: int = 32,
             sys_flag: int = PULL_SUBSCRIPTION, subscription: str = "*", suspend_ms: int = 0,
             commit_offset: int = -1) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id),
        "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag),
        "commitOffset": str(commit_offset), "suspendTimeoutMillis": str(suspend_ms),
        "subscription": subscription, "subVersion": "0", "expressionType": "TAG",
    })


async def pull(client, group: str, topic: str, queue_id: int, offset: int, *,
               timeout: float = TIMEOUT, **kw):
    resp = await client.invoke(pull_cmd(group, topic, queue_id, offset, **kw), timeout)
    msgs = decode_records(resp.body) if resp.body else []
    return resp, msgs


def request(code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    return RemotingCommand.request(code, ext or {}, body)


async def create_topic(client, topic: str, *, queues: int = 4) -> None:
    resp = await client.invoke(request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues),
        "perm": "6"}), TIMEOUT)
    assert resp.code == 0, resp.remark


def heartbeat_body(client_id: str, group: str, topic: str, *, cpp: bool = False) -> bytes:
    if cpp:  # C++ style: ordinals, subVersion as a string, empty sets left out
        cd = {"consumeFromWhere": 0, "consumeType": 1, "groupName": group, "messageModel": 1,
              "subscriptionDataSet": [{"subString": "TagA || TagB", "subVersion": "1795348495561",
                                       "codeSet": [0, 0], "tagsSet": ["TagA", "TagB"], "topic": topic}]}
    else:
        cd = {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
              "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
              "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [],
                                       "codeSet": [], "subVersion": 1, "expressionType": "TAG",
                                       "classFilterMode": False}]}
    return orjson.dumps({"clientID": client_id, "consumerDataSet": [cd], "producerDataSet": []})
