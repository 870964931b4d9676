"""The RocketMQ commitlog record: pure encode/decode, no I/O.

One layout serves three places, which is why it lives in one pure module: the commitlog on
disk, the body of a PULL response (records exactly as stored, concatenated) and the body of a
CHECK_TRANSACTION_STATE request.  RocketMQ clients decode these bytes themselves, so the
layout follows ``MessageDecoder`` exactly (docs/protocol.md §6.1); the client SDK imports this
module to decode pulled records.

Record (big-endian, IPv4 hosts)::

    TOTALSIZE 4 | MAGIC 4 | BODYCRC 4 | QUEUEID 4 | FLAG 4 | QUEUEOFFSET 8 | PHYSICALOFFSET 8
    SYSFLAG 4 | BORNTIMESTAMP 8 | BORNHOST 4+4 | STORETIMESTAMP 8 | STOREHOST 4+4
    RECONSUMETIMES 4 | PREPAREDTRANSACTIONOFFSET 8 | BODYLEN 4 + body | TOPICLEN 1 + topic
    PROPERTIESLEN 2 + properties
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

# --- magic codes ---------------------------------------------------------------------------
MESSAGE_MAGIC = 0xDAA320A7
#: End-of-segment filler: the rest of a segment that a record did not fit into.
BLANK_MAGIC = 0xCBD43194

# --- sys flags (MessageSysFlag) ------------------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_MASK = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20

# --- property names (MessageConst) ---------------------------------------------------------
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_TRANSACTION_ID = "__transactionId__"
#: RocketMQ 5 timer messages (MessageConst): when to deliver, absolute (epoch ms) or relative.
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
#: Set by the broker on a stored timer: the delivery time it resolved (epoch ms).
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"

# --- system topics -------------------------------------------------------------------------
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
DEFAULT_TOPIC = "TBW102"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

#: The stored properties length is an int16.
MAX_PROPERTIES_BYTES = 32767
#: The topic length is a signed byte (V1 records) for RocketMQ clients: the longest topic they
#: can name and read.
MAX_TOPIC_BYTES = 127
#: The longest topic the store writes: Kafka's 249.  The length byte is read unsigned here; a
#: topic past 127 bytes is one only Kafka clients can name (RocketMQ clients refuse it first).
MAX_STORED_TOPIC_BYTES = 249
#: Topic names, one rule for every protocol and for the SDK and CLI: Kafka's characters
#: (letters, digits, ``.``, ``_``, ``-``) plus RocketMQ's separators ``%`` (``%RETRY%``,
#: ``%DLQ%``, namespaces) and ``|``; 1 to :data:`MAX_STORED_TOPIC_BYTES`, never ``.`` or ``..``.
#: Stock RocketMQ clients check a stricter rule before they send (docs/protocol.md, "Topic
#: and group names"): no ``.``, at most :data:`MAX_TOPIC_BYTES`.
TOPIC_NAME_RE = re.compile(r"^[%|a-zA-Z0-9._-]+$")
#: Group names: RocketMQ's rule, without ``.`` (a group becomes part of ``%RETRY%<group>``).
GROUP_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def topic_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a topic here, in Kafka's words, or None when it can be one."""
    if not isinstance(name, str) or not name:
        return "Topic name is invalid: the empty string is not allowed"
    if name in (".", ".."):
        return f"Topic name is invalid: {name!r} is not allowed"
    if len(name) > MAX_STORED_TOPIC_BYTES:
        return (f"Topic name is invalid: the length of {name[:40]!r}... is longer than "
                f"the max allowed length {MAX_STORED_TOPIC_BYTES}")
    if not TOPIC_NAME_RE.match(name):
        return (f"Topic name is invalid: {name!r} contains one or more characters other "
                f"than ASCII alphanumerics, '.', '_', '-' (and '%', '|')")
    return None


#: TOTALSIZE .. BODYLEN for IPv4 hosts: the store's append path packs a record head with it
#: directly (one pack per record), so the layout is defined once, here.
RECORD_HEAD = struct.Struct(">iIiiiqqiq4siq4siiqi")
_FIXED = RECORD_HEAD
_HEAD = struct.Struct(">iIiiiqqiq4si")  # through BORNHOST (IPv4)
_MID = struct.Struct(">q4siiq")  # STORETIMESTAMP, STOREHOST, RECONSUMETIMES, PREPARED OFFSET
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_HEADER_SIZE = _HEAD.size + _MID.size  # 84 for IPv4
#: Smallest possible record: fixed part + body len + topic len + properties len.
MIN_RECORD_SIZE = _HEADER_SIZE + 4 + 1 + 2

_TOPIC_LEN = [bytes((n,)) for n in range(256)]

_BATCH_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN


