"""Sans-IO frame codec for the RocketMQ remoting protocol: bytes in, commands out.

No sockets, no asyncio, no logging: the transport feeds bytes to :class:`FrameDecoder` and
writes what :func:`encode` returns, and the fuzz tests drive this module with arbitrary bytes.
The rule those tests pin down: any input yields whole commands, "need more", or
:class:`ProtocolError` — never another exception.  Any other exception raised from here is a
txbroker bug (for example encoding a command whose code does not fit the binary header).

Frame (big-endian, docs/protocol.md §1): ``total length L (4) | serialize type (high byte) + header
length H (low 24 bits) | header (H) | body (L - 4 - H)``.  Header type 0 is JSON with
fastjson's field names, type 1 the binary ROCKETMQ layout (§1.1, in ``binary.py``).  The
command itself, :class:`RemotingCommand`, and :class:`ProtocolError` are ``command.py``'s.

Real clients are loose in places and strict elsewhere (docs/protocol.md §8), so the decoder is
lenient exactly where they are: ext field values may arrive as JSON numbers or booleans and are
normalised to strings; the C++ client ends its JSON header with a newline.  Everything else is
strict: a wrongly typed header field is garbage, not something to guess about.  The encoder
always writes ``extFields`` on responses, with string values only, because the C++ client
crashes without the object and silently ignores numeric values.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import orjson

from txbroker.remoting.binary import decode_binary_header, encode_binary_header
from txbroker.remoting.codes import FLAG_RESPONSE, SerializeType
from txbroker.remoting.command import (
    LANGUAGE_NAMES,
    ProtocolError,
    RemotingCommand,
    string_fields,
)

#: The length prefix counts the 4-byte header-length field, so L >= 4.
MIN_TOTAL_LENGTH = 4
#: RocketMQ's default ``frameMaxLength`` (whole frame, prefix included); the configured value
#: (``BrokerConfig.max_frame_size``) is what the transports pass to the decoder.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
#: A header never needs more than this; a larger one is garbage or an attack, refused before
#: it is parsed even when the frame limit would allow it.
MAX_HEADER_SIZE = 1024 * 1024
#: Bytes before the header: the total length and the type/header-length word.
PREFIX_SIZE = 8

_PREFIX = struct.Struct(">ii")
#: Bodies from this size on are written as a buffer of their own instead of being copied
#: behind the header; below it one buffer costs the socket less than two.
SEPARATE_BODY_FROM = 8 * 1024
_LEN = struct.Struct(">i")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1

_JSON = SerializeType.JSON
_ROCKETMQ = int(SerializeType.ROCKETMQ)


# --- framing ----------------------------------------------------------------------------------


def frame_length(buf: bytes | bytearray | memoryview, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 pos: int = 0) -> int | None:
    """Bytes the frame starting at ``pos`` occupies (prefix included), or None for need-more.

    Checks everything the prefix allows, as soon as its bytes are there: a lying total length
    is refused before any memory is reserved for it.
    """
    avail = len(buf) - pos
    if avail < 4:
        return None
    total = _LEN.unpack_from(buf, pos)[0]
    if total < MIN_TOTAL_LENGTH:
        raise ProtocolError(f"frame length {total} is below the minimum {MIN_TOTAL_LENGTH}")
    if total + 4 > max_frame_size:
        raise ProtocolError(f"frame of {total + 4} bytes exceeds the maximum frame size "
                            f"{max_frame_size}")
    if avail >= PREFIX_SIZE:
        mark = _LEN.unpack_from(buf, pos + 4)[0]
        _check_mark(mark, total)
    if avail < 4 + total:
        return None
    return 4 + total


def _check_mark(mark: int, total: int) -> int:
    """Validate the type/header-length word; returns the header length."""
    kind = (mark >> 24) & 0xFF
    if kind != SerializeType.JSON and kind != SerializeType.ROCKETMQ:
        raise ProtocolError(f"unknown serialize type {kind} (expected 0 = JSON or 1 = ROCKETMQ)")
    header_len = mark & 0xFFFFFF
    if header_len > total - 4:
        raise ProtocolError(f"header length {header_len} exceeds the frame's "
                            f"{total - 4} bytes after the prefix")
    if header_len > MAX_HEADER_SIZE:
        raise ProtocolError(f"header length {header_len} exceeds the maximum {MAX_HEADER_SIZE}")
    return header_len


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """Decode exactly one whole frame (as delimited by :func:`frame_length`)."""
    if isinstance(frame, memoryview):
        frame = frame.tobytes()
    if len(frame) < PREFIX_SIZE:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than its 8-byte prefix")
    total = _LEN.unpack_from(frame, 0)[0]
    if total < MIN_TOTAL_LENGTH:
        raise ProtocolError(f"frame length {total} is below the minimum {MIN_TOTAL_LENGTH}")
    if total != len(frame) - 4:
        raise ProtocolError(f"frame length field {total} does not match the "
                            f"{len(frame) - 4} bytes given")
    return _decode_at(frame, 0, 4 + total)


def _decode_at(buf: bytes | bytearray, pos: int, n: int) -> RemotingCommand:
    """Decode the frame of ``n`` bytes at ``pos``; its length field is already checked."""
    mark = _LEN.unpack_from(buf, pos + 4)[0]
    header_len = _check_mark(mark, n - 4)
    start = pos + PREFIX_SIZE
    end = start + header_len
    if mark >> 24:
        cmd = decode_binary_header(memoryview(buf)[start:end])
    else:
        cmd = _decode_json_header(buf[start:end])
    if end < pos + n:
        body = buf[end:pos + n]
        cmd.body = body if body.__class__ is bytes else bytes(body)
    return cmd


# --- JSON header ------------------------------------------------------------------------------


def _int_field(doc: dict[str, Any], name: str, default: int) -> int:
    value = doc.get(name, default)
    if value.__class__ is not int:  # rejects bool, float, str, null, containers
        raise ProtocolError(f"header field {name!r} must be an integer, "
                            f"got {_json_type(value)}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ProtocolError(f"header field {name!r} = {value} is outside the int32 range")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _ext_value(value: Any, key: str) -> str | None:
    """Normalise an ext field value to the string Java would have sent (None = absent)."""
    cls = value.__class__
    if cls is str:
        return value
    if cls is bool:
        return "true" if value else "false"
    if cls is int:
        return str(value)
    if cls is float:
        return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)
    if value is None:
        return None
    raise ProtocolError(f"extFields[{key!r}] must be a string, number or boolean, "
                        f"got {_json_type(value)}")


def _decode_json_header(raw: bytes | bytearray) -> RemotingCommand:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            bytes(raw).decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise ProtocolError(f"JSON header is not UTF-8 (byte {uexc.start})") from None
        raise ProtocolError(f"header is not valid JSON: {exc}") from None
    if doc.__class__ is not dict:
        raise ProtocolError(f"JSON header must be an object, got {_json_type(doc)}")
    get = doc.get
    code = get("code")
    opaque = get("opaque", 0)
    flag = get("flag", 0)
    version = get("version", 0)
    # Fast check of the four integers; the slow path says which one is wrong.
    if not (code.__class__ is int and opaque.__class__ is int and flag.__class__ is int
            and version.__class__ is int and _INT32_MIN <= code <= _INT32_MAX
            and _INT32_MIN <= opaque <= _INT32_MAX and _INT32_MIN <= flag <= _INT32_MAX
            and _INT32_MIN <= version <= _INT32_MAX):
        if code is None:
            raise ProtocolError("JSON header has no 'code'")
        for name in ("code", "opaque", "flag", "version"):
            _int_field(doc, name, 0)
    language = get("language", "JAVA")
    if language.__class__ is not str:
        # Some writers emit the enum ordinal; accept it, reject anything else.
        if language.__class__ is int and language in LANGUAGE_NAMES:
            language = LANGUAGE_NAMES[language]
        else:
            raise ProtocolError(f"header field 'language' must be a language name, "
                                f"got {_json_type(language)}")
    remark = get("remark")
    if remark is not None and remark.__class__ is not str:
        raise ProtocolError(f"header field 'remark' must be a string, got {_json_type(remark)}")
    ext = get("extFields")
    if ext is None:
        ext = {}
    elif ext.__class__ is not dict:
        raise ProtocolError(f"header field 'extFields' must be an object, got {_json_type(ext)}")
    else:
        for value in ext.values():
            if value.__class__ is not str:
                ext = _normalise_ext(ext)
                break
    serialize = get("serializeTypeCurrentRPC")
    if serialize is not None and serialize.__class__ is not str:
        raise ProtocolError("header field 'serializeTypeCurrentRPC' must be a string, "
                            f"got {_json_type(serialize)}")
    return RemotingCommand(code, opaque, flag, language, version, remark, ext, b"", _JSON)


def _normalise_ext(ext: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in ext.items():
        text = _ext_value(value, key)
        if text is not None:
            out[key] = text
    return out


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    # fastjson's sorted key order, null fields left out as fastjson does.  extFields is always
    # written on responses (the C++ client dereferences it unconditionally) and only ever
    # with string values (it ignores numbers).
    ext = cmd.ext_fields
    if ext:
        ext = string_fields(ext)
    elif not cmd.flag & FLAG_RESPONSE:
        ext = None
    if cmd.remark is None:
        if ext is None:
            return orjson.dumps({"code": cmd.code, "flag": cmd.flag, "language": cmd.language,
                                 "opaque": cmd.opaque, "serializeTypeCurrentRPC": "JSON",
                                 "version": cmd.version})
        return orjson.dumps({"code": cmd.code, "extFields": ext, "flag": cmd.flag,
                             "language": cmd.language, "opaque": cmd.opaque,
                             "serializeTypeCurrentRPC": "JSON", "version": cmd.version})
    doc = {"code": cmd.code, "flag": cmd.flag, "language": cmd.language, "opaque": cmd.opaque,
           "remark": cmd.remark, "serializeTypeCurrentRPC": "JSON", "version": cmd.version}
    if ext is not None:
        doc["extFields"] = ext
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


# --- encode -----------------------------------------------------------------------------------


def encode(cmd: RemotingCommand) -> bytes:
    """Serialise a command as one frame in its own serialize type."""
    parts = encode_parts(cmd)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def encode_parts(cmd: RemotingCommand) -> list[bytes]:
    """The frame of ``cmd`` as buffers to write in order (``transport.writelines``).

    A small frame is one buffer; a large body and each of ``body_parts`` stay buffers of
    their own, so they reach the socket without being copied into the frame.  The bytes on
    the wire are those of :func:`encode`.
    """
    if cmd.serialize_type == _ROCKETMQ:
        header = encode_binary_header(cmd)
        kind = _ROCKETMQ << 24
    else:
        header = _encode_json_header(cmd)
        kind = 0
    header_len = len(header)
    if header_len > MAX_HEADER_SIZE:
        raise ValueError(f"header of {header_len} bytes exceeds {MAX_HEADER_SIZE}")
    parts = cmd.body_parts
    if parts:
        head = _PREFIX.pack(4 + header_len + sum(map(len, parts)), kind | header_len) + header
        return [head, *parts]
    body = cmd.body
    if body.__class__ is not bytes:
        body = bytes(body)  # a memoryview of a mapped file, a bytearray
    if len(body) < SEPARATE_BODY_FROM:
        return [_PREFIX.pack(4 + header_len + len(body), kind | header_len) + header + body]
    return [_PREFIX.pack(4 + header_len + len(body), kind | header_len) + header, body]


# --- incremental decoder ----------------------------------------------------------------------


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole commands back.

    Buffers at most one incomplete frame, and a prefix that announces more than
    ``max_frame_size`` is refused before anything is buffered for it, so a peer cannot make
    the decoder grow without bound.  After a :class:`ProtocolError` the stream position is
    lost; the caller must close the connection (the decoder refuses further input).
    """

    __slots__ = ("_buf", "_failed", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < PREFIX_SIZE:
            raise ValueError(f"max_frame_size {max_frame_size} is below the {PREFIX_SIZE}-byte prefix")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Decode every whole frame now available; keep the incomplete rest."""
        if self._failed is not None:
            raise ProtocolError(f"decoder already failed: {self._failed}")
        if self._buf:
            self._buf += data
            src: bytes | bytearray = self._buf
        elif data.__class__ is bytes:
            src = data  # type: ignore[assignment]  # common case: parse the received bytes, no copy
        else:
            src = bytes(data)
        out: list[RemotingCommand] = []
        pos = 0
        end = len(src)
        limit = self.max_frame_size
        unpack = _PREFIX.unpack_from
        try:
            # Hot path inlined: a well-formed JSON frame costs one unpack and one slice.
            while end - pos >= PREFIX_SIZE:
                total, mark = unpack(src, pos)
                stop = pos + 4 + total
                header_len = mark & 0xFFFFFF
                if (mark >> 24 or total < MIN_TOTAL_LENGTH or stop - pos > limit
                        or header_len > total - 4 or header_len > MAX_HEADER_SIZE):
                    n = frame_length(src, limit, pos)  # raises for a bad prefix
                    if n is None:
                        break
                    out.append(_decode_at(src, pos, n))  # a binary header
                    pos += n
                    continue
                if stop > end:
                    break
                start = pos + PREFIX_SIZE
                cmd = _decode_json_header(src[start:start + header_len])
                if start + header_len < stop:
                    body = src[start + header_len:stop]
                    cmd.body = body if body.__class__ is bytes else bytes(body)
                out.append(cmd)
                pos = stop
            if pos < end:
                frame_length(src, limit, pos)  # refuse a bad partial prefix early
        except ProtocolError as exc:
            self._failed = exc
            self._buf = bytearray()
            raise
        if src is self._buf:
            if pos:
                del self._buf[:pos]
        elif pos < end:
            self._buf = bytearray(src[pos:])
        return out


# --- implementation in use ----------------------------------------------------------------------
# The functions above are the reference.  ``_codec.pyx`` is their compiled twin (built by
# ``pip install`` when a C compiler is there): it decodes well-formed JSON frames and encodes
# JSON headers in C and hands every other case to the functions above, so both give the same
# results and the same errors.  Only the public FrameDecoder and encode_parts are replaced, so
# the reference stays whole under these names whichever is in use; tests/test_extensions.py
# compares the two.
PyFrameDecoder = FrameDecoder
py_encode_parts = encode_parts
py_decode_json_header = _decode_json_header

#: ``"compiled"`` when the Cython twin is in use, ``"python"`` otherwise (not built, or
#: ``TXBROKER_NO_EXTENSIONS`` set to a non-empty value); ``txbroker --version`` says which.
IMPLEMENTATION = "python"
if not os.environ.get("TXBROKER_NO_EXTENSIONS"):
    try:
        from txbroker.remoting._codec import (  # type: ignore[no-redef]
            FrameDecoder,
            encode_parts,
        )
    except ImportError:
        pass
    else:
        IMPLEMENTATION = "compiled"
