"""Replay the requests a real RocketMQ C++ client sent (tests/vectors) against a real broker.

The header bytes are sent exactly as captured (numeric extFields, ``"0"``/``"1"`` booleans,
trailing newline, credentials fields, flag 0 even for one-way calls); bodies are rebuilt from
the capture's decoded form.  Every answer must be a response frame with string-valued
extFields and a code that client accepts for that request (docs/protocol.md §8.3).
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import orjson
import pytest

from txbroker.broker import Broker
from txbroker.remoting.codec import FrameDecoder
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.store.record import encode_batch

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
OK = {ResponseCode.SUCCESS}
ACCEPTED = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: OK,
    RequestCode.SEND_MESSAGE: OK,
    RequestCode.HEART_BEAT: OK,
    RequestCode.UNREGISTER_CLIENT: OK,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: OK | {ResponseCode.SYSTEM_ERROR},  # after unregister
    RequestCode.QUERY_CONSUMER_OFFSET: OK | {ResponseCode.QUERY_NOT_FOUND},
    RequestCode.UPDATE_CONSUMER_OFFSET: OK,
    RequestCode.GET_MAX_OFFSET: OK,
    RequestCode.PULL_MESSAGE: OK | {ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                                    ResponseCode.PULL_OFFSET_MOVED},
    # the capture's offsets (1000, 2000) were the recording server's, not ours
    RequestCode.CONSUMER_SEND_MSG_BACK: OK | {ResponseCode.SYSTEM_ERROR},
    RequestCode.LOCK_BATCH_MQ: OK,
    RequestCode.UNLOCK_BATCH_MQ: OK,
}
#: A consumer looks up its group's retry topic before its first heartbeat creates it, and
#: RocketMQ's name server answers that lookup TOPIC_NOT_EXIST too (the client looks again later).
RETRY_ROUTE_ACCEPTED = OK | {ResponseCode.TOPIC_NOT_EXIST}
#: The topic the captured clients used; it existed on the recording server.
CAPTURE_TOPIC = "TopicTest"
FILES = ["send_sync", "send_batch", "send_orderly", "send_large", "send_oneway", "send_tx_props",
         "pull_consumer", "push_consumer", "push_consumer_fail", "push_consumer_orderly",
         "producer_start"]


def _body(d: dict) -> bytes:
    b = d.get("body")
    if not isinstance(b, dict):
        return b""
    if b["kind"] == "json":
        return orjson.dumps(b["json"])
    if b["kind"] == "batch":
        return encode_batch([(m["flag"], m["body"].encode(), m["properties"]) for m in b["messages"]])
    return b["text"].encode()


def _requests(name: str) -> list[tuple[int, str, bytes]]:
    out = []
    for line in (VECTORS / f"{name}.jsonl").read_text().splitlines():
        d = orjson.loads(line)
        if d.get("dir") != "in":
            continue
        ext = d["header"].get("extFields", {})
        if str(ext.get("topic", "")).startswith("%RETRY%") and int(ext.get("queueId", 0)) > 0:
            continue  # the recording server routed 4 retry queues; txbroker routes 1 (RocketMQ)
        header = d["header_raw"].encode()
        body = _body(d)
        frame = struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body
        out.append((d["code"], str(ext.get("topic", "")), frame))
    return out


@pytest.mark.parametrize("name", FILES)
async def test_cpp_client_requests_are_answered(broker_config, name) -> None:
    b = Broker(broker_config.replace(max_pull_suspend=0.01))
    await b.start()
    await b.topics.get_or_create(CAPTURE_TOPIC)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.broker_port)
        decoder = FrameDecoder()
        pending: list = []
        try:
            for code, topic, frame in _requests(name):
                writer.write(frame)
                await writer.drain()
                while not pending:
                    data = await asyncio.wait_for(reader.read(65536), 10)
                    assert data, "broker closed the connection"
                    pending.extend(c for c in decoder.feed(data) if c.is_response)
                resp = pending.pop(0)
                accepted = ACCEPTED[code]
                if code == RequestCode.GET_ROUTEINFO_BY_TOPIC and topic.startswith("%RETRY%"):
                    accepted = RETRY_ROUTE_ACCEPTED
                assert resp.code in accepted, (code, resp.code, resp.remark)
                assert all(isinstance(v, str) for v in resp.ext_fields.values())
                if code == RequestCode.SEND_MESSAGE:
                    assert set(resp.ext_fields) >= {"msgId", "queueId", "queueOffset"}
        finally:
            writer.close()
    finally:
        await b.stop()
