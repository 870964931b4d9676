"""Request builders for the broker tests: RocketMQ frames exactly as clients send them.

Headers and the Java-style heartbeat are built with the SDK's own protocol model
(``remoting.headers`` / ``remoting.bodies``), so field names and the V2 short keys exist once;
the C++-style heartbeat stays hand-written because its point is to differ from what the
model writes.
"""

from __future__ import annotations

import time

import orjson

from txbroker.remoting.bodies import (
    ConsumeFromWhere,
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
)
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    SEND_V1_KEYS,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from txbroker.store.record import decode_records, properties_to_string

PULL_COMMIT = PULL_FLAG_COMMIT_OFFSET
PULL_SUSPEND = PULL_FLAG_SUSPEND
PULL_SUBSCRIPTION = PULL_FLAG_SUBSCRIPTION
TIMEOUT = 10.0


def send_ext(topic: str, *, group: str = "PG_TEST", queue_id: int = 0, sys_flag: int = 0,
             props: dict[str, str] | None = None, batch: bool = False) -> dict[str, str]:
    """SEND_MESSAGE's long-name header; tests may edit it before sending."""
    return SendMessageRequestHeader(
        producer_group=group, topic=topic, default_topic_queue_nums=4, queue_id=queue_id,
        sys_flag=sys_flag, born_timestamp=int(time.time() * 1000), flag=0,
        properties=properties_to_string(props or {}), batch=batch).to_ext()


def send_cmd(topic: str, body: bytes, *, code: int = RequestCode.SEND_MESSAGE, tags: str | None = None,
             props: dict[str, str] | None = None, **kw) -> RemotingCommand:
    p = dict(props or {})
    if tags:
        p["TAGS"] = tags
    p.setdefault("WAIT", "true")
    ext = send_ext(topic, props=p, **kw)
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        ext = {SEND_V1_KEYS[k]: v for k, v in ext.items()}
    return RemotingCommand.request(code, ext, body)


async def send(client, topic: str, body: bytes, **kw) -> RemotingCommand:
    return await client.invoke(send_cmd(topic, body, **kw), TIMEOUT)


def pull_cmd(group: str, topic: str, queue_id: int, offset: int, *, max_nums: int = 32,
             sys_flag: int = PULL_SUBSCRIPTION, subscription: str = "*", suspend_ms: int = 0,
             commit_offset: int = -1) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, PullMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset,
        max_msg_nums=max_nums, sys_flag=sys_flag, commit_offset=commit_offset,
        suspend_timeout_millis=suspend_ms, subscription=subscription, sub_version=0,
        expression_type="TAG").to_ext())


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
        return orjson.dumps({"clientID": client_id, "consumerDataSet": [cd], "producerDataSet": []})
    return HeartbeatData(client_id, consumer_data_set=[ConsumerData(
        group, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        subscription_data_set=[SubscriptionData(topic, sub_version=1)])]).encode()
