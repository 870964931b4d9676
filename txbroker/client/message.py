"""Messages as the SDK user sees them, and their conversion to and from the wire.

RocketMQ names, Python style: :class:`Message` is what a producer sends, :class:`MessageExt`
what a consumer (or a transaction check-back) receives.  Properties travel in the RocketMQ
properties string (``k\\x01v`` joined by ``\\x02``), so keys and values may not contain those
two separator characters; system properties (``KEYS``, ``TAGS``, ``UNIQ_KEY``, ...) are set
through the named fields, never smuggled in ``properties``.

UNIQ_KEY (the client message id) follows Java's ``MessageClientIDSetter`` layout so ids look
the same whichever client produced them: client IPv4 (4 bytes) + pid (2) + a per-process random
number standing in for the class-loader hash (4) + milliseconds since the start of the current
month (4) + a counter (2), as 32 uppercase hex characters (docs/protocol.md §6.3).
"""

from __future__ import annotations

import enum
import itertools
import os
import secrets
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from txbroker.store import record as rec

#: Delay levels of RocketMQ's default table ("1s 5s 10s 30s 1m ... 2h").
MAX_DELAY_LEVEL = 18
#: Properties the SDK owns; a user property with one of these names would corrupt a message
#: (a forged ``TRAN_MSG`` or ``REAL_TOPIC``, a second ``UNIQ_KEY``).
RESERVED_PROPERTIES = frozenset({
    rec.PROPERTY_KEYS, rec.PROPERTY_TAGS, rec.PROPERTY_WAIT_STORE_MSG_OK,
    rec.PROPERTY_DELAY_TIME_LEVEL, rec.PROPERTY_UNIQ_KEY, rec.PROPERTY_TRANSACTION_PREPARED,
    rec.PROPERTY_PRODUCER_GROUP, rec.PROPERTY_REAL_TOPIC, rec.PROPERTY_REAL_QUEUE_ID,
    rec.PROPERTY_TRANSACTION_CHECK_TIMES, rec.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    rec.PROPERTY_MIN_OFFSET, rec.PROPERTY_MAX_OFFSET, rec.PROPERTY_RETRY_TOPIC,
    rec.PROPERTY_ORIGIN_MESSAGE_ID, rec.PROPERTY_RECONSUME_TIME, rec.PROPERTY_CLUSTER,
    rec.PROPERTY_TRANSACTION_ID,
})

#: The system entries of a send's properties string, name and separator joined once.
_KEYS, _TAGS, _DELAY, _DELIVER, _UNIQ_KEY = (
    f"{name}{rec.NAME_VALUE_SEPARATOR}" for name in (
        rec.PROPERTY_KEYS, rec.PROPERTY_TAGS, rec.PROPERTY_DELAY_TIME_LEVEL,
        rec.PROPERTY_TIMER_DELIVER_MS, rec.PROPERTY_UNIQ_KEY))
_WAIT_TRUE = f"{rec.PROPERTY_SEPARATOR}{rec.PROPERTY_WAIT_STORE_MSG_OK}{rec.NAME_VALUE_SEPARATOR}true"


class SendStatus(enum.Enum):
    """Outcome of a stored send (RocketMQ ``SendStatus``); anything else raises."""

    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12


class LocalTransactionState(enum.Enum):
    """A local transaction's outcome; the value is END_TRANSACTION's ``commitOrRollback``."""

    COMMIT_MESSAGE = rec.TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = rec.TRANSACTION_ROLLBACK_TYPE
    UNKNOW = rec.TRANSACTION_NOT_TYPE


def validate_topic(name: object) -> str:
    """``name`` if the broker accepts it as a topic, else ValueError saying why.

    The rule is the broker's own (:func:`txbroker.store.record.topic_name_problem`): a topic a
    Kafka client made, such as ``orders.v1``, is one the SDK and CLI can use too.
    """
    problem = rec.topic_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return cast(str, name)  # topic_name_problem passes only a non-empty str


