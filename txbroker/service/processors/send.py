"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

Every field is validated before anything is stored: a refused send leaves the store untouched.
What the broker adds or drops follows RocketMQ's SendMessageProcessor: ``WAIT`` is dropped,
``CLUSTER`` is added, a message whose ``TRAN_MSG`` property is true becomes a half message
(handed to the transactional service), a ``DELAY`` level sends it through the schedule
service, and a timer property (``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC``, ``TIMER_DELAY_MS``)
through the timer service, whose recall handle the answer carries.  The response always carries extFields with *string* values: the C++ client crashes
without extFields and ignores numeric values (docs/protocol.md §8.3).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Coroutine
from typing import Any

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import (
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from txbroker.service.clients import ClientRegistry
from txbroker.service.processors.statuses import PUT_ANSWERS
from txbroker.service.schedule import ScheduleService
from txbroker.service.timer import TimerService
from txbroker.service.timer.props import is_timer, strip_requests
from txbroker.service.topics import (
    PERM_WRITE,
    TopicConfig,
    TopicManager,
    is_system_topic,
    validate_group_name,
    validate_topic_name,
)
from txbroker.store.record import (
    BORNHOST_V6_FLAG,
    DLQ_GROUP_TOPIC_PREFIX,
    MAX_PROPERTIES_BYTES,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT_STORE_MSG_OK,
    RETRY_GROUP_TOPIC_PREFIX,
    STOREHOST_V6_FLAG,
    TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    Message,
    RecordError,
    decode_batch,
    properties_to_string,
    string_to_properties,
)

log = logging.getLogger(__name__)

#: sysFlag bits a producer may set: compressed, multi-tags, transaction type, IPv6 host
#: markers (ignored: records carry IPv4), compression type (bits 8-10).
#: Client version above which ``maxReconsumeTimes`` from the request is honoured (V3_4_9).
VERSION_HONOUR_MAX_RECONSUME = 121
_ALLOWED_SYS_FLAG = 0x1 | 0x2 | TRANSACTION_MASK | BORNHOST_V6_FLAG | STOREHOST_V6_FLAG | 0x700


def parse_peer(peer: str | None) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) → (host, port); loopback when unknown."""
    if not peer:
        return ("127.0.0.1", 0)
    host, _, port = peer.rpartition(":")
    try:
        return (host.strip("[]") or "127.0.0.1", int(port))
    except ValueError:
        return ("127.0.0.1", 0)


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "1")


class _Send:
    """A send request past the checks that need no topic config: what the rest uses."""

    __slots__ = ("body", "born_host", "group", "h", "queue_id", "tc", "topic", "tx_bits")

    def __init__(self, h: SendMessageRequestHeader, group: str, topic: str,
                 tc: TopicConfig | None, queue_id: int, tx_bits: int, body: bytes) -> None:
        self.h = h
        self.group = group
        #: the topic stored to (a %RETRY% message past its maximum goes to the %DLQ%)
        self.topic = topic
        #: its config, None until it exists (created on the slow path)
        self.tc = tc
        #: the queue asked for (-1: any)
        self.queue_id = queue_id
        self.tx_bits = tx_bits
        self.body = body
        #: the producer's host, once the target queue is known
        self.born_host: tuple[str, int] = ("127.0.0.1", 0)


class SendProcessor:
    def __init__(self, config: BrokerConfig, store, topics: TopicManager,
                 registry: ClientRegistry, tx, schedule: ScheduleService, timer: TimerService,
                 metrics=None) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.registry = registry
        self.tx = tx
        self.schedule = schedule
        self.timer = timer
        self.metrics = metrics
        self._rr = itertools.count()

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.SEND_MESSAGE: self.handle,
            RequestCode.SEND_MESSAGE_V2: self.handle,
            RequestCode.SEND_BATCH_MESSAGE: self.handle,
        }

    def handle(self, conn, cmd: RemotingCommand) -> RemotingCommand | Coroutine[Any, Any, RemotingCommand]:
        """Store the message; a refusal (header, topic, transaction, store) is raised for the
        transport to answer, after logging it: producers retry refused sends elsewhere.

        The common send (one message to a known topic, on a store that answers at once) is
        answered right here, with no coroutine; the others return one for the transport to
        run (a topic to create, a batch, a flush or replica to wait for)."""
        try:
            send = self._check(conn, cmd)
            if send.tc is not None and not send.h.batch and self.store.answers_at_once:
                return self._store_now(conn, cmd, send)
        except RecordError as exc:  # an undecodable batch body
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        except Refusal as exc:
            log.info("send refused from %s: %s", getattr(conn, "peer", "?"), exc.remark)
            raise
        return self._store_later(conn, cmd, send)

    async def _store_later(self, conn, cmd: RemotingCommand, send: _Send) -> RemotingCommand:
        try:
            if send.tc is None:
                send.tc = await self.topics.get_or_create(send.topic, queue_nums=send.h.default_topic_queue_nums)
            queue_id = self._target(conn, send)
            if send.h.batch:
                return await self._send_batch(cmd, send, queue_id)
            msg, transactional = self._message(send, queue_id)
            if transactional:
                # RocketMQ answers with the *requested* queue id and the half's ids and offset.
                self.timer.check_half(msg)
                return self._response(cmd, await self.tx.prepare(msg, conn), queue_id=queue_id)
            stored = self._delayed(msg)
            return self._response(cmd, await self.store.put(stored), queue_id=queue_id,
                                  stored=stored)
        except RecordError as exc:  # an undecodable batch body
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        except Refusal as exc:
            log.info("send refused from %s: %s", getattr(conn, "peer", "?"), exc.remark)
            raise

    def _store_now(self, conn, cmd: RemotingCommand, send: _Send) -> RemotingCommand:
        """:meth:`_store_later` for a known topic on a store that answers at once."""
        queue_id = self._target(conn, send)
        msg, transactional = self._message(send, queue_id)
        if transactional:
            self.timer.check_half(msg)
            return self._response(cmd, self.tx.prepare_now(msg, conn), queue_id=queue_id)
        stored = self._delayed(msg)
        return self._response(cmd, self.store.put_now(stored), queue_id=queue_id, stored=stored)

    def _check(self, conn, cmd: RemotingCommand) -> _Send:
        """Decode and validate what does not depend on the topic's config (which may not
        exist yet), and note the producer."""
        h = SendMessageRequestHeader.from_command(cmd.code, cmd.ext_fields)
        # The group becomes the half's PGROUP and names the connections asked for check-backs.
        group = validate_group_name(h.producer_group, "producer group")
        topic = h.topic
        tc = self.topics.get(topic)
        if tc is None:  # known topics were validated when they were created
            validate_topic_name(topic)
        if is_system_topic(topic):
            raise Refusal(ResponseCode.NO_PERMISSION,
                          f"Sending message to topic[{topic}] is forbidden: system topic")
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            self._check_retry_group(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
        queue_id = h.queue_id
        sys_flag = h.sys_flag
        reconsume = h.reconsume_times
        max_reconsume = h.max_reconsume_times
        if sys_flag & ~_ALLOWED_SYS_FLAG:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"sysFlag {sys_flag:#x} has unknown bits set")
        tx_bits = sys_flag & TRANSACTION_MASK
        if tx_bits not in (TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE):
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL,
                          f"sysFlag {sys_flag:#x}: a producer may not send a committed or "
                          "rolled-back message")
        body = cmd.body
        if len(body) > self.config.max_message_size:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL,
                          f"message body size {len(body)} exceeds the maximum "
                          f"{self.config.max_message_size}")
        if not body:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, "message body is empty")
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # A client re-sending a failed message itself (its send-back failed): past the
            # maximum it goes to the group's dead-letter queue, as in RocketMQ.
            if max_reconsume is None or cmd.version <= VERSION_HONOUR_MAX_RECONSUME:
                max_reconsume = self.config.max_reconsume_times
            if reconsume >= max_reconsume:
                topic = DLQ_GROUP_TOPIC_PREFIX + topic[len(RETRY_GROUP_TOPIC_PREFIX):]
                tc, queue_id = None, 0
        return _Send(h, group, topic, tc, queue_id, tx_bits, body)

    def _target(self, conn, send: _Send) -> int:
        """The queue the message goes to, once the topic's config is known; notes the
        producer (for check-backs) and the connection's host (the record's born host)."""
        tc = send.tc
        if not tc.perm & PERM_WRITE:
            raise Refusal(ResponseCode.NO_PERMISSION, f"topic[{send.topic}] is not writable")
        queue_id = send.queue_id
        if queue_id < 0:
            queue_id = next(self._rr) % tc.write_queue_nums
        elif queue_id >= tc.write_queue_nums:
            raise Refusal(ResponseCode.SYSTEM_ERROR,
                          f"request queueId[{queue_id}] is illegal, topic {send.topic} has "
                          f"{tc.write_queue_nums} write queues")
        self.registry.note_producer(send.group, conn)
        born_host = conn.attributes.get("born_host")
        if born_host is None:
            born_host = conn.attributes["born_host"] = parse_peer(conn.peer)
        send.born_host = born_host
        return queue_id

    def _message(self, send: _Send, queue_id: int) -> tuple[Message, bool]:
        """The message to store, and whether it is a half (TRAN_MSG true)."""
        h = send.h
        props_text = h.properties or ""
        props = string_to_properties(props_text)
        self._fix_properties(props, len(props_text))
        transactional = is_true(props.get(PROPERTY_TRANSACTION_PREPARED))
        if send.tx_bits == TRANSACTION_PREPARED_TYPE and not transactional:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL,
                          "sysFlag marks a transactional message but property TRAN_MSG is not true")
        return Message(topic=send.topic, queue_id=queue_id, body=send.body, flag=h.flag,
                       properties=props, sys_flag=h.sys_flag, born_timestamp=h.born_timestamp,
                       born_host=send.born_host, reconsume_times=h.reconsume_times), transactional

    def _delayed(self, msg: Message) -> Message:
        """A plain message with a DELAY level goes through the schedule service (its timer
        properties dropped: the level wins, as in RocketMQ), one with a timer property through
        the timer service."""
        level = self._delay_level(msg.properties)
        if level:
            strip_requests(msg.properties)
            return self.schedule.wrap(msg, level)
        return self.timer.wrap(msg)

    def _check_retry_group(self, group: str) -> None:
        """A retry topic is written for its consumer group only, so the group must exist:
        it has heartbeated (which created ``%RETRY%<group>``), is connected, or committed
        offsets.  Otherwise SUBSCRIPTION_GROUP_NOT_EXIST, as RocketMQ answers; storing it
        would create a retry topic for nobody."""
        if group and (self.topics.get(RETRY_GROUP_TOPIC_PREFIX + group) is not None
                      or self.registry.consumer_ids(group)
                      or group in self.store.offsets.groups()):
            return
        raise Refusal(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                      f"subscription group not exist, consumer group {group!r} of topic "
                      f"{RETRY_GROUP_TOPIC_PREFIX + group} is unknown to this broker")

    def _fix_properties(self, props: dict[str, str], text_len: int | None = None) -> None:
        props.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
        props[PROPERTY_CLUSTER] = self.config.cluster_name
        # Exact size only when it could matter: UTF-8 needs at most 3 bytes per character.
        if text_len is not None and 3 * (text_len + len(self.config.cluster_name)) + 16 < MAX_PROPERTIES_BYTES:
            return
        if len(properties_to_string(props).encode()) > MAX_PROPERTIES_BYTES:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL,
                          f"message properties exceed {MAX_PROPERTIES_BYTES} bytes")

    def _delay_level(self, props: dict[str, str]) -> int:
        raw = props.get(PROPERTY_DELAY_TIME_LEVEL)
        if raw is None:
            return 0
        try:
            level = int(raw)
        except ValueError:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"property DELAY={raw!r} is not an integer") from None
        if level < 0:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"property DELAY={level} is negative")
        return min(level, self.schedule.max_level)

    async def _send_batch(self, cmd: RemotingCommand, send: _Send, queue_id: int) -> RemotingCommand:
        h = send.h
        sys_flag = h.sys_flag
        if sys_flag & TRANSACTION_MASK:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be transactional")
        entries = decode_batch(send.body)
        if not entries:
            raise Refusal(ResponseCode.MESSAGE_ILLEGAL, "batch body holds no messages")
        msgs = []
        for i, (flag, entry_body, props) in enumerate(entries):
            if is_true(props.get(PROPERTY_TRANSACTION_PREPARED)):
                raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"batch entry {i} is transactional")
            if props.get(PROPERTY_DELAY_TIME_LEVEL, "0") not in ("", "0"):
                raise Refusal(ResponseCode.MESSAGE_ILLEGAL, f"batch entry {i} has a delay level")
            if is_timer(props):
                raise Refusal(ResponseCode.MESSAGE_ILLEGAL,
                              f"batch entry {i} is a timer message (send timers one by one)")
            self._fix_properties(props)
            msgs.append(Message(topic=send.topic, queue_id=queue_id, body=entry_body, flag=flag,
                                properties=props, sys_flag=sys_flag & ~TRANSACTION_MASK,
                                born_timestamp=h.born_timestamp, born_host=send.born_host,
                                reconsume_times=h.reconsume_times))
        results = await self.store.put_batch(msgs)
        bad = next((r for r in results if not r.ok), None)
        if bad is not None:
            return self._response(cmd, bad, queue_id=queue_id)
        # The batch's answer names every stored message, in order.
        return self._response(cmd, results[0], queue_id=queue_id,
                              msg_id=",".join(r.msg_id for r in results))

    def _response(self, cmd: RemotingCommand, result, *, queue_id: int,
                  msg_id: str | None = None, stored: Message | None = None) -> RemotingCommand:
        """The answer; ``stored`` is the record put, for a timer's recall handle."""
        code, remark = PUT_ANSWERS[result.status]
        if not result.ok:
            raise Refusal(code, result.reason or remark or "")
        handle = self.timer.recall_handle(stored, result) if stored is not None else None
        header = SendMessageResponseHeader(msg_id=msg_id or result.msg_id, queue_id=queue_id,
                                           queue_offset=result.queue_offset, trace_on=True,
                                           recall_handle=handle)
        return cmd.response(code, remark, ext=header.to_ext())
