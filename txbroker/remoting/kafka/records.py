"""RecordBatch v2 (magic 2), Kafka's only record format since 0.11 (docs/kafka.md, "Wire codec").

A batch is a 61-byte header (base offset, length, leader epoch, magic, CRC-32C over everything
from the attributes on, then producer id/epoch/base sequence and the record count) followed by
the records, compressed as one blob when the attributes name a codec.  Each record is
zig-zag-varint framed.  The broker decodes every produced record and encodes every fetched
one, so the record loops below are written flat: locals, one- and two-byte fast paths for varints,
no per-field calls."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google_crc32c import value as _crc32c

from txbroker.remoting.kafka.compression import (
    DEFAULT_MAX_INFLATED,
    RecordsError,
    compress,
    decompress,
)
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.primitives import varint_bytes

__all__ = ["Record", "RecordBatch", "RecordsError", "crc32c", "encode_batch", "read_batches"]

HEADER_SIZE = 61
_LENGTH_OVERHEAD = 12  # base offset and batch length precede what batchLength counts
_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qiibI")  # base offset .. crc
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. records count: what the CRC covers first
_BATCH_LENGTH = struct.Struct(">i")

_TIMESTAMP_TYPE = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_INT32_MAX = 0x7FFFFFFF


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`."""
    return _crc32c(data if isinstance(data, bytes) else bytes(data))


@dataclass(slots=True)
class Record:
    offset_delta: int
    timestamp: int  # absolute, ms
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(slots=True)
class RecordBatch:
    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    data: bytes  # the whole batch as received

    @property
    def compression(self) -> int:
        return self.attributes & 7

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return (self.attributes & _TIMESTAMP_TYPE) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def last_sequence(self) -> int:
        """The sequence of the last record; sequences wrap to 0 after INT32_MAX."""
        if self.base_sequence < 0:
            return self.base_sequence
        return (self.base_sequence + self.last_offset_delta) & _INT32_MAX

    def records(self, limit: int = DEFAULT_MAX_INFLATED) -> list[Record]:
        """The records, decompressed; RecordsError(CORRUPT_MESSAGE) on bad framing,
        RecordsError(INVALID_RECORD) when the count does not match the header,
        RecordsError(MESSAGE_TOO_LARGE) when a compressed payload inflates past ``limit``
        bytes (the broker passes its ``max_message_size``)."""
        payload = self.data[HEADER_SIZE:]
        codec = self.attributes & 7
        if codec:
            payload = decompress(codec, payload, limit)
        return _decode_records(payload, self.records_count, self.base_timestamp)