class RecordError(ValueError):
    """Bytes that are not a valid record (torn write, corruption, or a lying peer)."""


Host = tuple[str, int]


@dataclass
class Message:
    """What a put needs: a message before the store gives it offsets and a store timestamp."""

    topic: str
    queue_id: int
    body: bytes
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    #: 0 lets the store stamp "now"; a committed half keeps the half's timestamp.
    store_timestamp: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)


@dataclass
class StoredMessage(Message):
    """A decoded record: the message plus everything the store assigned."""

    store_size: int = 0
    body_crc: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    store_host: Host = ("127.0.0.1", 0)

    @property
    def msg_id(self) -> str:
        """The offsetMsgId: store host + commitlog offset, as RocketMQ clients expect."""
        return create_offset_msg_id(self.store_host[0], self.store_host[1], self.physical_offset)


def body_crc(body: bytes) -> int:
    """RocketMQ's body CRC: zlib CRC-32 masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


@functools.lru_cache(maxsize=4096)
def tag_hash(tag: str | None) -> int:
    """Java ``String.hashCode`` of the tag (signed 32-bit), as consume queues store it."""
    if not tag:
        return 0
    h = 0
    for unit in _utf16_units(tag):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _utf16_units(text: str) -> Iterable[int]:
    for ch in text:
        cp = ord(ch)
        if cp < 0x10000:
            yield cp
        else:
            cp -= 0x10000
            yield 0xD800 + (cp >> 10)
            yield 0xDC00 + (cp & 0x3FF)


def properties_to_string(props: dict[str, str]) -> str:
    """Java form: ``k\\x01v`` entries joined by ``\\x02``, no trailing separator."""
    return PROPERTY_SEPARATOR.join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items() if v is not None
    )


def string_to_properties(text: str | None) -> dict[str, str]:
    """Parse leniently as Java does: tolerate a trailing separator, skip empty pieces."""
    props: dict[str, str] = {}
    if not text:
        return props
    for piece in text.split(PROPERTY_SEPARATOR):
        if len(piece) < 3:
            continue
        key, sep, value = piece.partition(NAME_VALUE_SEPARATOR)
        if sep and key and value:
            props[key] = value
    return props


@functools.lru_cache(maxsize=1024)
def _ip4(host: str) -> bytes:
    try:
        return socket.inet_aton(host)
    except OSError:
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return b"\x7f\x00\x00\x01"
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped.packed
        # RocketMQ C++ clients only read 4-byte hosts; an IPv6 peer is recorded as loopback.
        return b"\x7f\x00\x00\x01"


#: The 4-byte host field for a host string (cached; IPv6 peers without an IPv4 form become
#: loopback, as RocketMQ C++ clients only read 4-byte hosts).
ip4_bytes = _ip4


def _host(raw: bytes, port: int) -> Host:
    return (socket.inet_ntoa(raw), port)


def encode_record(
    msg: Message,
    *,
    physical_offset: int,
    queue_offset: int,
    store_timestamp: int,
    store_host: Host,
    properties: bytes | None = None,
) -> bytes:
    """Serialise ``msg`` as a commitlog record.

    ``properties`` may carry the already-encoded properties bytes, so a caller that also needs
    their length (the store checks limits before taking an offset) encodes them once.
    """
    prop_bytes = properties if properties is not None else properties_to_string(msg.properties).encode()
    topic_bytes = msg.topic.encode()
    if len(topic_bytes) > MAX_STORED_TOPIC_BYTES:
        raise RecordError(f"topic longer than {MAX_STORED_TOPIC_BYTES} bytes")
    if len(prop_bytes) > MAX_PROPERTIES_BYTES:
        raise RecordError(f"properties longer than {MAX_PROPERTIES_BYTES} bytes")
    body = msg.body
    size = _HEADER_SIZE + 4 + len(body) + 1 + len(topic_bytes) + 2 + len(prop_bytes)
    return b"".join((
        _FIXED.pack(size, MESSAGE_MAGIC, body_crc(body), msg.queue_id, msg.flag, queue_offset,
                    physical_offset, msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG),
                    msg.born_timestamp, _ip4(msg.born_host[0]), msg.born_host[1],
                    store_timestamp, _ip4(store_host[0]), store_host[1], msg.reconsume_times,
                    msg.prepared_transaction_offset, len(body)),
        body,
        _TOPIC_LEN[len(topic_bytes)], topic_bytes,
        _I16.pack(len(prop_bytes)), prop_bytes,
    ))


def record_size(body_len: int, topic_len: int, properties_len: int) -> int:
    return _HEADER_SIZE + 4 + body_len + 1 + topic_len + 2 + properties_len


def decode_record(buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = False) -> StoredMessage:
    """Decode the record at ``pos``; every length is checked against the buffer."""
    avail = len(buf) - pos
    if avail < MIN_RECORD_SIZE:
        raise RecordError(f"truncated record: {avail} bytes left, need at least {MIN_RECORD_SIZE}")
    (size, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts,
     born_ip, born_port) = _HEAD.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC:
        raise RecordError(f"bad magic 0x{magic:08X} at {pos}")
    if size < MIN_RECORD_SIZE or size > avail:
        raise RecordError(f"record size {size} out of bounds (available {avail})")
    if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
        raise RecordError("IPv6 host fields are not supported")
    store_ts, store_ip, store_port, reconsume, prepared = _MID.unpack_from(buf, pos + _HEAD.size)
    p = pos + _HEADER_SIZE
    end = pos + size
    body_len = _I32.unpack_from(buf, p)[0]
    p += 4
    if body_len < 0 or p + body_len + 3 > end:
        raise RecordError(f"body length {body_len} exceeds the record")
    body = bytes(buf[p:p + body_len])
    p += body_len
    topic_len = buf[p]
    p += 1
    if p + topic_len + 2 > end:
        raise RecordError(f"topic length {topic_len} exceeds the record")
    try:
        topic = bytes(buf[p:p + topic_len]).decode()
        p += topic_len
        prop_len = _I16.unpack_from(buf, p)[0]
        p += 2
        if prop_len < 0 or p + prop_len != end:
            raise RecordError(f"properties length {prop_len} does not end the record")
        props = string_to_properties(bytes(buf[p:p + prop_len]).decode())
    except UnicodeDecodeError as exc:
        raise RecordError(f"record text is not UTF-8: {exc}") from None
    if check_crc and body_crc(body) != crc:
        raise RecordError(f"body CRC mismatch at {pos}")
    return StoredMessage(
        topic=topic, queue_id=queue_id, body=body, flag=flag, properties=props,
        sys_flag=sys_flag, born_timestamp=born_ts, born_host=_host(born_ip, born_port),
        reconsume_times=reconsume, prepared_transaction_offset=prepared,
        store_timestamp=store_ts, store_size=size, body_crc=crc, queue_offset=queue_offset,
        physical_offset=physical_offset, store_host=_host(store_ip, store_port),
    )


def decode_records(buf: bytes | memoryview, *, check_crc: bool = False) -> list[StoredMessage]:
    """Decode a concatenation of records (a PULL response body)."""
    out: list[StoredMessage] = []
    pos = 0
    while pos < len(buf):
        msg = decode_record(buf, pos, check_crc=check_crc)
        out.append(msg)
        pos += msg.store_size
    return out


class RecordView(NamedTuple):
    """The fields of a stored record that replaying a system queue (op records, discard
    copies) needs: no hosts, flags or CRC."""

    phys: int
    born_ts: int
    store_ts: int
    topic: str
    body: bytes
    properties: dict[str, str]


#: Positions in a stored record with IPv4 hosts (the store writes no other; layout above).
_PHYS_POS, _BORN_TS_POS, _STORE_TS_POS = 28, 40, 56


def view_record(raw: bytes) -> RecordView:
    """Decode only offset, timestamps, body, topic and properties of one stored record.

    Transaction recovery reads millions of op records, and building a full
    :class:`StoredMessage` for each doubles the replay time.  Raises :class:`RecordError`
    (not a record, body past its end), ``struct.error``, ``IndexError`` or
    ``UnicodeDecodeError`` for damaged bytes.
    """
    if len(raw) < MIN_RECORD_SIZE or _U32.unpack_from(raw, 4)[0] != MESSAGE_MAGIC:
        raise RecordError("not a message record")
    body_len = _I32.unpack_from(raw, _HEADER_SIZE)[0]
    p = _HEADER_SIZE + 4
    if body_len < 0 or p + body_len + 3 > len(raw):
        raise RecordError(f"body length {body_len} exceeds the record")
    body = raw[p:p + body_len]
    p += body_len
    topic_end = p + 1 + raw[p]
    topic = raw[p + 1:topic_end].decode()
    props_len = _I16.unpack_from(raw, topic_end)[0]
    props = string_to_properties(raw[topic_end + 2:topic_end + 2 + props_len].decode())
    return RecordView(_I64.unpack_from(raw, _PHYS_POS)[0], _I64.unpack_from(raw, _BORN_TS_POS)[0],
                      _I64.unpack_from(raw, _STORE_TS_POS)[0], topic, body, props)


#: What a compressed body may inflate to when the caller names no limit: BrokerConfig's
#: default ``max_message_size``, which is also the RocketMQ client's own limit on a body
#: before it compresses it (``maxMessageSize``, 4 MiB), so no honest body is larger.
MAX_INFLATED_BODY = 4 * 1024 * 1024
#: The largest body the SDK sends (before compression) and inflates when it pulls.  The SDK
#: checks the broker's limit on the bytes sent, compressed, so an honest body may inflate
#: past MAX_INFLATED_BODY (a 5 MiB text sent as 1 MiB); this bounds it so a consumer is
#: never asked to hold more for one message, whoever answered its pull.
MAX_SDK_BODY = 64 * 1024 * 1024


def inflate_body(body: bytes, limit: int = MAX_INFLATED_BODY) -> bytes:
    """A zlib-compressed body inflated; RecordError when it is not a zlib stream or holds more
    than ``limit`` bytes.  Streams: never more than ``limit + 1`` bytes are produced, however
    much the few bytes stored claim."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RecordError(f"compressed body does not inflate: {exc}") from None
    if len(out) > limit:
        raise RecordError(f"compressed body inflates past {limit} bytes")
    if not d.eof:
        raise RecordError("compressed body does not inflate: incomplete or truncated stream")
    return out