def check_text(what: str, value: object) -> str:
    """``value`` as a string that fits in the properties string (no \\x01 or \\x02)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    if rec.NAME_VALUE_SEPARATOR in value or rec.PROPERTY_SEPARATOR in value:
        raise ValueError(f"{what} {value!r} contains a reserved control character (\\x01 or \\x02)")
    return value


@dataclass
class Message:
    """What a producer sends.

    ``keys`` is one key or a list of keys (stored space-separated, RocketMQ's KEY_SEPARATOR);
    ``delay_level`` > 0 delays delivery by RocketMQ's level table (not allowed in transactions);
    ``deliver_time_ms`` (epoch milliseconds, RocketMQ 5's ``TIMER_DELIVER_MS``) delivers it at
    that time, to the millisecond, up to the broker's ``timer_max_delay`` ahead; a time already
    past delivers it now.  Unlike RocketMQ's clients, a transactional message may carry it: the
    committed message is delivered at that time, a rolled-back one never.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: dict[str, str] | None = None
    delay_level: int = 0
    deliver_time_ms: int | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad field; nothing is sent for a bad message.

        The body's size is checked by :func:`wire_body`, after compression: the limit applies
        to what the broker receives.
        """
        validate_topic(self.topic)
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise TypeError(f"body must be bytes, got {type(self.body).__name__}")
        if len(self.body) == 0:
            raise ValueError("body is empty")
        if self.tags is not None:
            check_text("tags", self.tags)
            if not self.tags or "||" in self.tags:
                raise ValueError(f"tags {self.tags!r} must be non-empty and may not contain '||'")
        for key in self.key_list():
            check_text("key", key)
            if not key or " " in key:
                raise ValueError(f"key {key!r} must be non-empty and contain no spaces")
        for k, v in (self.properties or {}).items():
            check_text("property name", k)
            check_text(f"property {k!r} value", v)
            if not k or not v:
                raise ValueError(f"property {k!r}: names and values must be non-empty")
            if k in RESERVED_PROPERTIES:
                raise ValueError(f"property {k!r} is reserved by the client")
        if (not isinstance(self.delay_level, int) or isinstance(self.delay_level, bool)
                or not 0 <= self.delay_level <= MAX_DELAY_LEVEL):
            raise ValueError(f"delay_level must be an integer in [0, {MAX_DELAY_LEVEL}]")
        if self.deliver_time_ms is not None:
            if (not isinstance(self.deliver_time_ms, int) or isinstance(self.deliver_time_ms, bool)
                    or self.deliver_time_ms < 0):
                raise ValueError("deliver_time_ms must be a non-negative integer (epoch "
                                 f"milliseconds), got {self.deliver_time_ms!r}")
            if self.delay_level:
                raise ValueError("a message has either delay_level or deliver_time_ms, not both")

    def key_list(self) -> list[str]:
        if self.keys is None:
            return []
        if isinstance(self.keys, str):
            return self.keys.split(" ") if self.keys else [""]
        return list(self.keys)

    def wire_properties(self, uniq_key: str) -> dict[str, str]:
        """The properties map as sent: user properties, then the system ones."""
        props = dict(self.properties or {})
        keys = self.key_list()
        if keys:
            props[rec.PROPERTY_KEYS] = " ".join(keys)
        if self.tags:
            props[rec.PROPERTY_TAGS] = self.tags
        if self.delay_level:
            props[rec.PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if self.deliver_time_ms is not None:
            props[rec.PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        props[rec.PROPERTY_UNIQ_KEY] = uniq_key
        props[rec.PROPERTY_WAIT_STORE_MSG_OK] = "true"
        return props

    def wire_properties_text(self, uniq_key: str, extra: str = "") -> str:
        """:meth:`wire_properties` as the properties string a send carries, with ``extra``
        (more entries, each led by the ``\\x02`` separator) at the end.

        Built as a string directly: a dict built per send only to be joined into this
        string cost a third of building the request.  Equal to
        ``properties_to_string(wire_properties(uniq_key)) + extra`` (the tests check it).
        """
        text = f"{_UNIQ_KEY}{uniq_key}{_WAIT_TRUE}{extra}"
        if self.deliver_time_ms is not None:
            text = f"{_DELIVER}{self.deliver_time_ms}{rec.PROPERTY_SEPARATOR}{text}"
        if self.delay_level:
            text = f"{_DELAY}{self.delay_level}{rec.PROPERTY_SEPARATOR}{text}"
        if self.tags:
            text = f"{_TAGS}{self.tags}{rec.PROPERTY_SEPARATOR}{text}"
        if self.keys is not None:
            keys = self.key_list()
            if keys:
                text = f"{_KEYS}{' '.join(keys)}{rec.PROPERTY_SEPARATOR}{text}"
        if self.properties:
            text = "".join([f"{k}{rec.NAME_VALUE_SEPARATOR}{v}{rec.PROPERTY_SEPARATOR}"
                            for k, v in self.properties.items()]) + text
        return text


@dataclass
class MessageExt:
    """A received message: a pulled one, or the half message of a transaction check-back.

    ``msg_id`` is the producer's UNIQ_KEY (falling back to the offsetMsgId when a producer set
    none), ``offset_msg_id`` the broker's store-host + commitlog-offset id.  ``body`` is already
    decompressed.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    msg_id: str = ""
    offset_msg_id: str = ""
    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    born_timestamp: int = 0
    store_timestamp: int = 0
    reconsume_times: int = 0
    transaction_id: str | None = None
    sys_flag: int = 0
    flag: int = 0
    born_host: str = ""
    store_host: str = ""
    prepared_transaction_offset: int = 0
    broker_name: str = ""

    @property
    def key_list(self) -> list[str]:
        return self.keys.split(" ") if self.keys else []

    @classmethod
    def from_stored(cls, stored: rec.StoredMessage, broker_name: str = "") -> MessageExt:
        """Convert a decoded record; a body that fails to inflate raises RecordError."""
        props = dict(stored.properties)
        offset_msg_id = stored.msg_id
        uniq = props.get(rec.PROPERTY_UNIQ_KEY)
        return cls(
            topic=stored.topic,
            body=rec.maybe_decompress(stored),
            tags=props.get(rec.PROPERTY_TAGS),
            keys=props.get(rec.PROPERTY_KEYS),
            properties=props,
            msg_id=uniq or offset_msg_id,
            offset_msg_id=offset_msg_id,
            queue_id=stored.queue_id,
            queue_offset=stored.queue_offset,
            commit_log_offset=stored.physical_offset,
            born_timestamp=stored.born_timestamp,
            store_timestamp=stored.store_timestamp,
            reconsume_times=stored.reconsume_times,
            transaction_id=props.get(rec.PROPERTY_TRANSACTION_ID) or (
                uniq if stored.prepared_transaction_offset or props.get(
                    rec.PROPERTY_TRANSACTION_PREPARED) else None),
            sys_flag=stored.sys_flag,
            flag=stored.flag,
            born_host=f"{stored.born_host[0]}:{stored.born_host[1]}",
            store_host=f"{stored.store_host[0]}:{stored.store_host[1]}",
            prepared_transaction_offset=stored.prepared_transaction_offset,
            broker_name=broker_name,
        )


@dataclass
class SendResult:
    """A stored send.  For a batch, ``msg_id`` / ``offset_msg_id`` are comma-joined."""

    send_status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    topic: str = ""
    broker_name: str = ""
    #: A timer message's recall handle (:meth:`Producer.recall`), None for other sends.
    recall_handle: str | None = None


@dataclass
class TransactionSendResult(SendResult):
    transaction_id: str = ""
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


#: The broker's default ``max_message_size`` and RocketMQ's ``maxMessageSize``: 4 MiB of body.
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: RocketMQ's ``compressMsgBodyOverHowmuch``: bodies of at least this many bytes are compressed.
DEFAULT_COMPRESS_THRESHOLD = 4096


def wire_body(body: bytes, compress_threshold: int, max_size: int) -> tuple[bytes, int]:
    """The body as the broker will receive it, and the sys flag that goes with it.

    Bodies of at least ``compress_threshold`` bytes (0 = never) are zlib-compressed as
    RocketMQ does, but sent compressed only when that makes them smaller: random or already
    compressed data grows under zlib.  The broker refuses a body over its max_message_size
    (MESSAGE_ILLEGAL), measured as received, so the limit is checked here on the same bytes;
    a body over it raises ValueError naming its size, the compressed size and the limit.
    """
    raw = bytes(body)
    if len(raw) > rec.MAX_SDK_BODY:  # a consumer would refuse to inflate it
        raise ValueError(f"message body is {len(raw):,} bytes, over the {rec.MAX_SDK_BODY:,}-byte "
                         "limit of a body before compression")
    sent, flag, packed_size = raw, 0, None
    if 0 < compress_threshold <= len(raw):
        packed = zlib.compress(raw, 5)
        packed_size = len(packed)
        if packed_size < len(raw):
            sent, flag = packed, rec.COMPRESSED_FLAG
    if len(sent) > max_size:
        packed_text = f" ({packed_size:,} compressed)" if packed_size is not None else ""
        raise ValueError(f"message body is {len(raw):,} bytes{packed_text}, over the "
                         f"{max_size:,}-byte limit")
    return sent, flag


class UniqKeyGenerator:
    """Java-layout UNIQ_KEYs; one generator per process is enough, several are harmless."""

    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None,
                 clock=time.time) -> None:
        try:
            ip_bytes = socket.inet_aton(ip)
        except OSError:
            ip_bytes = socket.inet_aton("127.0.0.1")
        pid = os.getpid() if pid is None else pid
        prefix = ip_bytes + struct.pack(">H", pid & 0xFFFF) + secrets.token_bytes(4)
        self._prefix_hex = prefix.hex().upper()
        self._clock = clock
        self._counter = itertools.count(secrets.randbelow(0x10000))
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _roll_month(self, now_ms: int) -> None:
        now = datetime.fromtimestamp(now_ms / 1000.0, tz=UTC).astimezone()
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (start.replace(year=start.year + 1, month=1) if start.month == 12
               else start.replace(month=start.month + 1))
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def next(self) -> str:
        now_ms = int(self._clock() * 1000)
        if not self._month_start_ms <= now_ms < self._next_month_ms:
            self._roll_month(now_ms)
        elapsed = (now_ms - self._month_start_ms) & 0xFFFFFFFF
        count = next(self._counter) & 0xFFFF
        return f"{self._prefix_hex}{elapsed:08X}{count:04X}"

