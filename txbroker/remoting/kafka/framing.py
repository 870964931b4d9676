"""Kafka frames and headers (docs/kafka.md, "Wire codec").

A frame is an int32 size and that many bytes.  A request header is v1 (api key, version,
correlation id, client id) or, for flexible versions, v2 (v1 plus a tagged-field section); the
client id keeps its int16 length in both.  A response header is the correlation id (v0), plus
a tagged-field section (v1) for flexible versions, except that an ApiVersions response always
uses v0 so that a client can read it whatever version it asked for."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from txbroker.remoting.kafka.apis import SERVED, ApiKey, is_flexible
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.primitives import KafkaDecodeError, Reader, Writer
from txbroker.remoting.kafka.schema import decode_body, encode_body

_HEADER = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")
_VALID_KEYS = frozenset(int(k) for k in ApiKey)


@dataclass(slots=True)
class KafkaRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: dict


class UnsupportedVersion(Exception):
    """An API key txbroker does not know, or a version outside the served range.  The listener
    answers ApiVersions with `api_versions_unsupported` and closes the connection otherwise."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"unsupported Kafka API {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class FrameTooLarge(Exception):
    """A frame declared a size above the maximum (or a negative one)."""

    def __init__(self, size: int, max_size: int) -> None:
        super().__init__(f"Kafka frame of {size} bytes (maximum {max_size})")
        self.size = size
        self.max_size = max_size


def _served(api_key: int, api_version: int) -> bool:
    if api_key not in _VALID_KEYS:
        return False
    lo, hi = SERVED[ApiKey(api_key)]
    return lo <= api_version <= hi


def decode_request(frame: bytes | bytearray | memoryview) -> KafkaRequest:
    """Parses header and body of one request frame (the bytes after its size).  Bytes after the
    body are ignored, as Kafka does."""
    if len(frame) < 8:
        raise KafkaDecodeError("request header", 0)
    api_key, api_version, correlation_id = _HEADER.unpack_from(frame, 0)
    if not _served(api_key, api_version):
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    r = Reader(frame, 8)
    client_id = r.nullable_string("client_id") or ""
    if is_flexible(api_key, api_version):
        r.skip_tagged_fields("request header tagged fields")
    body = decode_body(api_key, api_version, True, r)
    return KafkaRequest(api_key, api_version, correlation_id, client_id, body)


def _frame(w: Writer) -> bytes:
    buf = w.buf
    buf[0:4] = _SIZE.pack(len(buf) - 4)
    return bytes(buf)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: dict) -> bytes:
    """A response frame, size prefix included."""
    w = Writer(bytearray(_SIZE.pack(0) + _SIZE.pack(correlation_id)))
    if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, api_version):
        w.buf.append(0)
    encode_body(api_key, api_version, False, body, w)
    return _frame(w)


def api_versions_unsupported(correlation_id: int) -> bytes:
    """Kafka's answer to an ApiVersions version it does not serve: UNSUPPORTED_VERSION in a v0
    body listing only ApiVersions' own range, so the client retries with a version it can use."""
    lo, hi = SERVED[ApiKey.API_VERSIONS]
    body = {"error_code": ErrorCode.UNSUPPORTED_VERSION,
            "api_keys": [{"api_key": ApiKey.API_VERSIONS, "min_version": lo, "max_version": hi}]}
    return encode_response(ApiKey.API_VERSIONS, 0, correlation_id, body)


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: dict) -> bytes:
    """A request frame, size prefix included (what a client sends)."""
    w = Writer(bytearray(_SIZE.pack(0) + _HEADER.pack(api_key, api_version, correlation_id)))
    w.nullable_string(client_id)
    if is_flexible(api_key, api_version):
        w.buf.append(0)
    encode_body(api_key, api_version, True, body, w)
    return _frame(w)


def decode_response(api_key: int, api_version: int,
                    frame: bytes | bytearray | memoryview) -> tuple[int, dict]:
    """(correlation id, body) of a response frame (the bytes after its size)."""
    r = Reader(frame)
    correlation_id = r.int32("correlation_id")
    if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, api_version):
        r.skip_tagged_fields("response header tagged fields")
    return correlation_id, decode_body(api_key, api_version, False, r)


class FrameSplitter:
    """Cuts a byte stream into frames (without their size prefix); sans-IO."""

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_size:
                raise FrameTooLarge(size, self.max_size)
            if end - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames
