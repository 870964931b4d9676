"""Pure parts of the SDK, no broker: ids, allocation, offsets, tags, validation, conversion."""

from __future__ import annotations

import random
import re
import zlib
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txbroker.client import Consumer, Producer, TransactionListener, TransactionProducer
from txbroker.client.message import (
    Message,
    MessageExt,
    UniqKeyGenerator,
    wire_body,
)
from txbroker.client.namesrv import TopicRoute, parse_addresses
from txbroker.client.rebalance import MessageQueue, OffsetTracker, allocate_average
from txbroker.store import record as rec


def test_uniq_key_java_layout() -> None:
    now = datetime(2026, 11, 22, 23, 0, 0, tzinfo=UTC).timestamp()
    gen = UniqKeyGenerator("10.1.2.3", pid=0x12345, clock=lambda: now)
    a, b = gen.next(), gen.next()
    assert re.fullmatch(r"[0-9A-F]{32}", a) and a != b
    raw = bytes.fromhex(a)
    assert raw[:4] == bytes([10, 1, 2, 3])  # IP in network order, not byte-reversed like C++
    assert raw[4:6] == b"\x23\x45"  # low 16 bits of the pid
    assert a[:20] == b[:20]  # fixed prefix: ip + pid + per-process random
    # ms since the start of the month (local time), then a 16-bit counter
    local = datetime.fromtimestamp(now).astimezone()
    month_start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    assert int.from_bytes(raw[10:14], "big") == int((now - month_start.timestamp()) * 1000)
    assert (int.from_bytes(bytes.fromhex(b)[14:16], "big") - int.from_bytes(raw[14:16], "big")) % 65536 == 1
    # ids never collide within one process
    assert len({gen.next() for _ in range(5000)}) == 5000


def test_uniq_key_rolls_over_the_month() -> None:
    t = [datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()]
    gen = UniqKeyGenerator(clock=lambda: t[0])
    first = int(gen.next()[20:28], 16)
    t[0] += 86400 * 2  # into January
    second = int(gen.next()[20:28], 16)
    assert second < first


def _queues(n: int, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, "broker-a", q) for q in range(n)]


@pytest.mark.parametrize("n_queues,n_members", [(4, 1), (4, 2), (4, 3), (8, 3), (3, 5), (16, 4), (1, 2)])
def test_average_allocation_is_a_partition(n_queues: int, n_members: int) -> None:
    queues = _queues(n_queues)
    members = [f"c{i}" for i in range(n_members)]
    shares = [allocate_average(list(reversed(queues)), members, m) for m in reversed(members)]
    flat = [q for s in shares for q in s]
    assert sorted(flat) == sorted(queues)  # every queue exactly once
    sizes = sorted(len(s) for s in shares)
    assert sizes[-1] - sizes[0] <= 1
    for s in shares:  # contiguous blocks
        ids = [q.queue_id for q in s]
        assert ids == list(range(ids[0], ids[0] + len(ids))) if ids else True


def test_allocation_java_example_and_strangers() -> None:
    # RocketMQ's AllocateMessageQueueAveragely: 8 queues, 3 consumers -> 3, 3, 2
    q = _queues(8)
    assert [m.queue_id for m in allocate_average(q, ["a", "b", "c"], "a")] == [0, 1, 2]
    assert [m.queue_id for m in allocate_average(q, ["a", "b", "c"], "b")] == [3, 4, 5]
    assert [m.queue_id for m in allocate_average(q, ["a", "b", "c"], "c")] == [6, 7]
    assert allocate_average(q, ["a", "b"], "stranger") == []
    assert allocate_average([], ["a"], "a") == []


def test_offset_tracker_commits_smallest_unacked() -> None:
    t = OffsetTracker(10)
    assert t.committable() == 10
    t.pulled([10, 11, 12], 13)
    assert t.committable() == 10 and t.in_flight == 3
    t.ack(11)
    assert t.committable() == 10  # 10 still in flight: never skip it
    t.ack(10)
    assert t.committable() == 12
    t.ack(12)
    assert t.committable() == 13
    t.moved(15)  # filtered-out messages move the position without being delivered
    assert t.committable() == 15
    t.ack(99)  # unknown offsets are ignored
    t.pulled([15, 16], 17)
    t.reset(16)
    assert t.committable() == 16 and t.next_pull == 16


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("pull"), st.lists(st.integers(0, 60), max_size=6)),
    st.tuples(st.just("ack"), st.integers(0, 60)),
    st.tuples(st.just("ack_oldest"), st.just(0))), max_size=40))
