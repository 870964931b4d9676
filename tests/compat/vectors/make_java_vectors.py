"""Generate ``java_requests.jsonl``: frames a Java RocketMQ 4.9 client sends, and what it checks.

No Java client can run in CI here, so its requests are rebuilt from the protocol facts in
txbroker's protocol notes (``docs/protocol.md`` sections in brackets) with an encoder written in
this file, independent of ``txbroker.remoting``: if the broker's codec and this one disagree,
the compat test shows it.  Regenerate with::

    python tests/compat/vectors/make_java_vectors.py

Each line: ``name``, ``port`` (``broker`` or ``namesrv``), ``facts`` (where the layout comes
from), ``frame_hex`` (the whole frame, length prefix included), ``oneway`` (flag bit 2 set:
the broker must not answer) and ``expect`` (what the Java client needs in the answer; the
test reads it).  Frame contents are deterministic (fixed timestamps and ids) so the file is
reviewable and stable.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

OUT = Path(__file__).with_name("java_requests.jsonl")

TOPIC = "JavaVecTopic"
PRODUCER_GROUP = "PID_JAVA_VEC"
CONSUMER_GROUP = "CID_JAVA_VEC"
CLIENT_ID = "127.0.0.1@4242"
BORN_MS = "1795000000000"
JAVA_VERSION = 409  # MQVersion.Version.V4_9_8 ordinal [2.4]
FLAG_ONEWAY = 0x2  # RemotingCommand RPC_ONEWAY bit [2.1]
LANG_JAVA = 0  # LanguageCode.JAVA [2.3]
V2_KEYS = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d",
           "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i",
           "reconsumeTimes": "j", "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m"}  # [4.1]


def props(d: dict[str, str]) -> str:
    """Java messageProperties2String: name 0x01 value, joined by 0x02, no trailing 0x02 [5.3]."""
    return "\x02".join(f"{k}\x01{v}" for k, v in d.items())


def java_hash(s: str) -> int:
    """Java String.hashCode (the tag code in SubscriptionData.codeSet)."""
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def json_frame(code: int, opaque: int, ext: dict[str, str] | None, body: bytes = b"", *,
               flag: int = 0) -> bytes:
    """fastjson toJSONString of RemotingCommand: sorted keys, enums by name, no newline [2]."""
    header = {"code": code, "flag": flag, "language": "JAVA", "opaque": opaque,
              "serializeTypeCurrentRPC": "JSON", "version": JAVA_VERSION}
    if ext is not None:
        header["extFields"] = ext  # makeCustomHeaderToNet: every value a string [2]
    h = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body  # [1]


def binary_frame(code: int, opaque: int, ext: dict[str, str], body: bytes = b"", *,
                 flag: int = 0) -> bytes:
    """RocketMQSerializable.rocketMQProtocolEncode, serialize type 1 in the high byte [1.1]."""
    fields = b""
    for k, v in ext.items():
        kb, vb = k.encode(), v.encode()
        fields += struct.pack(">h", len(kb)) + kb + struct.pack(">i", len(vb)) + vb
    h = (struct.pack(">hbhii", code, LANG_JAVA, JAVA_VERSION, opaque, flag)
         + struct.pack(">i", 0)  # remark: null
         + struct.pack(">i", len(fields)) + fields)
    return struct.pack(">ii", 4 + len(h) + len(body), (1 << 24) | len(h)) + h + body


def send_ext_v2(queue_id: int, properties: str, *, batch: bool = False) -> dict[str, str]:
    long_names = {
        "producerGroup": PRODUCER_GROUP, "topic": TOPIC, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": "0",
        "bornTimestamp": BORN_MS, "flag": "0", "properties": properties, "reconsumeTimes": "0",
        "unitMode": "false", "batch": "true" if batch else "false",
    }
    return {V2_KEYS[k]: v for k, v in long_names.items()}


def uniq(n: int) -> str:
    """A Java-layout UNIQ_KEY: IP, pid, class-loader hash, time, counter, uppercase hex [6.3]."""
    return f"7F000001105A6F2A0B6B2F5C{n:08X}"


def batch_body(entries: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """MessageDecoder.encodeMessage per entry: size, magic 0, crc 0, flag, body, props [5.4]."""
    out = b""
    for body, p in entries:
        pb = props(p).encode()
        size = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(pb)
        out += struct.pack(">iiiii", size, 0, 0, 0, len(body)) + body + struct.pack(">h", len(pb)) + pb
    return out


def vectors() -> list[dict]:
    v: list[dict] = []

    def add(name, port, facts, frame, expect, oneway=False):
        v.append({"name": name, "port": port, "facts": facts, "frame_hex": frame.hex(),
                  "oneway": oneway, "expect": expect})

    single = props({"KEYS": "JK1 JK2", "TAGS": "TagA", "UNIQ_KEY": uniq(1), "WAIT": "true",
                    "color": "red"})
    add("send_v2", "broker", "4.1 short names a..m, 4.2 response, 2 JSON header",
        json_frame(310, 1, send_ext_v2(1, single), b"java v2 body"),
        {"code": 0, "serialize_type": 0, "string_ext": ["msgId", "queueId", "queueOffset"],
         "stored": [{"body": "java v2 body", "queue_id": 1, "KEYS": "JK1 JK2", "TAGS": "TagA",
                     "UNIQ_KEY": uniq(1), "color": "red"}]})

    entries = [(f"java batch {i}".encode(), {"KEYS": f"BK{i}", "TAGS": "TagB",
                                             "UNIQ_KEY": uniq(10 + i), "WAIT": "true"})
               for i in range(3)]
    add("send_batch", "broker", "3.1 code 320, 4.1 V2 header m=true, 5.4 batch body",
        json_frame(320, 2, send_ext_v2(2, props({"WAIT": "true"}), batch=True), batch_body(entries)),
        {"code": 0, "serialize_type": 0, "string_ext": ["msgId", "queueId", "queueOffset"],
         "stored": [{"body": b.decode(), "queue_id": 2, "KEYS": p["KEYS"], "TAGS": "TagB",
                     "UNIQ_KEY": p["UNIQ_KEY"]} for b, p in entries]})

    bin_props = props({"TAGS": "TagR", "UNIQ_KEY": uniq(20), "WAIT": "true"})
    add("send_v2_binary", "broker", "1.1 ROCKETMQ serialization, 1.2 response in the request's type",
        binary_frame(310, 3, send_ext_v2(3, bin_props), b"java binary body"),
        {"code": 0, "serialize_type": 1, "string_ext": ["msgId", "queueId", "queueOffset"],
         "stored": [{"body": "java binary body", "queue_id": 3, "TAGS": "TagR",
                     "UNIQ_KEY": uniq(20)}]})

    ow_props = props({"TAGS": "TagO", "UNIQ_KEY": uniq(30), "WAIT": "true"})
    add("send_v2_oneway", "broker", "2.1 flag bit 2: one-way, never answered",
        json_frame(310, 4, send_ext_v2(0, ow_props), b"java oneway body", flag=FLAG_ONEWAY),
        {"stored": [{"body": "java oneway body", "queue_id": 0, "TAGS": "TagO",
                     "UNIQ_KEY": uniq(30)}]}, oneway=True)

    add("send_v2_binary_oneway", "broker", "1.1 + 2.1: binary and one-way",
        binary_frame(310, 5, send_ext_v2(0, props({"UNIQ_KEY": uniq(31), "WAIT": "true"})),
                     b"java binary oneway", flag=FLAG_ONEWAY),
        {"stored": [{"body": "java binary oneway", "queue_id": 0, "UNIQ_KEY": uniq(31)}]},
        oneway=True)

    heartbeat = {
        "clientID": CLIENT_ID,
        "consumerDataSet": [{
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
            "groupName": CONSUMER_GROUP, "messageModel": "CLUSTERING",
            "subscriptionDataSet": [{
                "classFilterMode": False, "codeSet": [java_hash("TagA")], "expressionType": "TAG",
                "subString": "TagA", "subVersion": 1795000000000, "tagsSet": ["TagA"],
                "topic": TOPIC}],
            "unitMode": False}],
        "producerDataSet": [{"groupName": PRODUCER_GROUP}, {"groupName": "CLIENT_INNER_PRODUCER"}],
    }
    add("heartbeat_enum_names", "broker", "4.9 HeartbeatData, enums by name (fastjson)",
        json_frame(34, 6, {}, json.dumps(heartbeat, sort_keys=True, separators=(",", ":")).encode()),
        {"code": 0, "serialize_type": 0})
    add("consumer_list_after_heartbeat", "broker", "4.7 GET_CONSUMER_LIST_BY_GROUP",
        json_frame(38, 7, {"consumerGroup": CONSUMER_GROUP}),
        {"code": 0, "serialize_type": 0, "body_json": {"consumerIdList": [CLIENT_ID]}})

    add("update_offset_oneway", "broker", "3.1 UPDATE_CONSUMER_OFFSET is one-way from Java, 4.6",
        json_frame(15, 8, {"commitOffset": "1", "consumerGroup": CONSUMER_GROUP, "queueId": "1",
                           "topic": TOPIC}, flag=FLAG_ONEWAY),
        {"offset": {"group": CONSUMER_GROUP, "topic": TOPIC, "queue_id": 1, "value": 1}},
        oneway=True)
    add("query_offset", "broker", "4.6 QUERY_CONSUMER_OFFSET answers the committed offset",
        json_frame(14, 9, {"consumerGroup": CONSUMER_GROUP, "queueId": "1", "topic": TOPIC}),
        {"code": 0, "serialize_type": 0, "ext": {"offset": "1"}})

    add("route_standard_json", "namesrv", "4.9 TopicRouteData, version >= 401: standard JSON",
        json_frame(105, 10, {"topic": TOPIC}),
        {"code": 0, "serialize_type": 0, "route": "standard"})
    old = json_frame(105, 11, {"topic": TOPIC})
    old_header = json.loads(old[8:])
    old_header["version"] = 63  # a pre-4.9.4 client ordinal: gets fastjson's default output
    h = json.dumps(old_header, sort_keys=True, separators=(",", ":")).encode()
    add("route_fastjson_unquoted", "namesrv", "4.9 version < 401: brokerAddrs keys unquoted",
        struct.pack(">ii", 4 + len(h), len(h)) + h,
        {"code": 0, "serialize_type": 0, "route": "fastjson"})
    add("route_accept_standard_json", "namesrv", "4.8 acceptStandardJsonOnly=true",
        json_frame(105, 12, {"acceptStandardJsonOnly": "true", "topic": TOPIC}),
        {"code": 0, "serialize_type": 0, "route": "standard"})
    add("route_binary", "namesrv", "1.2 a binary request gets a binary answer",
        binary_frame(105, 13, {"topic": TOPIC}),
        {"code": 0, "serialize_type": 1, "route": "standard"})
    return v


def main() -> None:
    with OUT.open("w") as f:
        for vec in vectors():
            f.write(json.dumps(vec, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
