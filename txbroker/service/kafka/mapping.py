"""Kafka record <-> RocketMQ message: the record mapping of docs/kafka.md ("Record mapping").

value <-> body, key <-> ``KEYS``, headers <-> user properties, timestamp <-> born timestamp.
A RocketMQ property is text without the separators ``\\x01``/``\\x02`` and never empty, while a
Kafka key or header is any bytes (or null), may repeat a name, and may be empty; what cannot
be a plain property travels base64-encoded in a property of our own so that a Kafka record
produced here is fetched back exactly.  Both directions run once per record on the data
path, so the common case (text key, a few text headers) takes no detour.
"""

from __future__ import annotations

import base64
import binascii

from txbroker.remoting.kafka.records import Record
from txbroker.service.kafka.producers import PROPERTY_PRODUCER
from txbroker.store.record import (
    COMPRESSED_FLAG,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    Message,
    StoredMessage,
    maybe_decompress,
)

#: Set ("1") when the Kafka value was null: the body is then empty.
PROPERTY_NULL_VALUE = "KAFKA_NULL_VALUE"
#: The key, base64, when it is not text a property can hold (``KEYS`` is then unset).
PROPERTY_KEY_B64 = "KAFKA_KEY_B64"
#: Headers that cannot be plain properties: ``b64(name)[:b64(value)]`` entries joined by ``,``
#: (no ``:`` = null value), in their original order.
PROPERTY_HEADERS_B64 = "KAFKA_HEADERS_B64"

#: RocketMQ system properties (txbroker/store/record.py and the clients' MessageConst): never
#: given to Kafka consumers as headers, and a Kafka header of one of these names is kept
#: encoded rather than allowed to steer the broker (a header "DELAY" must not delay).
SYSTEM_PROPERTIES = frozenset({
    PROPERTY_KEYS, "UNIQ_KEY", "WAIT", "DELAY", "TRAN_MSG", "PGROUP", "REAL_TOPIC", "REAL_QID",
    "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "TRAN_PREPARED_QUEUE_OFFSET",
    "MIN_OFFSET", "MAX_OFFSET", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUME_TIME",
    "MAX_RECONSUME_TIMES", "CLUSTER", "__transactionId__", "MSG_REGION", "TRACE_ON",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
    "PUSH_REPLY_TIME", "MSG_TYPE", "__STARTDELIVERTIME", "SHARDING_KEY", "CONSUME_START_TIME",
    "BORN_HOST", "DELAY_TIME_LEVEL",
    PROPERTY_NULL_VALUE, PROPERTY_KEY_B64, PROPERTY_HEADERS_B64,
    PROPERTY_PRODUCER,
})


def _text(raw: bytes) -> str | None:
    """``raw`` as a property-safe string, or None when it cannot be one."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    if not text or NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        return None
    return text


def _safe_name(name: str) -> bool:
    return (bool(name) and name not in SYSTEM_PROPERTIES and NAME_VALUE_SEPARATOR not in name
            and PROPERTY_SEPARATOR not in name and not _surrogates(name))


def _surrogates(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _b64(raw: bytes) -> str:
    """Base64, never empty (RocketMQ drops empty property values): ``=`` stands for b""."""
    return base64.b64encode(raw).decode("ascii") if raw else "="


def record_to_message(topic: str, queue_id: int, record: Record, *,
                      born_host: tuple[str, int]) -> Message:
    """The message to store for one Kafka record (offsets are the store's to assign)."""
    props: dict[str, str] = {}
    value = record.value
    if value is None:
        value = b""
        props[PROPERTY_NULL_VALUE] = "1"
    key = record.key
    if key is not None:
        text = _text(key)
        if text is None:
            props[PROPERTY_KEY_B64] = _b64(key)
        else:
            props[PROPERTY_KEYS] = text
    if record.headers:
        odd: list[str] = []
        for name, hval in record.headers:
            text = _text(hval) if hval is not None else None
            if text is not None and name not in props and _safe_name(name):
                props[name] = text
            else:
                entry = _b64(name.encode("utf-8", "surrogatepass"))
                odd.append(entry if hval is None else f"{entry}:{_b64(hval)}")
        if odd:
            props[PROPERTY_HEADERS_B64] = ",".join(odd)
    return Message(topic=topic, queue_id=queue_id, body=value, properties=props,
                   born_timestamp=record.timestamp, born_host=born_host)


def message_to_record(msg: StoredMessage, offset_delta: int) -> Record:
    """The Kafka record a consumer gets for a stored message (any protocol produced it).

    RocketMQ system properties are not headers; ``TAGS`` is, under that name (a Kafka header
    ``TAGS`` is stored as the tag, so the two directions agree).  A body the RocketMQ client
    compressed is inflated.  The timestamp is the born time (the store time if unset)."""
    props = msg.properties
    body: bytes | None = msg.body
    if msg.sys_flag & COMPRESSED_FLAG:
        body = maybe_decompress(msg)
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] = []
    if props:
        keys = props.get(PROPERTY_KEYS)
        if keys is not None:
            key = keys.encode()
        for name, text in props.items():
            if name in SYSTEM_PROPERTIES:
                continue
            headers.append((name, text.encode()))
        extra = props.get(PROPERTY_KEY_B64)
        if extra is not None:
            key = _unb64(extra)
        if props.get(PROPERTY_NULL_VALUE) == "1" and not body:
            body = None
        odd = props.get(PROPERTY_HEADERS_B64)
        if odd:
            headers.extend(_decode_headers(odd))
    return Record(offset_delta=offset_delta,
                  timestamp=msg.born_timestamp or msg.store_timestamp,
                  key=key, value=body, headers=headers)


def _unb64(text: str) -> bytes | None:
    if text == "=":
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _decode_headers(text: str) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = []
    for entry in text.split(","):
        name_b64, sep, value_b64 = entry.partition(":")
        name = _unb64(name_b64)
        if name is None:
            continue  # not written by us: skipped rather than failing the whole fetch
        out.append((name.decode("utf-8", "replace"), _unb64(value_b64) if sep else None))
    return out