def test_offset_tracker_matches_a_sorted_list(steps) -> None:
    """In-order pulls and oldest-first acks take shortcuts; any order must give what a plain
    sorted list of in-flight offsets gives."""
    t, model, next_pull = OffsetTracker(0), [], 0
    for op, arg in steps:
        if op == "pull":
            t.pulled(arg, 61)
            model, next_pull = sorted(model + arg), 61
        else:
            offset = model[0] if op == "ack_oldest" and model else arg
            t.ack(offset)
            if offset in model:
                model.remove(offset)
        assert t._in_flight == model
        assert t.committable() == (model[0] if model else next_pull)


def test_subscribe_reads_expressions_as_rocketmq() -> None:
    """The SDK's subscriptions go through remoting.filter (tests/remoting/test_filter.py has
    the table); the SDK adds only its refusals: no part at all, a non-string, a tag the
    properties string cannot carry."""
    c = Consumer("CG")
    c.subscribe("T", "A || B ||")
    assert c._subs["T"].selected.tags == {"A", "B"}
    wire = c._consumer_data().subscription_data_set[0]
    assert wire.sub_string == "A || B ||" and wire.tags_set == ["A", "B"]
    assert wire.code_set == [rec.tag_hash("A"), rec.tag_hash("B")]
    c.subscribe("T", "")
    assert c._subs["T"].selected.matches_all
    with pytest.raises(ValueError, match="has no tag"):
        c.subscribe("T", "||")
    with pytest.raises(ValueError, match="reserved control character"):
        c.subscribe("T", "A\x02B")
    with pytest.raises(TypeError):
        c.subscribe("T", 5)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs,error", [
    ({"topic": "bad topic"}, "contains one or more characters other than"),
    ({"topic": ""}, "the empty string is not allowed"),
    ({"topic": "T" * 250}, "longer than the max allowed length 249"),
    ({"body": b""}, "empty"),
    ({"tags": "A||B"}, "may not contain"),
    ({"keys": ["ok", "has space"]}, "no spaces"),
    ({"properties": {"TRAN_MSG": "true"}}, "reserved"),
    ({"properties": {"k": "v\x02"}}, "control character"),
    ({"properties": {"k": ""}}, "non-empty"),
    ({"delay_level": 19}, "delay_level"),
    ({"delay_level": -1}, "delay_level"),
])
def test_message_validation(kwargs: dict, error: str) -> None:
    fields = {"topic": "T", "body": b"x", **kwargs}
    with pytest.raises(ValueError, match=error):
        Message(**fields).validate()


def test_wire_body_compresses_only_when_it_shrinks() -> None:
    text = b"hello " * 2000
    packed, flag = wire_body(text, 4096, 1024)  # the limit applies to the compressed size
    assert flag == rec.COMPRESSED_FLAG and zlib.decompress(packed) == text
    assert wire_body(b"small", 4096, 1024) == (b"small", 0)  # under the threshold
    noise = random.Random(6).randbytes(8192)  # zlib makes random bytes longer: sent as is
    assert wire_body(noise, 4096, 8192) == (noise, 0)
    assert wire_body(text, 0, len(text)) == (text, 0)  # threshold 0: never compressed


@pytest.mark.parametrize("body,threshold,error", [
    (random.Random(6).randbytes(8192), 4096,
     r"^message body is 8,192 bytes \(8,\d{3} compressed\), over the 4,096-byte limit$"),
    (b"x" * 5000, 0, r"^message body is 5,000 bytes, over the 4,096-byte limit$"),
])
def test_wire_body_over_the_limit(body: bytes, threshold: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        wire_body(body, threshold, 4096)


def test_body_type_checked() -> None:
    with pytest.raises(TypeError):
        Message("T", "text").validate()  # type: ignore[arg-type]


def test_wire_properties() -> None:
    m = Message("T", b"x", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}, delay_level=3)
    m.validate()
    props = m.wire_properties("UNIQ")
    assert props == {"color": "red", "KEYS": "k1 k2", "TAGS": "TagA", "DELAY": "3",
                     "UNIQ_KEY": "UNIQ", "WAIT": "true"}
    assert Message("T", b"x", keys="a b").key_list() == ["a", "b"]


