"""Pulled records as messages, decoded a field when it is read.

A PULL answer is a concatenation of stored records (the commitlog layout of
``txbroker.store.record``).  Delivery needs only a record's queue offset, and tag filtering its
TAGS; building every field of every record up front (two host strings, the offsetMsgId in hex,
the properties map, a copy of the body) cost more than the rest of delivery.  So a
:class:`PulledMessage` unpacks the fixed part of its record and checks every length at pull
time, as :func:`~txbroker.store.record.decode_record` does (a malformed answer is refused
before anything is delivered), and builds the properties, ids, hosts and body on first read.
It is a :class:`MessageExt` in every other respect: the same fields, which may be assigned.
"""

from __future__ import annotations

import socket
import struct
from functools import cached_property

from txbroker.client.message import MessageExt
from txbroker.store import record as rec

#: The record's fixed part through BODYLEN, IPv4 hosts (the only ones the store writes).
_HEAD = rec.RECORD_HEAD
_HEAD_SIZE = _HEAD.size
_PROPS_LEN = struct.Struct(">h")
_V6 = rec.BORNHOST_V6_FLAG | rec.STOREHOST_V6_FLAG


class PulledMessage(MessageExt):
    """One record of a PULL answer; see the module docstring."""

    def __init__(self, raw: bytes, body_at: int, body_len: int, props_text: str, topic: str,
                 head: tuple, broker_name: str) -> None:
        # Not the dataclass __init__: what delivery reads now, the rest of the record's fixed
        # part (``head``) as cached properties.
        self.queue_id = head[3]
        self.queue_offset = head[5]
        self.topic = topic
        self.broker_name = broker_name
        self._head = head
        self._raw = raw
        self._body_at = body_at
        self._body_len = body_len
        self._props_text = props_text

    # The record's fixed fields (``RECORD_HEAD``: size, magic, crc, queue id, flag, queue
    # offset, physical offset, sys flag, born timestamp, born ip, born port, store timestamp,
    # store ip, store port, reconsume times, prepared offset, body length), read on demand.
    @cached_property
    def flag(self) -> int:  # type: ignore[override]
        return self._head[4]

    @cached_property
    def commit_log_offset(self) -> int:  # type: ignore[override]
        return self._head[6]

    @cached_property
    def sys_flag(self) -> int:  # type: ignore[override]
        return self._head[7]

    @cached_property
    def born_timestamp(self) -> int:  # type: ignore[override]
        return self._head[8]

    @cached_property
    def store_timestamp(self) -> int:  # type: ignore[override]
        return self._head[11]

    @cached_property
    def reconsume_times(self) -> int:  # type: ignore[override]
        return self._head[14]

    @cached_property
    def prepared_transaction_offset(self) -> int:  # type: ignore[override]
        return self._head[15]

    @cached_property
    def properties(self) -> dict[str, str]:  # type: ignore[override]
        return rec.string_to_properties(self._props_text)

    @cached_property
    def tags(self) -> str | None:  # type: ignore[override]
        return self.properties.get(rec.PROPERTY_TAGS)

    @cached_property
    def keys(self) -> str | None:  # type: ignore[override]
        return self.properties.get(rec.PROPERTY_KEYS)

    @cached_property
    def offset_msg_id(self) -> str:  # type: ignore[override]
        head = self._head
        return (head[12] + struct.pack(">iq", head[13], self.commit_log_offset)).hex().upper()

    @cached_property
    def msg_id(self) -> str:  # type: ignore[override]
        return self.properties.get(rec.PROPERTY_UNIQ_KEY) or self.offset_msg_id

    @cached_property
    def transaction_id(self) -> str | None:  # type: ignore[override]
        props = self.properties
        return props.get(rec.PROPERTY_TRANSACTION_ID) or (
            props.get(rec.PROPERTY_UNIQ_KEY) if self.prepared_transaction_offset
            or props.get(rec.PROPERTY_TRANSACTION_PREPARED) else None)

    @cached_property
    def born_host(self) -> str:  # type: ignore[override]
        return f"{socket.inet_ntoa(self._head[9])}:{self._head[10]}"

    @cached_property
    def store_host(self) -> str:  # type: ignore[override]
        return f"{socket.inet_ntoa(self._head[12])}:{self._head[13]}"

    @cached_property
    def body(self) -> bytes:  # type: ignore[override]
        # A compressed body was inflated at pull time (see decode_pulled), so this is a slice.
        return self._raw[self._body_at:self._body_at + self._body_len]


def decode_pulled(raw: bytes, broker_name: str) -> list[PulledMessage]:
    """The records of a PULL answer body; :class:`~txbroker.store.record.RecordError` for
    one that is not a whole, well-formed record (a compressed body that does not inflate
    included).

    Each record's checks are one condition on the way through (the loop runs per delivered
    message); only a record that fails it is looked at again, to say what is wrong.
    """
    out: list[PulledMessage] = []
    pos, end = 0, len(raw)
    unpack, min_size = _HEAD.unpack_from, rec.MIN_RECORD_SIZE
    props_len_at = _PROPS_LEN.unpack_from
    topics: dict[bytes, str] = {}
    while pos < end:
        if end - pos < min_size:
            raise rec.RecordError(f"truncated record: {end - pos} bytes left, need at least {min_size}")
        head = unpack(raw, pos)
        stop = pos + head[0]
        body_at = pos + _HEAD_SIZE
        p = body_at + head[16]  # the topic's length byte
        if (head[1] != rec.MESSAGE_MAGIC or head[0] < min_size or stop > end
                or head[7] & _V6 or head[16] < 0 or p + 3 > stop):
            _refuse(head, pos, end)
        t = p + 1 + raw[p]  # the properties' length
        if t + 2 > stop:
            raise rec.RecordError(f"topic length {raw[p]} exceeds the record")
        if t + 2 + props_len_at(raw, t)[0] != stop:
            raise rec.RecordError(f"properties length {props_len_at(raw, t)[0]} does not end "
                                  "the record")
        topic_raw = raw[p + 1:t]
        try:
            topic = topics.get(topic_raw)
            if topic is None:
                topic = topics[topic_raw] = topic_raw.decode()
            props_text = raw[t + 2:stop].decode()
        except UnicodeDecodeError as exc:
            raise rec.RecordError(f"record text is not UTF-8: {exc}") from None
        msg = PulledMessage(raw, body_at, head[16], props_text, topic, head, broker_name)
        if head[7] & rec.COMPRESSED_FLAG:
            # Bounded: a body from the wire never inflates past what the SDK sends at most
            # (MAX_SDK_BODY; RecordError, as for any malformed record).
            msg.body = rec.inflate_body(raw[body_at:p], rec.MAX_SDK_BODY)
        out.append(msg)
        pos = stop
    return out


def _refuse(head: tuple, pos: int, end: int) -> None:
    """Raise the RecordError that says which check the record at ``pos`` failed."""
    size, magic, sys_flag, body_len = head[0], head[1], head[7], head[16]
    if magic != rec.MESSAGE_MAGIC:
        raise rec.RecordError(f"bad magic 0x{magic:08X} at {pos}")
    if size < rec.MIN_RECORD_SIZE or size > end - pos:
        raise rec.RecordError(f"record size {size} out of bounds (available {end - pos})")
    if sys_flag & _V6:
        raise rec.RecordError("IPv6 host fields are not supported")
    raise rec.RecordError(f"body length {body_len} exceeds the record")
