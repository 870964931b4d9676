"""Messages between RocketMQ 5's protobuf form and txbroker's records.

A 5.x client's ``Message`` carries in ``system_properties`` what a 4.x client puts in string
properties; the mapping is the apache/rocketmq proxy's (``GrpcConverter``,
``SendMessageActivity.buildMessage``), so a message sent over gRPC reads the same to a 4.x or
Kafka consumer and the other way round:

=======================================  ==========================================
5.x ``system_properties``                record property
=======================================  ==========================================
``message_id``                           ``UNIQ_KEY``
``tag``                                  ``TAGS``
``keys``                                 ``KEYS`` (joined by a space)
``message_group``                        ``__SHARDINGKEY``
``delivery_timestamp``                   ``TIMER_DELIVER_MS``
``orphaned_transaction_recovery_…``      ``CHECK_IMMUNITY_TIME_IN_SECONDS``
``trace_context``                        ``TRACE_CONTEXT``
=======================================  ==========================================

User properties are record properties as they are.  Going out, ``body_digest`` is the body's
MD5 in upper-case hex, as the proxy sends it (the Python client compares it case-sensitively
and marks a message corrupted on a mismatch).
"""

from __future__ import annotations

import hashlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.service.grpc.status import Code, GrpcError
from txbroker.service.kafka.mapping import SYSTEM_PROPERTIES
from txbroker.store.record import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    Host,
    Message,
    StoredMessage,
)

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
#: Properties the broker sets itself: a client may not send them as user properties.
_RESERVED = frozenset({PROPERTY_UNIQ_KEY, PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_SHARDING_KEY,
                       PROPERTY_TIMER_DELIVER_MS, PROPERTY_TRANSACTION_PREPARED,
                       PROPERTY_PRODUCER_GROUP, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
                       PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_DELAY_SEC,
                       PROPERTY_TIMER_DELAY_MS, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                       PROPERTY_CLUSTER, PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_RECONSUME_TIME})
#: RocketMQ's property separators: a name or value holding one would corrupt the record.
_SEPARATORS = ("\x01", "\x02")


