"""Consumer-side requests: heartbeats, membership, offsets, send-back, queue locks.

Heartbeat bodies are parsed leniently: the C++ client writes enums as ordinals, leaves out empty
sets and sends ``subVersion`` as a string (client-capture.md §5.8), while Java writes enum names.

Send-back (CONSUMER_SEND_MSG_BACK) follows RocketMQ: the failed message, read back by its
commitlog offset, is re-published to ``%RETRY%<group>`` through the delay-level schedule (level
``3 + reconsumeTimes`` when the client passes 0), or to ``%DLQ%<group>`` once its reconsume
count reaches the maximum or the client asks for a negative level.

Queue locks (orderly consumption) are real per-(group, topic, queue) leases held by a client id
and expiring after 60 s without renewal (RocketMQ's ``REBALANCE_LOCK_MAX_LIVE_TIME``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.codec import RemotingCommand
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.headers import HeaderError
from txbroker.service.clients import (
    ClientRegistry,
    ConsumerEntry,
    Subscription,
    parse_tag_expression,
)
from txbroker.service.processors.fields import FieldError, Fields, error_response
from txbroker.service.processors.send import VERSION_HONOUR_MAX_RECONSUME, put_ok
from txbroker.service.schedule import ScheduleService
from txbroker.service.topics import (
    TopicManager,
    TopicStoreError,
    is_system_topic,
    validate_group_name,
)
from txbroker.store.record import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    Message,
)

log = logging.getLogger(__name__)

LOCK_LIVE_TIME = 60.0

_CONSUME_TYPES = ["CONSUME_ACTIVELY", "CONSUME_PASSIVELY"]
_MESSAGE_MODELS = ["BROADCASTING", "CLUSTERING"]
_CONSUME_FROM = ["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                 "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                 "CONSUME_FROM_TIMESTAMP"]


def _enum(value, names: list[str], default: str) -> str:
    """Java writes enum names, C++ ordinals; both map to the name."""
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    if isinstance(value, str) and value.isdigit() and int(value) < len(names):
        return names[int(value)]
    return default


def _json_body(cmd: RemotingCommand, what: str) -> dict:
    try:
        doc = orjson.loads(cmd.body) if cmd.body else {}
    except orjson.JSONDecodeError as exc:
        raise FieldError(ResponseCode.SYSTEM_ERROR, f"{what} body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FieldError(ResponseCode.SYSTEM_ERROR, f"{what} body is not a JSON object")
    return doc


def _list(doc: dict, key: str, what: str) -> list:
    value = doc.get(key) or []
    if not isinstance(value, list):
        raise FieldError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' is not a list")
    return value


class LockManager:
    """Per-(group, topic, broker, queue) leases for orderly consumers."""

    def __init__(self, clock: Callable[[], float] = time.time, live_time: float = LOCK_LIVE_TIME) -> None:
        self.clock = clock
        self.live_time = live_time
        self._locks: dict[tuple, tuple[str, float]] = {}

    def lock(self, group: str, client_id: str, mqs: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
        now = self.clock()
        ok = []
        for mq in mqs:
            key = (group, *mq)
            held = self._locks.get(key)
            if held is None or held[0] == client_id or held[1] <= now:
                self._locks[key] = (client_id, now + self.live_time)
                ok.append(mq)
        return ok

    def unlock(self, group: str, client_id: str, mqs: list[tuple[str, str, int]]) -> None:
        for mq in mqs:
            key = (group, *mq)
            held = self._locks.get(key)
            if held is not None and held[0] == client_id:
                del self._locks[key]

    def holder(self, group: str, topic: str, broker: str, queue_id: int) -> str | None:
        held = self._locks.get((group, topic, broker, queue_id))
        if held is None or held[1] <= self.clock():
            return None
        return held[0]


class ConsumerProcessor:
    def __init__(self, config: BrokerConfig, store, topics: TopicManager,
                 registry: ClientRegistry, schedule: ScheduleService,
                 *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.registry = registry
        self.schedule = schedule
        self.locks = LockManager(clock)

    def handlers(self) -> dict[int, object]:
        table = {
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
        }
        return {code: _guarded(fn) for code, fn in table.items()}

    # --- membership ----------------------------------------------------------------------
    async def heartbeat(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        doc = _json_body(cmd, "heartbeat")
        client_id = str(doc.get("clientID") or "")
        producers = []
        for pd in _list(doc, "producerDataSet", "heartbeat"):
            if isinstance(pd, dict) and pd.get("groupName"):
                producers.append(validate_group_name(str(pd["groupName"]), "producer group"))
        consumers = []
        for cd in _list(doc, "consumerDataSet", "heartbeat"):
            if not isinstance(cd, dict) or not cd.get("groupName"):
                continue
            group = validate_group_name(str(cd["groupName"]), "consumer group")
            subs: dict[str, Subscription] = {}
            for sd in _list(cd, "subscriptionDataSet", "heartbeat"):
                if not isinstance(sd, dict) or not sd.get("topic"):
                    continue
                expr = str(sd.get("subString") or "*")
                try:
                    version = int(sd.get("subVersion") or 0)
                except (TypeError, ValueError):
                    version = 0
                subs[str(sd["topic"])] = Subscription(
                    topic=str(sd["topic"]), expression=expr, tags=parse_tag_expression(expr),
                    version=version, expression_type=str(sd.get("expressionType") or "TAG"))
            # RocketMQ creates the group's retry topic when the group first heartbeats.  On a
            # full disk that fails; the heartbeat must not (consumers keep reading), and the
            # next heartbeat or a send-back creates it once the disk allows.
            try:
                self.topics.get_or_create(RETRY_GROUP_TOPIC_PREFIX + group)
            except TopicStoreError as exc:
                log.warning("heartbeat of %s: %s", group, exc.remark)
            consumers.append((group, ConsumerEntry(
                client_id=client_id or f"conn-{conn.id}", conn=conn, subscriptions=subs,
                last_seen=0.0,  # stamped by the registry
                consume_type=_enum(cd.get("consumeType"), _CONSUME_TYPES, "CONSUME_PASSIVELY"),
                message_model=_enum(cd.get("messageModel"), _MESSAGE_MODELS, "CLUSTERING"),
                consume_from_where=_enum(cd.get("consumeFromWhere"), _CONSUME_FROM,
                                         "CONSUME_FROM_LAST_OFFSET"))))
        self.registry.heartbeat(conn, client_id, producers, consumers)
        return cmd.response(ResponseCode.SUCCESS)

    async def unregister(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        client_id = f.str("clientID")
        self.registry.unregister(conn, client_id, f.str("producerGroup", required=False),
                                 f.str("consumerGroup", required=False))
        return cmd.response(ResponseCode.SUCCESS)

    async def consumer_list(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        group = Fields(cmd.ext_fields).str("consumerGroup")
        ids = self.registry.consumer_ids(group)
        if not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps({"consumerIdList": ids}))

    # --- offsets -------------------------------------------------------------------------
    def _queue(self, f: Fields) -> tuple[str, int]:
        return f.str("topic"), f.int("queueId", lo=0)

    async def query_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        group = f.str("consumerGroup")
        topic, qid = self._queue(f)
        offset = self.store.offsets.get(group, topic, qid)
        if offset is None:
            if self.store.min_offset(topic, qid) <= 0:
                offset = 0
            else:
                return cmd.response(ResponseCode.QUERY_NOT_FOUND,
                                    "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return cmd.response(ResponseCode.SUCCESS, ext={"offset": str(offset)})

    async def update_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        f = Fields(cmd.ext_fields)
        group = validate_group_name(f.str("consumerGroup"), "consumer group")
        topic, qid = self._queue(f)
        offset = f.long("commitOffset", lo=0)
        self.store.offsets.set(group, topic, qid, offset)
        return None if cmd.is_oneway else cmd.response(ResponseCode.SUCCESS)

    async def max_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        topic, qid = self._queue(Fields(cmd.ext_fields))
        return cmd.response(ResponseCode.SUCCESS, ext={"offset": str(self.store.max_offset(topic, qid))})

    async def min_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        topic, qid = self._queue(Fields(cmd.ext_fields))
        return cmd.response(ResponseCode.SUCCESS, ext={"offset": str(self.store.min_offset(topic, qid))})

    async def search_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        topic, qid = self._queue(f)
        ts = f.long("timestamp", lo=0)
        return cmd.response(ResponseCode.SUCCESS,
                            ext={"offset": str(self.store.offset_by_time(topic, qid, ts))})

    # --- send-back -----------------------------------------------------------------------
    async def send_back(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        offset = f.long("offset", lo=0)
        group = validate_group_name(f.str("group"), "consumer group")
        delay_level = f.int("delayLevel")
        origin_msg_id = f.str("originMsgId", required=False)
        f.str("originTopic", required=False)
        f.bool("unitMode")
        max_times = f.int("maxReconsumeTimes", required=False, lo=0)
        if max_times is None or cmd.version <= VERSION_HONOUR_MAX_RECONSUME:
            max_times = self.config.max_reconsume_times
        old = self.store.read(offset)
        if old is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        if is_system_topic(old.topic):
            # A half, op or discarded message must never reach a consumer through a retry
            # topic: that would make a rolled-back transaction visible.
            return cmd.response(ResponseCode.NO_PERMISSION,
                                f"message at offset {offset} is in system topic {old.topic}")
        props = dict(old.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, old.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_msg_id or old.uniq_key or old.msg_id)
        props[PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        reconsume = old.reconsume_times
        if reconsume >= max_times or delay_level < 0:
            topic = DLQ_GROUP_TOPIC_PREFIX + group
            level = 0
        else:
            topic = RETRY_GROUP_TOPIC_PREFIX + group
            level = delay_level if delay_level > 0 else 3 + reconsume
        self.topics.get_or_create(topic)
        msg = Message(topic=topic, queue_id=0, body=old.body, flag=old.flag, properties=props,
                      sys_flag=old.sys_flag, born_timestamp=old.born_timestamp,
                      born_host=old.born_host, reconsume_times=reconsume + 1)
        if level:
            msg = self.schedule.wrap(msg, level)
        result = await self.store.put(msg)
        if not put_ok(result):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"send back failed: {result.status.name}")
        log.info("message %d of group %s sent back to %s (level %d, reconsume %d)",
                 offset, group, topic, level, reconsume + 1)
        return cmd.response(ResponseCode.SUCCESS)

    # --- locks ---------------------------------------------------------------------------
    def _lock_body(self, cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        doc = _json_body(cmd, "lock batch")
        group = validate_group_name(str(doc.get("consumerGroup") or ""), "consumer group")
        client_id = str(doc.get("clientId") or "")
        if not client_id:
            raise FieldError(ResponseCode.SYSTEM_ERROR, "lock batch: missing 'clientId'")
        mqs = []
        for mq in _list(doc, "mqSet", "lock batch"):
            if not isinstance(mq, dict) or not isinstance(mq.get("queueId"), int) or not mq.get("topic"):
                raise FieldError(ResponseCode.SYSTEM_ERROR, f"lock batch: bad message queue {mq!r}")
            mqs.append((str(mq["topic"]), str(mq.get("brokerName") or self.config.broker_name),
                        int(mq["queueId"])))
        return group, client_id, mqs

    async def lock_batch(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = self._lock_body(cmd)
        ok = self.locks.lock(group, client_id, mqs)
        body = {"lockOKMQSet": [{"brokerName": b, "queueId": q, "topic": t} for t, b, q in ok]}
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(body))

    async def unlock_batch(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        group, client_id, mqs = self._lock_body(cmd)
        self.locks.unlock(group, client_id, mqs)
        return None if cmd.is_oneway else cmd.response(ResponseCode.SUCCESS)


def _guarded(fn):
    """Turn refusals (FieldError, TopicError) into error responses for one handler."""
    async def handler(conn, cmd: RemotingCommand):
        try:
            return await fn(conn, cmd)
        except HeaderError as exc:
            log.info("request %d refused: %s", cmd.code, exc)
            return None if cmd.is_oneway else error_response(cmd, exc)
    handler.__name__ = getattr(fn, "__name__", "handler")
    return handler
