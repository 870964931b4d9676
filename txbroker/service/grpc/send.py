"""SendMessage: normal, FIFO, delay and transactional messages from 5.x producers.

Each message goes the way a 4.x send of the same kind goes: a plain one straight into the
store (a delivery time through the timer), a transactional one into the transaction service
as a half (same pending index, check-backs and history as a remoting half, its producer group
the topic, as the proxy names it).  The queue: a FIFO message's by its message group (Java's
``String.hashCode`` of the group modulo the write queues, so one group keeps one queue, as the
proxy's ``SendMessageQueueSelector``), the others round-robin.

The entry answered for a half carries ``transaction_id`` = the half's offsetMsgId: it names
the half's commitlog offset, which is all EndTransaction needs (the proxy keeps a cache from
transaction id to broker coordinates instead; the broker knows its halves).
"""

from __future__ import annotations

import itertools
import logging

from txbroker.config import BrokerConfig
from txbroker.remoting.errors import Refusal
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.grpc.messages import to_stored
from txbroker.service.grpc.sessions import Sessions
from txbroker.service.grpc.settings import max_body_size
from txbroker.service.grpc.status import Code, GrpcError, from_refusal, status
from txbroker.service.processors.statuses import PUT_ANSWERS
from txbroker.service.topics import (
    PERM_WRITE,
    TopicManager,
    is_system_topic,
    validate_topic_name,
)
from txbroker.store.record import PROPERTY_CLUSTER, PROPERTY_TIMER_DELIVER_MS, Host

log = logging.getLogger(__name__)

#: Messages in one SendMessage (the Java client batches up to this many).
MAX_BATCH = 1024


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as the proxy hashes a message group."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class SendHandlers:
    """SendMessage over the store, the topic table and the transaction service.

    ``timer``: the timer service (:class:`~txbroker.service.timer.TimerService`): ``wrap``
    stores a message with a delivery time in its place, ``check_half`` refuses a transactional
    one whose time cannot be honoured, ``recall_handle`` is the entry's recall handle; None
    while the broker has no timer service."""

    def __init__(self, config: BrokerConfig, store, topics: TopicManager, tx, sessions: Sessions,
                 *, timer=None) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.tx = tx
        self.sessions = sessions
        self.timer = timer
        self._rr = itertools.count()

    async def send(self, request: spb.SendMessageRequest, client_id: str,
                   born_host: Host) -> spb.SendMessageResponse:
        messages = request.messages
        if not messages:
            raise GrpcError(Code.BAD_REQUEST, "SendMessage holds no message")
        if len(messages) > MAX_BATCH:
            raise GrpcError(Code.PAYLOAD_TOO_LARGE,
                            f"SendMessage holds {len(messages)} messages; at most {MAX_BATCH}")
        topic = messages[0].topic.name
        if any(m.topic.name != topic for m in messages):
            raise GrpcError(Code.BAD_REQUEST, "the messages of one SendMessage name different topics")
        tc = await self._topic(topic)
        entries = []
        for message in messages:
            entries.append(await self._send_one(message, tc, client_id, born_host))
        first = entries[0].status
        overall = first if all(e.status.code == first.code for e in entries) else \
            status(Code.MULTIPLE_RESULTS, "the messages had different results")
        return spb.SendMessageResponse(status=overall, entries=entries)

    async def _topic(self, topic: str):
        try:
            validate_topic_name(topic)
        except Refusal as exc:
            raise GrpcError(Code.ILLEGAL_TOPIC, exc.remark) from None
        if is_system_topic(topic) or topic.startswith(("%RETRY%", "%DLQ%")):
            raise GrpcError(Code.FORBIDDEN, f"topic {topic} is a system, retry or dead-letter "
                                            "topic: producers may not send to it")
        try:
            tc = await self.topics.get_or_create(topic)
        except Refusal as exc:
            raise GrpcError(Code.TOPIC_NOT_FOUND, exc.remark) from None
        if not tc.perm & PERM_WRITE:
            raise GrpcError(Code.FORBIDDEN, f"topic {topic} is not writable")
        return tc

    async def _send_one(self, message: pb.Message, tc, client_id: str,
                        born_host: Host) -> spb.SendResultEntry:
        message_id = message.system_properties.message_id
        try:
            queue_id = self._queue(message, tc)
            msg, kind = to_stored(message, queue_id=queue_id, born_host=born_host,
                                  max_body=max_body_size(self.config), producer_group=tc.name)
            msg.properties[PROPERTY_CLUSTER] = self.config.cluster_name
            if kind == pb.TRANSACTION:
                if PROPERTY_TIMER_DELIVER_MS in msg.properties:
                    if self.timer is None:
                        raise GrpcError(Code.UNSUPPORTED, "delivery times need the timer service")
                    self.timer.check_half(msg)
                self.sessions.note_send(client_id, tc.name)
                channel = self._channel(client_id)
                result = await self.tx.prepare(msg, channel)
            else:
                if PROPERTY_TIMER_DELIVER_MS in msg.properties:
                    if self.timer is None:
                        raise GrpcError(Code.UNSUPPORTED, "delivery times need the timer service")
                    msg = self.timer.wrap(msg)
                result = await self.store.put(msg)
            code, remark = PUT_ANSWERS[result.status]
            if not result.ok:
                raise from_refusal(Refusal(code, result.reason or remark or ""))
        except GrpcError as exc:
            log.info("gRPC send to %s refused: %s", tc.name, exc.message)
            return spb.SendResultEntry(status=status(exc.code, exc.message), message_id=message_id)
        except Refusal as exc:
            err = from_refusal(exc)
            log.info("gRPC send to %s refused: %s", tc.name, err.message)
            return spb.SendResultEntry(status=status(err.code, err.message), message_id=message_id)
        entry = spb.SendResultEntry(status=status(), message_id=message_id,
                                    offset=result.queue_offset)
        if kind == pb.TRANSACTION:
            entry.transaction_id = result.msg_id
        elif self.timer is not None:
            handle = self.timer.recall_handle(msg, result)
            if handle:
                entry.recall_handle = handle
        return entry

    def _queue(self, message: pb.Message, tc) -> int:
        n = tc.write_queue_nums
        if n <= 0:
            raise GrpcError(Code.FORBIDDEN, f"topic {tc.name} has no write queue")
        group = message.system_properties.message_group
        if group:
            return (java_string_hash(group) & 0x7FFFFFFF) % n
        return next(self._rr) % n

    def _channel(self, client_id: str):
        """The producer's open Telemetry stream (its half's first check goes there)."""
        session = self.sessions.get(client_id)
        if session is None:
            return None
        return next((c for c in reversed(session.channels) if not c.closed), None)

