"""Broker pieces that need no socket: topic rules, registry, route dialects, field checks."""

from __future__ import annotations

import re

import orjson
import pytest

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import HeaderError, SendMessageRequestHeader
from txbroker.service.clients import ClientRegistry, ConsumerEntry
from txbroker.service.namesrv import NameServer
from txbroker.service.processors.consumer import LockManager
from txbroker.service.schedule import parse_levels
from txbroker.service.topics import (
    TopicConfig,
    TopicError,
    TopicManager,
    is_system_topic,
    validate_topic_name,
)


class FakeConn:
    """A connection stand-in for registry bookkeeping: records one-way sends."""

    _ids = iter(range(1, 10_000))

    def __init__(self) -> None:
        self.id = next(self._ids)
        self.closed = False
        self.sent: list[RemotingCommand] = []

    def send_oneway(self, cmd: RemotingCommand) -> None:
        self.sent.append(cmd)


def test_topic_names() -> None:
    assert validate_topic_name("Topic_A-1%|x") == "Topic_A-1%|x"
    for bad in ("", "a b", "a/b", "ü", "x" * 250):
        with pytest.raises(TopicError):
            validate_topic_name(bad)
    assert is_system_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    assert is_system_topic("TRANS_CHECK_MAX_TIME_TOPIC")
    assert not is_system_topic("TopicTest")


async def test_topics_persist_and_protect(tmp_path) -> None:
    cfg = BrokerConfig(data_dir=str(tmp_path), default_queue_nums=4)
    tm = TopicManager(cfg)
    assert tm.get("TBW102") is not None
    assert (await tm.get_or_create("Orders", queue_nums=8)).write_queue_nums == 4  # capped
    assert (await tm.get_or_create("%RETRY%g1")).write_queue_nums == 1
    await tm.create_or_update(TopicConfig("Big", 16, 16))
    with pytest.raises(TopicError) as err:
        await tm.create_or_update(TopicConfig("RMQ_SYS_TRANS_HALF_TOPIC", 1, 1))
    assert err.value.code == ResponseCode.NO_PERMISSION
    with pytest.raises(TopicError):
        await tm.delete("TRANS_CHECK_MAX_TIME_TOPIC")
    again = TopicManager(cfg)
    assert again.get("Orders").write_queue_nums == 4
    assert again.get("Big").read_queue_nums == 16
    no_auto = TopicManager(cfg.replace(auto_create_topic=False))
    with pytest.raises(TopicError) as err:
        await no_auto.get_or_create("Unknown")
    assert err.value.code == ResponseCode.TOPIC_NOT_EXIST


def test_registry_producers_most_recent_first() -> None:
    reg = ClientRegistry()
    a, b = FakeConn(), FakeConn()
    reg.note_producer("PG", a)
    reg.note_producer("PG", b)
    assert reg.producer_connections("PG") == [b, a]
    reg.note_producer("PG", a)
    assert reg.producer_connections("PG") == [a, b]
    b.closed = True
    assert reg.producer_connections("PG") == [a]
    reg.connection_closed(a)
    assert reg.producer_connections("PG") == []


def test_registry_consumers_notify_and_expire() -> None:
    now = [1000.0]
    reg = ClientRegistry(clock=lambda: now[0])
    a, b = FakeConn(), FakeConn()
    reg.heartbeat(a, "c1", [], [("G", ConsumerEntry("c1", a, {}, 0))])
    reg.heartbeat(b, "c2", [], [("G", ConsumerEntry("c2", b, {}, 0))])
    assert reg.consumer_ids("G") == ["c1", "c2"]
    assert [c.code for c in a.sent] == [RequestCode.NOTIFY_CONSUMER_IDS_CHANGED] * 2
    assert a.sent[0].ext_fields == {"consumerGroup": "G"}
    n_a = len(a.sent)
    reg.heartbeat(b, "c2", [], [("G", ConsumerEntry("c2", b, {}, 0))])  # renewal: no notify
    assert len(a.sent) == n_a
    reg.unregister(b, "c2", None, "G")
    assert reg.consumer_ids("G") == ["c1"]
    assert len(a.sent) == n_a + 1
    now[0] += 121
    reg.expire()
    assert reg.consumer_ids("G") == []