def maybe_decompress(msg: StoredMessage, limit: int = MAX_INFLATED_BODY) -> bytes:
    """The body as the producer meant it: zlib-inflated (at most ``limit`` bytes) when
    COMPRESSED_FLAG is set; RecordError when it cannot be."""
    if msg.sys_flag & COMPRESSED_FLAG:
        return inflate_body(msg.body, limit)
    return msg.body


def encode_batch(items: Iterable[tuple[int, bytes, dict[str, str]]]) -> bytes:
    """Batch body (SEND_BATCH_MESSAGE): per entry TOTALSIZE, MAGIC 0, CRC 0, FLAG, body, props."""
    parts: list[bytes] = []
    for flag, body, props in items:
        prop_bytes = properties_to_string(props).encode()
        total = _BATCH_HEAD.size + len(body) + 2 + len(prop_bytes)
        parts.append(_BATCH_HEAD.pack(total, 0, 0, flag, len(body)))
        parts.append(body)
        parts.append(_I16.pack(len(prop_bytes)))
        parts.append(prop_bytes)
    return b"".join(parts)


def decode_batch(body: bytes | memoryview) -> list[tuple[int, bytes, dict[str, str]]]:
    """Inverse of :func:`encode_batch`; every length is checked."""
    out: list[tuple[int, bytes, dict[str, str]]] = []
    pos = 0
    n = len(body)
    while pos < n:
        if n - pos < _BATCH_HEAD.size + 2:
            raise RecordError(f"truncated batch entry at {pos}")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, pos)
        if total < _BATCH_HEAD.size + 2 or pos + total > n:
            raise RecordError(f"batch entry size {total} out of bounds at {pos}")
        p = pos + _BATCH_HEAD.size
        if body_len < 0 or p + body_len + 2 > pos + total:
            raise RecordError(f"batch entry body length {body_len} exceeds the entry at {pos}")
        entry_body = bytes(body[p:p + body_len])
        p += body_len
        prop_len = _I16.unpack_from(body, p)[0]
        p += 2
        if prop_len < 0 or p + prop_len != pos + total:
            raise RecordError(f"batch entry properties length {prop_len} does not end the entry")
        try:
            props = string_to_properties(bytes(body[p:p + prop_len]).decode())
        except UnicodeDecodeError:
            raise RecordError(f"batch entry properties at {pos} are not UTF-8") from None
        out.append((flag, entry_body, props))
        pos += total
    return out


