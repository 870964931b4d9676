"""Consumer-side requests: heartbeats, membership, offsets, send-back, queue locks.

Headers arrive through the typed classes of ``remoting.headers`` and JSON bodies through
``remoting.bodies`` (``HeartbeatData`` reads both the Java form and the C++ one, which writes enums
as ordinals, leaves out empty sets and sends ``subVersion`` as a string, docs/protocol.md §8.6);
this module only applies them to the registry, the offset store and the lock table.

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

from txbroker.config import BrokerConfig
from txbroker.remoting.bodies import (
    ConsumerListBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
)
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.filter import parse_tag_expression
from txbroker.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from txbroker.service.clients import ClientRegistry, ConsumerEntry, Subscription
from txbroker.service.processors.send import VERSION_HONOUR_MAX_RECONSUME
from txbroker.service.processors.statuses import PUT_ANSWERS
from txbroker.service.schedule import ScheduleService
from txbroker.service.topics import (
    NotGroupMaster,
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
        return {
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

    # --- membership ----------------------------------------------------------------------
    async def heartbeat(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        hb = HeartbeatData.decode(cmd.body)
        producers = [validate_group_name(pd.group_name, "producer group")
                     for pd in hb.producer_data_set]
        consumers = []
        for cd in hb.consumer_data_set:
            group = validate_group_name(cd.group_name, "consumer group")
            subs: dict[str, Subscription] = {}
            for sd in cd.subscription_data_set:
                selected = parse_tag_expression(sd.sub_string)
                subs[sd.topic] = Subscription(
                    topic=sd.topic, expression=selected.sub_string, tags=selected.tags,
                    version=sd.sub_version, expression_type=sd.expression_type)
            # RocketMQ creates the group's retry topic when the group first heartbeats.  On a
            # full disk that fails; the heartbeat must not (consumers keep reading), and the
            # next heartbeat or a send-back creates it once the disk allows.
            try:
                await self.topics.get_or_create(RETRY_GROUP_TOPIC_PREFIX + group)
            except NotGroupMaster:
                pass  # etcd mode, a slave: the master makes it at the group's heartbeat there
            except TopicStoreError as exc:
                log.warning("heartbeat of %s: %s", group, exc.remark)
            consumers.append((group, ConsumerEntry(
                client_id=hb.client_id, conn=conn, subscriptions=subs,
                last_seen=0.0,  # stamped by the registry
                consume_type=cd.consume_type.name, message_model=cd.message_model.name,
                consume_from_where=cd.consume_from_where.name)))
        self.registry.heartbeat(conn, hb.client_id, producers, consumers)
        return cmd.response(ResponseCode.SUCCESS)

    async def unregister(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = UnregisterClientRequestHeader.from_ext(cmd.ext_fields)
        self.registry.unregister(conn, h.client_id, h.producer_group, h.consumer_group)
        return cmd.response(ResponseCode.SUCCESS)

    async def consumer_list(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        group = GetConsumerListByGroupRequestHeader.from_ext(cmd.ext_fields).consumer_group
        ids = self.registry.consumer_ids(group)
        if not ids:
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(ResponseCode.SUCCESS, body=ConsumerListBody(ids).encode())

    # --- offsets -------------------------------------------------------------------------
    @staticmethod
    def _offset(cmd: RemotingCommand, offset: int) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, ext=OffsetResponseHeader(offset=offset).to_ext())

    async def query_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        offset = self.store.offsets.get(h.consumer_group, h.topic, h.queue_id)
        if offset is None:
            if not h.set_zero_if_not_found:
                raise Refusal(ResponseCode.QUERY_NOT_FOUND,
                              "Not found, do not set to zero, maybe this group boot first")
            if self.store.min_offset(h.topic, h.queue_id) <= 0:
                offset = 0
            else:
                raise Refusal(ResponseCode.QUERY_NOT_FOUND,
                              "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return self._offset(cmd, offset)

    async def update_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        h = UpdateConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        group = validate_group_name(h.consumer_group, "consumer group")
        if self.topics.get(h.topic) is None:
            # Offsets of a topic that does not exist (a typo, or deleted meanwhile) would
            # bring a deleted topic's group back in the status (RocketMQ 5 refuses too).
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic[{h.topic}] not exist, apply first please!")
        if h.commit_offset < 0:
            raise Refusal(ResponseCode.SYSTEM_ERROR, "consumer offset must be >= 0")
        row = [(group, h.topic, h.queue_id, h.commit_offset, None)]
        if cmd.is_oneway:  # nobody waits for the answer: nothing to wait for
            self.store.commit_offsets_now(row)
            return None
        # Through the commitlog (docs/cluster.md, "Consumer offsets in the log"): answered
        # as a send would be, so an acknowledged offset is on every replica a failover may
        # promote.  Stored with a replication status a client counts as sent (no slave, a
        # slave time-out; with a controller or etcd the in-sync set then no longer names a
        # replica without it) is SUCCESS.
        result = await self.store.commit_offsets(row)
        if not result.ok:
            code, remark = PUT_ANSWERS[result.status]
            raise Refusal(code, result.reason or remark or "")
        return cmd.response(ResponseCode.SUCCESS)

    async def max_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMaxOffsetRequestHeader.from_ext(cmd.ext_fields)
        return self._offset(cmd, self.store.max_offset(h.topic, h.queue_id))

    async def min_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMinOffsetRequestHeader.from_ext(cmd.ext_fields)
        return self._offset(cmd, self.store.min_offset(h.topic, h.queue_id))

    async def search_offset(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = SearchOffsetRequestHeader.from_ext(cmd.ext_fields)
        return self._offset(cmd, self.store.offset_by_time(h.topic, h.queue_id, h.timestamp))

    # --- send-back -----------------------------------------------------------------------
    async def send_back(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)
        offset = h.offset
        group = validate_group_name(h.group, "consumer group")
        delay_level = h.delay_level
        max_times = h.max_reconsume_times
        if max_times is None or cmd.version <= VERSION_HONOUR_MAX_RECONSUME:
            max_times = self.config.max_reconsume_times
        old = self.store.read(offset)
        if old is None:
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        if is_system_topic(old.topic):
            # A half, op or discarded message must never reach a consumer through a retry
            # topic: that would make a rolled-back transaction visible.
            raise Refusal(ResponseCode.NO_PERMISSION,
                          f"message at offset {offset} is in system topic {old.topic}")
        props = dict(old.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, old.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, h.origin_msg_id or old.uniq_key or old.msg_id)
        props[PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        reconsume = old.reconsume_times
        if reconsume >= max_times or delay_level < 0:
            topic = DLQ_GROUP_TOPIC_PREFIX + group
            level = 0
        else:
            topic = RETRY_GROUP_TOPIC_PREFIX + group
            level = delay_level if delay_level > 0 else 3 + reconsume
        await self.topics.get_or_create(topic)
        msg = Message(topic=topic, queue_id=0, body=old.body, flag=old.flag, properties=props,
                      sys_flag=old.sys_flag, born_timestamp=old.born_timestamp,
                      born_host=old.born_host, reconsume_times=reconsume + 1)
        if level:
            msg = self.schedule.wrap(msg, level)
        result = await self.store.put(msg)
        if not result.ok:
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"send back failed: {result.status.name}")
        log.info("message %d of group %s sent back to %s (level %d, reconsume %d)",
                 offset, group, topic, level, reconsume + 1)
        return cmd.response(ResponseCode.SUCCESS)

    # --- locks ---------------------------------------------------------------------------
    def _lock_body(self, cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        body = LockBatchRequestBody.decode(cmd.body)
        group = validate_group_name(body.consumer_group, "consumer group")
        return group, body.client_id, [(q.topic, q.broker_name, q.queue_id) for q in body.mq_set]

    async def lock_batch(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = self._lock_body(cmd)
        ok = self.locks.lock(group, client_id, mqs)
        body = LockBatchResponseBody([MessageQueue(t, b, q) for t, b, q in ok])
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    async def unlock_batch(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        group, client_id, mqs = self._lock_body(cmd)
        self.locks.unlock(group, client_id, mqs)
        return None if cmd.is_oneway else cmd.response(ResponseCode.SUCCESS)
