"""Kafka's wire primitives: big-endian integers, varints, classic and compact strings, bytes and
arrays, tagged-field sections (docs/kafka.md, "Wire codec").

`Reader` walks a bytes-like buffer and raises `KafkaDecodeError` naming what it was reading and
at which offset, so a malformed frame is reported precisely and never surfaces as an
IndexError or struct.error.  `Writer` appends to one bytearray."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class KafkaDecodeError(ValueError):
    """Malformed Kafka bytes: `what` was being read at byte `offset`."""

    def __init__(self, what: str, offset: int, detail: str = "truncated") -> None:
        super().__init__(f"malformed Kafka data: {what} at offset {offset}: {detail}")
        self.what = what
        self.offset = offset


class Reader:
    """Sequential reader over a bytes-like object; `pos` is the next byte to read."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self.buf = data
        self.pos = pos
        self.end = len(data)

    def remaining(self) -> int:
        return self.end - self.pos

    def _need(self, n: int, what: str) -> int:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise KafkaDecodeError(what, pos)
        self.pos = pos + n
        return pos

    def int8(self, what: str = "int8") -> int:
        return _I8.unpack_from(self.buf, self._need(1, what))[0]

    def int16(self, what: str = "int16") -> int:
        return _I16.unpack_from(self.buf, self._need(2, what))[0]

    def int32(self, what: str = "int32") -> int:
        return _I32.unpack_from(self.buf, self._need(4, what))[0]

    def uint32(self, what: str = "uint32") -> int:
        return _U32.unpack_from(self.buf, self._need(4, what))[0]

    def int64(self, what: str = "int64") -> int:
        return _I64.unpack_from(self.buf, self._need(8, what))[0]

    def bool(self, what: str = "bool") -> bool:
        return self.buf[self._need(1, what)] != 0

    def uvarint(self, what: str = "uvarint") -> int:
        """Unsigned varint: 7 bits a byte, low group first; at most 5 bytes (a uint32)."""
        buf, pos, end = self.buf, self.pos, self.end
        value = shift = 0
        while True:
            if pos >= end:
                raise KafkaDecodeError(what, self.pos)
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 28:
                raise KafkaDecodeError(what, self.pos, "varint longer than 5 bytes")

    def uvarlong(self, what: str = "uvarlong") -> int:
        buf, pos, end = self.buf, self.pos, self.end
        value = shift = 0
        while True:
            if pos >= end:
                raise KafkaDecodeError(what, self.pos)
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 63:
                raise KafkaDecodeError(what, self.pos, "varlong longer than 10 bytes")

    def varint(self, what: str = "varint") -> int:
        """Zig-zag signed varint (int32)."""
        z = self.uvarint(what)
        return (z >> 1) ^ -(z & 1)

    def varlong(self, what: str = "varlong") -> int:
        z = self.uvarlong(what)
        return (z >> 1) ^ -(z & 1)

    def raw(self, n: int, what: str = "bytes") -> bytes:
        pos = self._need(n, what)
        return bytes(self.buf[pos : pos + n])

    def _text(self, n: int, what: str) -> str:
        pos = self._need(n, what)
        try:
            return str(self.buf[pos : pos + n], "utf-8")
        except UnicodeDecodeError:
            raise KafkaDecodeError(what, pos, "invalid UTF-8") from None

    def string(self, what: str = "string") -> str:
        n = self.int16(what)
        if n < 0:
            raise KafkaDecodeError(what, self.pos - 2, "null where a string is required")
        return self._text(n, what)

    def nullable_string(self, what: str = "nullable string") -> str | None:
        n = self.int16(what)
        if n < 0:
            return None
        return self._text(n, what)

    def compact_string(self, what: str = "compact string") -> str:
        n = self.uvarint(what) - 1
        if n < 0:
            raise KafkaDecodeError(what, self.pos - 1, "null where a string is required")
        return self._text(n, what)

    def compact_nullable_string(self, what: str = "compact nullable string") -> str | None:
        n = self.uvarint(what) - 1
        if n < 0:
            return None
        return self._text(n, what)

    def bytes(self, what: str = "bytes") -> bytes:
        n = self.int32(what)
        if n < 0:
            raise KafkaDecodeError(what, self.pos - 4, "null where bytes are required")
        return self.raw(n, what)

    def nullable_bytes(self, what: str = "nullable bytes") -> bytes | None:
        n = self.int32(what)
        if n < 0:
            return None
        return self.raw(n, what)

    def compact_bytes(self, what: str = "compact bytes") -> bytes:
        n = self.uvarint(what) - 1
        if n < 0:
            raise KafkaDecodeError(what, self.pos - 1, "null where bytes are required")
        return self.raw(n, what)

    def compact_nullable_bytes(self, what: str = "compact nullable bytes") -> bytes | None:
        n = self.uvarint(what) - 1
        if n < 0:
            return None
        return self.raw(n, what)

    def _count(self, n: int, what: str) -> int:
        # every element takes at least one byte: a count beyond the bytes left is malformed,
        # refused before any allocation
        if n > self.end - self.pos:
            raise KafkaDecodeError(what, self.pos, f"array count {n} exceeds the bytes left")
        return n

    def array(self, item: Callable[[Reader], Any], what: str = "array") -> list | None:
        """Classic array (int32 count, -1 = null)."""
        n = self.int32(what)
        if n < 0:
            return None
        return [item(self) for _ in range(self._count(n, what))]

    def compact_array(self, item: Callable[[Reader], Any], what: str = "compact array") -> list | None:
        """Compact array (uvarint count + 1, 0 = null)."""
        n = self.uvarint(what) - 1
        if n < 0:
            return None
        return [item(self) for _ in range(self._count(n, what))]

    def tagged_fields(self, what: str = "tagged fields") -> dict[int, bytes]:
        """Collects a tagged-field section: tag -> raw value bytes."""
        out: dict[int, bytes] = {}
        for _ in range(self._count(self.uvarint(what), what)):
            tag = self.uvarint(what)
            out[tag] = self.raw(self.uvarint(what), what)
        return out

    def skip_tagged_fields(self, what: str = "tagged fields") -> None:
        n = self.uvarint(what)
        if n == 0:
            return
        for _ in range(self._count(n, what)):
            self.uvarint(what)
            self._need(self.uvarint(what), what)