def create_offset_msg_id(host: str, port: int, offset: int) -> str:
    """offsetMsgId: IPv4 (4) + port int32 + commitlog offset int64, uppercase hex (32 chars)."""
    return (_ip4(host) + struct.pack(">iq", port, offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(host, port, commitlog offset) from a 32-char offsetMsgId; ValueError if malformed."""
    if len(msg_id) != 32:
        raise ValueError(f"offsetMsgId must be 32 hex characters, got {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError("offsetMsgId is not hexadecimal") from None
    port, offset = struct.unpack(">iq", raw[4:])
    if offset < 0:
        raise ValueError("offsetMsgId carries a negative offset")
    return socket.inet_ntoa(raw[:4]), port, offset


# --- implementation in use ----------------------------------------------------------------------
# The decode functions above are the reference.  ``_record.pyx`` is their compiled twin (built
# by ``pip install`` when a C compiler is there): it decodes whole, valid records from bytes
# and hands everything else to the functions above, so both give the same messages and
# errors (tests/test_extensions.py).  The reference stays reachable under these names.
py_string_to_properties = string_to_properties
py_decode_record = decode_record
py_decode_records = decode_records

if not os.environ.get("TXBROKER_NO_EXTENSIONS"):
    try:
        from txbroker.store._record import (  # type: ignore[no-redef]
            decode_record,
            decode_records,
            string_to_properties,
        )
    except ImportError:
        pass
