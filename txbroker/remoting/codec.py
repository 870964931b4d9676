"""Sans-IO frame codec for the RocketMQ remoting protocol: bytes in, commands out.

No sockets, no asyncio, no logging: the transport feeds bytes to :class:`FrameDecoder` and
writes what :func:`encode` returns, and the fuzz tests drive this module with arbitrary bytes.
The rule those tests pin down: any input yields whole commands, "need more", or
:class:`ProtocolError` — never another exception.

Frame (big-endian): ``total length L (4) | serialize type (1 byte) + header length H (3) |
header (H) | body (L - 4 - H)``.  Header type 0 is JSON (fastjson field names), type 1 the
binary ROCKETMQ layout (protocol.md §1.1).  Real clients are loose in places and strict
elsewhere (client-capture.md §5): ext field values may arrive as JSON numbers or booleans and
are normalised to strings here; the C++ client ends its JSON header with a newline; that
client crashes on responses without ``extFields`` and ignores numeric values, so every encoded
response carries ``extFields`` with string values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

from txbroker.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    VERSION_4_9_8,
    LanguageCode,
    ResponseCode,
    SerializeType,
)

#: The length prefix counts the 4-byte header-length field, so L >= 4.
MIN_TOTAL_LENGTH = 4
#: RocketMQ's default ``frameMaxLength``; the configured value is passed to the decoder.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
#: A header needs no more than this; larger ones are garbage or an attack.
MAX_HEADER_SIZE = 1024 * 1024

_PREFIX = struct.Struct(">ii")
_LEN = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag

_LANG_BY_NAME = {lang.name: lang for lang in LanguageCode}
_LANG_BY_CODE = {int(lang): lang.name for lang in LanguageCode}


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame; the connection cannot continue.

    ``code`` is the response code a server would answer with when it can still answer.
    """

    def __init__(self, message: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class RemotingCommand:
    """One request or response, independent of its serialization."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "PYTHON"
    version: int = VERSION_4_9_8
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(cls, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                *, oneway: bool = False, opaque: int = 0) -> "RemotingCommand":
        return cls(code=int(code), opaque=opaque, flag=FLAG_ONEWAY if oneway else 0,
                   ext_fields=dict(ext or {}), body=body)

    def response(self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                 ext: dict[str, str] | None = None, body: bytes = b"") -> "RemotingCommand":
        """The answer to this request: same opaque and serialization, response bit set."""
        return RemotingCommand(code=int(code), opaque=self.opaque, flag=FLAG_RESPONSE,
                               remark=remark, ext_fields=dict(ext or {}), body=body,
                               serialize_type=self.serialize_type)


def frame_length(buf: bytes | bytearray | memoryview, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 pos: int = 0) -> int | None:
    """Bytes the frame starting at ``pos`` occupies (prefix included), or None for need-more.

    Checks only what the prefix allows: a lying total length is refused here, before any
    memory is reserved for it.
    """
    avail = len(buf) - pos
    if avail < 4:
        return None
    total = _LEN.unpack_from(buf, pos)[0]
    if total < MIN_TOTAL_LENGTH:
        raise ProtocolError(f"frame length {total} below the minimum {MIN_TOTAL_LENGTH}")
    if total > max_frame_size:
        raise ProtocolError(f"frame length {total} exceeds the maximum {max_frame_size}")
    if avail >= 8:
        header_len = _LEN.unpack_from(buf, pos + 4)[0] & 0xFFFFFF
        if header_len > total - 4:
            raise ProtocolError(f"header length {header_len} exceeds the frame ({total - 4} bytes)")
    if avail < 4 + total:
        return None
    return 4 + total


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """Decode one whole frame (as delimited by :func:`frame_length`)."""
    if len(frame) < 8:
        raise ProtocolError("frame shorter than its 8-byte prefix")
    total, mark = _PREFIX.unpack_from(frame, 0)
    if total != len(frame) - 4:
        raise ProtocolError(f"frame length {total} does not match {len(frame) - 4} bytes")
    kind = (mark >> 24) & 0xFF
    header_len = mark & 0xFFFFFF
    if header_len > total - 4:
        raise ProtocolError(f"header length {header_len} exceeds the frame")
    if header_len > MAX_HEADER_SIZE:
        raise ProtocolError(f"header length {header_len} exceeds {MAX_HEADER_SIZE}")
    header = frame[8:8 + header_len]
    body = bytes(frame[8 + header_len:])
    if kind == SerializeType.JSON:
        cmd = _decode_json_header(header)
    elif kind == SerializeType.ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise ProtocolError(f"unknown serialize type {kind}")
    cmd.body = body
    return cmd


def _as_int(value: Any, name: str, bits: int = 32) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ProtocolError(f"header field {name!r} is not an integer") from None
        else:
            raise ProtocolError(f"header field {name!r} is not an integer")
    limit = 1 << (bits - 1)
    if not -limit <= value < limit:
        raise ProtocolError(f"header field {name!r} out of range")
    return value


def _ext_value(value: Any, key: str) -> str:
    """Normalise an ext field value to the string Java would have sent."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        return ""
    raise ProtocolError(f"extFields[{key!r}] is not a scalar")


def _decode_json_header(raw: bytes | memoryview) -> RemotingCommand:
    try:
        doc = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("header is not a JSON object")
    if "code" not in doc:
        raise ProtocolError("header has no 'code'")
    code = _as_int(doc["code"], "code")
    language = doc.get("language", "JAVA")
    if isinstance(language, int) and not isinstance(language, bool):
        language = _LANG_BY_CODE.get(language, "OTHER")
    if not isinstance(language, str):
        raise ProtocolError("header field 'language' is not a string")
    remark = doc.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise ProtocolError("header field 'remark' is not a string")
    ext_raw = doc.get("extFields")
    ext: dict[str, str] = {}
    if ext_raw is not None:
        if not isinstance(ext_raw, dict):
            raise ProtocolError("header field 'extFields' is not an object")
        ext = {str(k): _ext_value(v, k) for k, v in ext_raw.items()}
    return RemotingCommand(
        code=code,
        opaque=_as_int(doc.get("opaque", 0), "opaque"),
        flag=_as_int(doc.get("flag", 0), "flag"),
        language=language,
        version=_as_int(doc.get("version", 0), "version"),
        remark=remark,
        ext_fields=ext,
        serialize_type=SerializeType.JSON,
    )


def _read_str(raw: bytes | memoryview, pos: int, n: int, what: str) -> str:
    if n < 0 or pos + n > len(raw):
        raise ProtocolError(f"{what} length {n} exceeds the header")
    try:
        return bytes(raw[pos:pos + n]).decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


def _decode_binary_header(raw: bytes | memoryview) -> RemotingCommand:
    n = len(raw)
    if n < _BIN_FIXED.size + 8:
        raise ProtocolError(f"binary header of {n} bytes is shorter than its fixed part")
    code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(raw, 0)
    pos = _BIN_FIXED.size
    remark_len = _LEN.unpack_from(raw, pos)[0]
    pos += 4
    remark = _read_str(raw, pos, remark_len, "remark") if remark_len else None
    pos += max(remark_len, 0)
    if pos + 4 > n:
        raise ProtocolError("binary header ends before its extFields length")
    ext_len = _LEN.unpack_from(raw, pos)[0]
    pos += 4
    if ext_len < 0 or pos + ext_len > n:
        raise ProtocolError(f"extFields length {ext_len} exceeds the header")
    end = pos + ext_len
    ext: dict[str, str] = {}
    while pos < end:
        if pos + 2 > end:
            raise ProtocolError("truncated extFields key length")
        klen = struct.unpack_from(">h", raw, pos)[0]
        pos += 2
        key = _read_str(raw[:end], pos, klen, "extFields key")
        pos += klen
        if pos + 4 > end:
            raise ProtocolError("truncated extFields value length")
        vlen = _LEN.unpack_from(raw, pos)[0]
        pos += 4
        ext[key] = _read_str(raw[:end], pos, vlen, "extFields value")
        pos += vlen
    return RemotingCommand(code=code, opaque=opaque, flag=flag,
                           language=_LANG_BY_CODE.get(lang, "OTHER"), version=version,
                           remark=remark, ext_fields=ext, serialize_type=SerializeType.ROCKETMQ)


def encode(cmd: RemotingCommand) -> bytes:
    """Serialise a command as one frame in its own serialize type."""
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        header = _encode_binary_header(cmd)
    else:
        header = _encode_json_header(cmd)
    body = cmd.body
    return b"".join((
        _PREFIX.pack(4 + len(header) + len(body), (int(cmd.serialize_type) << 24) | len(header)),
        header,
        body,
    ))


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    # Keys in fastjson's sorted order.  extFields is always written for responses (the C++
    # client dereferences it unconditionally) and always with string values.
    doc: dict[str, Any] = {"code": int(cmd.code)}
    if cmd.ext_fields or cmd.is_response:
        doc["extFields"] = {k: str(v) for k, v in cmd.ext_fields.items()}
    doc["flag"] = cmd.flag
    doc["language"] = cmd.language
    doc["opaque"] = cmd.opaque
    if cmd.remark is not None:
        doc["remark"] = cmd.remark
    doc["serializeTypeCurrentRPC"] = "JSON"
    doc["version"] = cmd.version
    return orjson.dumps(doc)


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = _LANG_BY_NAME.get(cmd.language, LanguageCode.OTHER)
    remark = (cmd.remark or "").encode()
    ext_parts: list[bytes] = []
    for key, value in cmd.ext_fields.items():
        kb, vb = key.encode(), str(value).encode()
        ext_parts.append(struct.pack(">h", len(kb)) + kb + _LEN.pack(len(vb)) + vb)
    ext = b"".join(ext_parts)
    return b"".join((
        _BIN_FIXED.pack(int(cmd.code), int(lang), cmd.version, cmd.opaque, cmd.flag),
        _LEN.pack(len(remark)), remark,
        _LEN.pack(len(ext)), ext,
    ))


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole commands back.

    Buffers at most one frame's worth of bytes beyond what it has handed out; a prefix that
    announces more than ``max_frame_size`` is refused before anything is buffered for it.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        self._buf += data
        out: list[RemotingCommand] = []
        pos = 0
        try:
            while True:
                n = frame_length(self._buf, self.max_frame_size, pos)
                if n is None:
                    break
                out.append(decode_frame(bytes(self._buf[pos:pos + n])))
                pos += n
        finally:
            if pos:
                del self._buf[:pos]
        return out