def _uvarint_bytes(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"unsigned varint cannot hold {n}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_UVARINT = [bytes((i,)) for i in range(128)]


def uvarint_bytes(n: int) -> bytes:
    """The unsigned-varint encoding of `n` (n >= 0)."""
    if 0 <= n < 128:
        return _SMALL_UVARINT[n]
    return _uvarint_bytes(n)


def varint_bytes(n: int) -> bytes:
    """The zig-zag signed-varint encoding of `n` (works for int32 and int64 alike)."""
    z = (n << 1) ^ (n >> 63)
    if z < 128:
        return _SMALL_UVARINT[z]
    if z < 16384:
        return bytes(((z & 0x7F) | 0x80, z >> 7))
    return _uvarint_bytes(z)


class Writer:
    """Appends Kafka primitives to `buf`."""

    __slots__ = ("buf",)

    def __init__(self, buf: bytearray | None = None) -> None:
        self.buf = bytearray() if buf is None else buf

    def getvalue(self) -> bytes:
        return bytes(self.buf)

    def int8(self, v: int) -> None:
        self.buf += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self.buf += _U32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def bool(self, v: bool) -> None:
        self.buf.append(1 if v else 0)

    def uvarint(self, v: int) -> None:
        self.buf += uvarint_bytes(v)

    def varint(self, v: int) -> None:
        self.buf += varint_bytes(v)

    varlong = varint

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buf += data

    def string(self, v: str) -> None:
        b = v.encode()
        self.buf += _I16.pack(len(b))
        self.buf += b

    def nullable_string(self, v: str | None) -> None:
        if v is None:
            self.buf += b"\xff\xff"
        else:
            self.string(v)

    def compact_string(self, v: str) -> None:
        b = v.encode()
        self.buf += uvarint_bytes(len(b) + 1)
        self.buf += b

    def compact_nullable_string(self, v: str | None) -> None:
        if v is None:
            self.buf.append(0)
        else:
            self.compact_string(v)

    def bytes(self, v: bytes | bytearray | memoryview) -> None:
        self.buf += _I32.pack(len(v))
        self.buf += v

    def nullable_bytes(self, v: bytes | bytearray | memoryview | None) -> None:
        if v is None:
            self.buf += b"\xff\xff\xff\xff"
        else:
            self.bytes(v)

    def compact_bytes(self, v: bytes | bytearray | memoryview) -> None:
        self.buf += uvarint_bytes(len(v) + 1)
        self.buf += v

    def compact_nullable_bytes(self, v: bytes | bytearray | memoryview | None) -> None:
        if v is None:
            self.buf.append(0)
        else:
            self.compact_bytes(v)

    def array(self, items: list | None, item: Callable[[Writer, Any], None]) -> None:
        if items is None:
            self.buf += b"\xff\xff\xff\xff"
            return
        self.buf += _I32.pack(len(items))
        for v in items:
            item(self, v)

    def compact_array(self, items: list | None, item: Callable[[Writer, Any], None]) -> None:
        if items is None:
            self.buf.append(0)
            return
        self.buf += uvarint_bytes(len(items) + 1)
        for v in items:
            item(self, v)

    def tagged_fields(self, fields: dict[int, bytes] | None = None) -> None:
        """A tagged-field section, tags ascending; empty -> the single byte 0."""
        if not fields:
            self.buf.append(0)
            return
        self.buf += uvarint_bytes(len(fields))
        for tag in sorted(fields):
            value = fields[tag]
            self.buf += uvarint_bytes(tag)
            self.buf += uvarint_bytes(len(value))
            self.buf += value
