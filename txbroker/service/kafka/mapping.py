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
    MAX_INFLATED_BODY,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    Message,
    RecordError,
    StoredMessage,
    maybe_decompress,
)

#: Set ("1") when the Kafka value was null: the body is then empty.
PROPERTY_NULL_VALUE = "KAFKA_NULL_VALUE"
#: The key, base64, when it is not text a property can hold (``KEYS`` is then unset).
PROPERTY_KEY_B64 = "KAFKA_KEY_B64"
#: Headers that cannot be plain properties: ``b64(name)[:b64(value)]`` entries joined by ``,``
#: (no ``:`` = null value), in their original order.  When a record has both kinds, every
#: plain header has its place here too, as ``!b64(name)`` (``!`` is outside base64's alphabet),
#: so the headers come back in the order they were produced.
PROPERTY_HEADERS_B64 = "KAFKA_HEADERS_B64"
#: Header added to a record whose stored message cannot be converted (a compressed body that
#: does not inflate, or inflates past ``max_message_size``); its value is the reason, and the
#: record's value is the body exactly as stored.  A consumer gets it and moves on: one bad
#: message never stops a partition.
CONVERSION_ERROR_HEADER = "txbroker.conversion-error"
#: Marks a ``KAFKA_HEADERS_B64`` entry that stands for a plain header (a property).
_PLAIN_REF = "!"

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


def _entry(name: str, value: bytes | None, plain: bool) -> str:
    """One ``KAFKA_HEADERS_B64`` entry: a reference for a plain header, else name and value."""
    entry = _b64(name.encode("utf-8", "surrogatepass"))
    if plain:
        return _PLAIN_REF + entry
    return entry if value is None else f"{entry}:{_b64(value)}"


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
        plain: list[bool] = []
        for name, hval in record.headers:
            text = _text(hval) if hval is not None else None
            ok = text is not None and name not in props and _safe_name(name)
            if ok:
                props[name] = text
            plain.append(ok)
        if not all(plain):  # all plain: the properties' own order is the headers' order
            props[PROPERTY_HEADERS_B64] = ",".join(
                _entry(name, hval, p) for (name, hval), p in zip(record.headers, plain))
    return Message(topic=topic, queue_id=queue_id, body=value, properties=props,
                   born_timestamp=record.timestamp, born_host=born_host)


def message_to_record(msg: StoredMessage, offset_delta: int,
                      limit: int = MAX_INFLATED_BODY) -> Record:
    """The Kafka record a consumer gets for a stored message (any protocol produced it).

    RocketMQ system properties are not headers; ``TAGS`` is, under that name (a Kafka header
    ``TAGS`` is stored as the tag, so the two directions agree).  A body the RocketMQ client
    compressed is inflated, to ``limit`` bytes at most; one that cannot be is delivered as
    stored with a :data:`CONVERSION_ERROR_HEADER`.  The timestamp is the born time (the store
    time if unset)."""
    props = msg.properties
    body: bytes | None = msg.body
    failure = None
    if msg.sys_flag & COMPRESSED_FLAG:
        try:
            body = maybe_decompress(msg, limit)
        except RecordError as exc:
            failure = str(exc)
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] = []
    if props:
        keys = props.get(PROPERTY_KEYS)
        if keys is not None:
            key = keys.encode()
        extra = props.get(PROPERTY_KEY_B64)
        if extra is not None:
            key = _unb64(extra)
        if props.get(PROPERTY_NULL_VALUE) == "1" and not body:
            body = None
        headers = _headers(props)
    if failure is not None:
        headers.append((CONVERSION_ERROR_HEADER, failure.encode()))
    return Record(offset_delta=offset_delta,
                  timestamp=msg.born_timestamp or msg.store_timestamp,
                  key=key, value=body, headers=headers)


def unreadable_record(offset_delta: int, reason: str) -> Record:
    """The record a consumer gets at the offset of a stored message that does not decode at
    all: no key, no value, the reason in :data:`CONVERSION_ERROR_HEADER`."""
    return Record(offset_delta=offset_delta, timestamp=0, key=None, value=None,
                  headers=[(CONVERSION_ERROR_HEADER, reason.encode())])


def _headers(props: dict[str, str]) -> list[tuple[str, bytes | None]]:
    """The headers of a stored message, in the order they were produced: user properties that
    ``KAFKA_HEADERS_B64`` does not place (all of them, for a message without it) first, then
    that property's entries, each reference to a plain header replaced by its property."""
    entries = props.get(PROPERTY_HEADERS_B64)
    placed = _decode_headers(entries) if entries else []
    referenced = {name for name, _, plain in placed if plain}
    out: list[tuple[str, bytes | None]] = [
        (name, text.encode()) for name, text in props.items()
        if name not in SYSTEM_PROPERTIES and name not in referenced]
    for name, value, plain in placed:
        if not plain:
            out.append((name, value))
        elif name in props:
            out.append((name, props[name].encode()))
    return out


def _unb64(text: str) -> bytes | None:
    if text == "=":
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _decode_headers(text: str) -> list[tuple[str, bytes | None, bool]]:
    """The entries of ``KAFKA_HEADERS_B64``: (name, value, whether it is a reference to the
    plain header of that name, whose value is then the property's)."""
    out: list[tuple[str, bytes | None, bool]] = []
    for entry in text.split(","):
        plain = entry.startswith(_PLAIN_REF)
        name_b64, sep, value_b64 = entry.removeprefix(_PLAIN_REF).partition(":")
        name = _unb64(name_b64)
        if name is None:
            continue  # not written by us: skipped rather than failing the whole fetch
        value = _unb64(value_b64) if sep else None
        out.append((name.decode("utf-8", "replace"), value, plain))
    return out