async def test_namesrv_dialects(tmp_path) -> None:
    cfg = BrokerConfig(data_dir=str(tmp_path))
    ns = NameServer(cfg, TopicManager(cfg), lambda: "127.0.0.1:10911")
    old = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    old.version = 63
    resp = await ns.get_route(None, old)
    assert resp.code == ResponseCode.SUCCESS and b'{0:"127.0.0.1:10911"}' in resp.body
    new = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    doc = orjson.loads((await ns.get_route(None, new)).body)
    assert doc["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
    missing = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
    with pytest.raises(Refusal) as refused:
        await ns.get_route(None, missing)
    assert refused.value.code == ResponseCode.TOPIC_NOT_EXIST


def test_send_header_v2_keys_and_refusals() -> None:
    ext = {"a": "PG", "b": "T", "e": "3", "f": "0", "g": "1", "h": "0", "m": "1"}
    h = SendMessageRequestHeader.from_command(RequestCode.SEND_MESSAGE_V2, ext)
    assert h.producer_group == "PG" and h.queue_id == 3 and h.batch is True
    assert h.default_topic_queue_nums is None and h.reconsume_times == 0
    for bad, words in ((("e", "x"), "'e' (queueId) must be an integer"),
                       (("m", "maybe"), "'m' (batch) must be a boolean"),
                       (("d", "2000"), "'d' (defaultTopicQueueNums) = 2000 must be <= 1024"),
                       (("l", "-1"), "'l' (maxReconsumeTimes) = -1 must be >= 0")):
        with pytest.raises(HeaderError, match=re.escape(words)):
            SendMessageRequestHeader.from_command(RequestCode.SEND_MESSAGE_V2, {**ext, bad[0]: bad[1]})
    missing = {k: v for k, v in ext.items() if k != "f"}
    with pytest.raises(HeaderError, match=r"missing header field 'f' \(sysFlag\)"):
        SendMessageRequestHeader.from_command(RequestCode.SEND_BATCH_MESSAGE, missing)
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext)
    resp = Refusal(ResponseCode.NO_PERMISSION, "topic[T] is not writable").answer(cmd)
    assert resp.code == ResponseCode.NO_PERMISSION and resp.remark == "topic[T] is not writable"


def test_locks_expire_and_belong_to_holder() -> None:
    now = [0.0]
    locks = LockManager(clock=lambda: now[0])
    mq = ("T", "broker-a", 0)
    assert locks.lock("G", "c1", [mq]) == [mq]
    assert locks.lock("G", "c2", [mq]) == []
    locks.unlock("G", "c2", [mq])  # not the holder: no effect
    assert locks.holder("G", *mq) == "c1"
    now[0] += 61
    assert locks.lock("G", "c2", [mq]) == [mq]


def test_delay_levels() -> None:
    levels = parse_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
    assert levels[0] == 1 and levels[4] == 60 and levels[-1] == 7200 and len(levels) == 18


def test_pull_parses_each_subscription_expression_once() -> None:
    """A consumer repeats its expression with every pull: the tag filter is parsed once and
    reused; a refused expression is refused every time and never cached."""
    from txbroker.remoting.filter import SubscriptionParseError
    from txbroker.service.processors.pull import PullHoldService, PullProcessor
    from txbroker.store.record import tag_hash

    proc = PullProcessor(BrokerConfig(), None, None, None, PullHoldService())
    first = proc._tag_filter("TagA || TagB")
    assert first == {tag_hash("TagA"), tag_hash("TagB")}
    assert proc._tag_filter("TagA || TagB") is first
    assert proc._tag_filter("*") is None and proc._tag_filter(" ") == frozenset()
    for _ in range(2):
        with pytest.raises(SubscriptionParseError):
            proc._tag_filter("||")
    assert "||" not in proc._filters