def _slow_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint of more than one byte (at most 10) at `pos`: (value, next pos)."""
    z = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise RecordsError(ErrorCode.CORRUPT_MESSAGE, "varint longer than 10 bytes")


def _decode_records(buf: bytes, count: int, base_timestamp: int) -> list[Record]:
    out: list[Record] = []
    append = out.append
    slow = _slow_varint
    pos = 0
    size = len(buf)
    try:
        for _ in range(count):
            if pos >= size:
                raise RecordsError(ErrorCode.INVALID_RECORD,
                                   f"batch declares {count} records, holds {len(out)}")
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = slow(buf, pos)
            end = pos + length
            pos += 1  # record attributes: unused
            b = buf[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                ts_delta = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                ts_delta, pos = slow(buf, pos)
            b = buf[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                offset_delta = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                offset_delta, pos = slow(buf, pos)
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                n = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                n, pos = slow(buf, pos)
            if n < 0:
                key = None
            else:
                key = buf[pos : pos + n]
                pos += n
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                n = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                n, pos = slow(buf, pos)
            if n < 0:
                value = None
            else:
                value = buf[pos : pos + n]
                pos += n
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                n = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                n, pos = slow(buf, pos)
            headers = []
            if n:
                if n < 0 or n > end - pos:
                    raise RecordsError(ErrorCode.CORRUPT_MESSAGE, f"bad header count {n}")
                for _ in range(n):
                    hk, pos = slow(buf, pos)
                    if hk < 0:
                        raise RecordsError(ErrorCode.CORRUPT_MESSAGE, "null header key")
                    name = str(buf[pos : pos + hk], "utf-8")
                    pos += hk
                    hv, pos = slow(buf, pos)
                    if hv < 0:
                        headers.append((name, None))
                    else:
                        headers.append((name, buf[pos : pos + hv]))
                        pos += hv
            if pos != end or end > size:
                raise RecordsError(ErrorCode.CORRUPT_MESSAGE,
                                   f"record {len(out)} does not fill its declared length")
            append(Record(offset_delta, base_timestamp + ts_delta, key, value, headers))
    except IndexError:
        raise RecordsError(ErrorCode.CORRUPT_MESSAGE, f"record {len(out)} is truncated") from None
    except UnicodeDecodeError:
        raise RecordsError(ErrorCode.CORRUPT_MESSAGE, "header key is not UTF-8") from None
    if pos != size:
        raise RecordsError(ErrorCode.INVALID_RECORD,
                           f"{size - pos} bytes after the {count} records the batch declares")
    return out


def read_batches(data: bytes | bytearray | memoryview, *, check_crc: bool = True) -> list[RecordBatch]:
    """Every batch in `data`, back to back.  A truncated batch is CORRUPT_MESSAGE (a Produce
    request must carry whole batches), magic other than 2 INVALID_RECORD, a CRC mismatch
    CORRUPT_MESSAGE."""
    if not isinstance(data, bytes):
        data = bytes(data)
    out: list[RecordBatch] = []
    pos = 0
    size = len(data)
    while pos < size:
        if size - pos < HEADER_SIZE:
            raise RecordsError(ErrorCode.CORRUPT_MESSAGE, f"truncated batch header at byte {pos}")
        length = _BATCH_LENGTH.unpack_from(data, pos + 8)[0]
        end = pos + _LENGTH_OVERHEAD + length
        if length < HEADER_SIZE - _LENGTH_OVERHEAD or end > size:
            raise RecordsError(ErrorCode.CORRUPT_MESSAGE,
                               f"batch at byte {pos} declares {length} bytes, {size - pos - 12} left")
        (base_offset, _, leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
         producer_id, producer_epoch, base_sequence, count) = _HEADER.unpack_from(data, pos)
        if magic != 2:
            raise RecordsError(ErrorCode.INVALID_RECORD, f"record batch magic {magic}, only 2 is served")
        batch = data[pos:end] if pos or end != size else data
        if check_crc and _crc32c(batch[21:]) != crc:
            raise RecordsError(ErrorCode.CORRUPT_MESSAGE, f"CRC mismatch in the batch at byte {pos}")
        out.append(RecordBatch(base_offset, leader_epoch, magic, crc, attributes, last_delta, base_ts,
                               max_ts, producer_id, producer_epoch, base_sequence, count, batch))
        pos = end
    return out


def _encode_records(records: list[Record], base_timestamp: int) -> bytearray:
    out = bytearray()
    vb = varint_bytes
    for delta, r in enumerate(records):
        rec = bytearray(1)  # attributes
        rec += vb(r.timestamp - base_timestamp)
        rec += vb(delta)
        key = r.key
        if key is None:
            rec.append(1)  # zig-zag -1
        else:
            rec += vb(len(key))
            rec += key
        value = r.value
        if value is None:
            rec.append(1)
        else:
            rec += vb(len(value))
            rec += value
        headers = r.headers
        rec += vb(len(headers))
        for name, hv in headers:
            hk = name.encode()
            rec += vb(len(hk))
            rec += hk
            if hv is None:
                rec.append(1)
            else:
                rec += vb(len(hv))
                rec += hv
        out += vb(len(rec))
        out += rec
    return out


def encode_batch(base_offset: int, records: list[Record], *, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1, transactional: bool = False,
                 control: bool = False, compression: int = 0) -> bytes:
    """One RecordBatch v2 holding `records`: offset deltas are their positions in the list, the
    base timestamp is the first record's, CreateTime, partition leader epoch -1 (unknown)."""
    base_ts = records[0].timestamp if records else 0
    max_ts = max(r.timestamp for r in records) if records else 0
    payload = _encode_records(records, base_ts)
    if compression:
        payload = compress(compression, bytes(payload))
    attributes = compression | (_TRANSACTIONAL if transactional else 0) | (_CONTROL if control else 0)
    tail = bytearray(_TAIL.pack(attributes, len(records) - 1, base_ts, max_ts, producer_id,
                                producer_epoch, base_sequence, len(records)))
    tail += payload
    crc = _crc32c(bytes(tail))
    return _PREFIX.pack(base_offset, len(tail) + 9, -1, 2, crc) + tail