def test_message_ext_from_stored_decompresses() -> None:
    body = b"hello " * 2000
    packed, flag = wire_body(body, 4096, 4096)
    stored_msg = rec.Message(topic="T", queue_id=2, body=packed, sys_flag=flag,
                             properties={"UNIQ_KEY": "AB" * 16, "TAGS": "t", "KEYS": "k1 k2"},
                             born_timestamp=5, born_host=("127.0.0.1", 1234))
    raw = rec.encode_record(stored_msg, physical_offset=777, queue_offset=9, store_timestamp=6,
                            store_host=("127.0.0.1", 10911))
    ext = MessageExt.from_stored(rec.decode_record(raw), "broker-a")
    assert ext.body == body and ext.tags == "t" and ext.key_list == ["k1", "k2"]
    assert ext.msg_id == "AB" * 16
    assert rec.decode_offset_msg_id(ext.offset_msg_id) == ("127.0.0.1", 10911, 777)
    assert (ext.queue_id, ext.queue_offset, ext.commit_log_offset) == (2, 9, 777)
    assert ext.transaction_id is None and ext.broker_name == "broker-a"
    # no UNIQ_KEY: msg_id falls back to the offsetMsgId
    stored_msg.properties = {}
    raw = rec.encode_record(stored_msg, physical_offset=1, queue_offset=0, store_timestamp=6,
                            store_host=("127.0.0.1", 10911))
    ext = MessageExt.from_stored(rec.decode_record(raw))
    assert ext.msg_id == ext.offset_msg_id


def test_route_parsing_both_dialects() -> None:
    fastjson = (b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",'
                b'"cluster":"C"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a",'
                b'"perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":2}]}')
    r = TopicRoute.parse("T", fastjson)
    assert r.brokers == {"broker-a": "127.0.0.1:10911"}
    assert [q.queue_id for q in r.write_queues()] == [0, 1]
    assert [q.queue_id for q in r.read_queues()] == [0, 1, 2, 3]
    std = fastjson.replace(b"{0:", b'{"0":').replace(b'"perm":6', b'"perm":4')
    r = TopicRoute.parse("T", std)
    assert r.write_queues() == [] and len(r.read_queues()) == 4


def test_namesrv_addresses() -> None:
    assert parse_addresses("127.0.0.1:9876") == ["127.0.0.1:9876"]
    assert parse_addresses("127.0.0.1:1;127.0.0.1:2") == ["127.0.0.1:1", "127.0.0.1:2"]
    for bad in ("", "localhost", "127.0.0.1:0", "127.0.0.1:x", ":1"):
        with pytest.raises(ValueError):
            parse_addresses(bad)


@pytest.mark.parametrize("make, what", [
    (lambda g: Producer(g), "producer group"),
    (lambda g: TransactionProducer(g, listener=TransactionListener()), "producer group"),
    (lambda g: Consumer(g), "consumer group"),
])
def test_group_name_errors_name_the_group(make, what: str) -> None:
    with pytest.raises(ValueError, match=rf"^{what} 'bad group' may only contain") as info:
        make("bad group")
    assert "topic" not in str(info.value)
    # 120 characters at most, so that the group's %RETRY% topic is still a valid topic
    assert make("g" * 120) is not None
    with pytest.raises(ValueError, match=rf"^{what} 'g+'\.\.\. is longer than 120 characters"):
        make("g" * 121)


def test_send_request_header_is_the_header_class_encoding() -> None:
    """The per-(topic, flags) header template filled per send gives exactly the bytes, key
    order included, that encoding the whole header class gives."""
    from txbroker.remoting.headers import SendMessageRequestHeader

    p = Producer("PG")
    for topic, qid, flag, batch, props in (("T", 3, 4, False, {"a": "b", "UNIQ_KEY": "X"}),
                                           ("T", 1, 4, False, {"c": "d"}),
                                           ("U", 0, 0, True, {"WAIT": "true"})):
        req = p._request(MessageQueue(topic, "broker-a", qid), b"body",
                         rec.properties_to_string(props), flag, batch=batch)
        cmd = req.command()  # the request as a command; its frame is checked in test_frames.py
        born = int(cmd.ext_fields["g"])
        expected = SendMessageRequestHeader(
            producer_group="PG", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
            queue_id=qid, sys_flag=flag, born_timestamp=born, flag=0,
            properties=rec.properties_to_string(props), reconsume_times=0, unit_mode=False,
            batch=batch).to_ext_v2()
        assert list(cmd.ext_fields.items()) == list(expected.items())
        assert cmd.code == (320 if batch else 310) and cmd.code.__class__ is int