def millis(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def body_md5(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def message_type(props: dict[str, str]) -> int:
    """The 5.x type a stored message reads as (the proxy's ``buildMessageType``)."""
    if props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
        return pb.TRANSACTION
    if props.get(PROPERTY_SHARDING_KEY):
        return pb.FIFO
    if any(props.get(p) for p in (PROPERTY_TIMER_DELIVER_MS, PROPERTY_DELAY_TIME_LEVEL,
                                  PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS)):
        return pb.DELAY
    return pb.NORMAL


def _text(value: str, what: str, code: int) -> str:
    if any(sep in value for sep in _SEPARATORS):
        raise GrpcError(code, f"{what} {value!r} holds a control character")
    return value


def to_stored(msg: pb.Message, *, queue_id: int, born_host: Host, max_body: int,
              producer_group: str) -> tuple[Message, int]:
    """The record for a message a 5.x producer sent, and its declared type; refuses (with the
    5.x code the clients expect) what the type and the fields contradict."""
    sp = msg.system_properties
    body = msg.body
    if not body:
        raise GrpcError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body:
        raise GrpcError(Code.MESSAGE_BODY_TOO_LARGE,
                        f"message body size {len(body)} exceeds the maximum {max_body}")
    if sp.body_encoding == pb.GZIP:
        raise GrpcError(Code.BAD_REQUEST, "GZIP-encoded bodies are not accepted: send IDENTITY")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if not key or key in _RESERVED:
            raise GrpcError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                            f"user property {key!r} is reserved or empty")
        props[_text(key, "user property", Code.ILLEGAL_MESSAGE_PROPERTY_KEY)] = \
            _text(value, f"user property {key} value", Code.ILLEGAL_MESSAGE_PROPERTY_KEY)
    if not sp.message_id:
        raise GrpcError(Code.ILLEGAL_MESSAGE_ID, "message has no message_id")
    props[PROPERTY_UNIQ_KEY] = _text(sp.message_id, "message_id", Code.ILLEGAL_MESSAGE_ID)
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise GrpcError(Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} is blank or holds '|'")
        props[PROPERTY_TAGS] = _text(sp.tag, "tag", Code.ILLEGAL_MESSAGE_TAG)
    if sp.keys:
        for key in sp.keys:
            if not key.strip() or " " in key:
                raise GrpcError(Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} is blank or holds a space")
        props[PROPERTY_KEYS] = _text(" ".join(sp.keys), "keys", Code.ILLEGAL_MESSAGE_KEY)
    if sp.HasField("trace_context") and sp.trace_context:
        props[PROPERTY_TRACE_CONTEXT] = _text(sp.trace_context, "trace_context", Code.BAD_REQUEST)
    kind = sp.message_type
    if kind == pb.FIFO or sp.HasField("message_group"):
        if kind != pb.FIFO:
            raise GrpcError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                            "message_group is set on a message that is not FIFO")
        if not sp.message_group.strip():
            raise GrpcError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message_group")
        props[PROPERTY_SHARDING_KEY] = _text(sp.message_group, "message_group",
                                             Code.ILLEGAL_MESSAGE_GROUP)
    if sp.HasField("delivery_timestamp"):
        if kind not in (pb.DELAY, pb.TRANSACTION):
            raise GrpcError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                            "delivery_timestamp is set on a message that is neither DELAY nor "
                            "TRANSACTION")
        deliver_ms = millis(sp.delivery_timestamp)
        if deliver_ms < 0:
            raise GrpcError(Code.ILLEGAL_DELIVERY_TIME, f"delivery_timestamp {deliver_ms} < 0")
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    elif kind == pb.DELAY:
        raise GrpcError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery_timestamp")
    if kind == pb.TRANSACTION:
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = producer_group
        if sp.HasField("orphaned_transaction_recovery_duration"):
            seconds = duration_ms(sp.orphaned_transaction_recovery_duration) // 1000
            if seconds < 0:
                raise GrpcError(Code.BAD_REQUEST, "orphaned_transaction_recovery_duration < 0")
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    elif kind not in (pb.NORMAL, pb.FIFO, pb.DELAY):
        raise GrpcError(Code.UNSUPPORTED, f"message type {pb.MessageType.Name(kind)} is not "
                                          "served: NORMAL, FIFO, DELAY or TRANSACTION")
    born_ms = millis(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    return Message(topic=msg.topic.name, queue_id=queue_id, body=body, properties=props,
                   born_timestamp=born_ms, born_host=born_host), kind


def to_pb(stored: StoredMessage, *, topic: str | None = None, receipt_handle: str | None = None,
          delivery_attempt: int | None = None, invisible_ms: int | None = None,
          store_host: str = "") -> pb.Message:
    """The 5.x form of a stored message (``topic``: the name to show, when the record is
    stored under another, as a half or a retry is)."""
    props = dict(stored.properties)
    kind = message_type(props)
    sp = pb.SystemProperties(
        message_id=props.get(PROPERTY_UNIQ_KEY) or stored.msg_id,
        body_digest=pb.Digest(type=pb.MD5, checksum=body_md5(stored.body)),
        body_encoding=pb.IDENTITY, message_type=kind,
        born_timestamp=timestamp(stored.born_timestamp),
        born_host=f"{stored.born_host[0]}:{stored.born_host[1]}",
        store_timestamp=timestamp(stored.store_timestamp), store_host=store_host,
        queue_id=stored.queue_id, queue_offset=stored.queue_offset)
    tags = props.get(PROPERTY_TAGS)
    if tags:
        sp.tag = tags
    keys = props.get(PROPERTY_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(" ") if k)
    group = props.get(PROPERTY_SHARDING_KEY)
    if group:
        sp.message_group = group
    deliver = props.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver and deliver.isdigit():
        sp.delivery_timestamp.CopyFrom(timestamp(int(deliver)))
    trace = props.get(PROPERTY_TRACE_CONTEXT)
    if trace:
        sp.trace_context = trace
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms is not None:
        sp.invisible_duration.CopyFrom(Duration(seconds=invisible_ms // 1000,
                                                nanos=(invisible_ms % 1000) * 1_000_000))
    user = {k: v for k, v in props.items() if k not in _RESERVED and k not in SYSTEM_PROPERTIES}
    return pb.Message(topic=pb.Resource(name=topic or stored.topic), user_properties=user,
                      system_properties=sp, body=stored.body)
