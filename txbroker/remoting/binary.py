"""The binary (ROCKETMQ, serialize type 1) header of a remoting frame: decode and encode.

RocketMQ's ``RocketMQSerializable`` layout (docs/protocol.md §1.1): ``code (2) | language (1) |
version (2) | opaque (4) | flag (4) | remark length (4) + remark | extFields length (4) +
(key length (2) + key | value length (4) + value)*``, big-endian, strings UTF-8.  Only
the header: the frame around it is ``codec.py``'s.  Sans-IO like the codec, and as strict: a
length that runs past the header, a negative length, bytes left over after the extFields or
text that is not UTF-8 is a :class:`ProtocolError`, never another exception.
"""

from __future__ import annotations

import struct

from txbroker.remoting.codes import LanguageCode, SerializeType
from txbroker.remoting.command import (
    LANGUAGE_NAMES,
    ProtocolError,
    RemotingCommand,
    string_fields,
)

_LEN = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_LANG_BY_NAME = {lang.name: int(lang) for lang in LanguageCode}


def _read_str(raw: memoryview, pos: int, n: int, end: int, what: str) -> str | None:
    if n < 0:
        raise ProtocolError(f"{what} length {n} is negative")
    if pos + n > end:
        raise ProtocolError(f"{what} length {n} runs past the end of the binary header")
    if n == 0:
        return None
    try:
        return str(raw[pos:pos + n], "utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


def decode_binary_header(raw: memoryview) -> RemotingCommand:
    n = len(raw)
    if n < _FIXED.size + 8:
        raise ProtocolError(f"binary header of {n} bytes is shorter than its "
                            f"{_FIXED.size + 8}-byte minimum")
    code, lang, version, opaque, flag = _FIXED.unpack_from(raw, 0)
    pos = _FIXED.size
    remark_len = _LEN.unpack_from(raw, pos)[0]
    pos += 4
    remark = _read_str(raw, pos, remark_len, n - 4, "remark")
    pos += remark_len
    ext_len = _LEN.unpack_from(raw, pos)[0]
    pos += 4
    if ext_len < 0 or pos + ext_len > n:
        raise ProtocolError(f"extFields length {ext_len} runs past the end of the binary header")
    end = pos + ext_len
    if end != n:
        raise ProtocolError(f"binary header has {n - end} trailing bytes after extFields")
    ext: dict[str, str] = {}
    while pos < end:
        if pos + 2 > end:
            raise ProtocolError("extFields entry truncated before its key length")
        klen = _SHORT.unpack_from(raw, pos)[0]
        pos += 2
        key = _read_str(raw, pos, klen, end, "extFields key") or ""
        pos += klen
        if pos + 4 > end:
            raise ProtocolError(f"extFields[{key!r}] truncated before its value length")
        vlen = _LEN.unpack_from(raw, pos)[0]
        pos += 4
        ext[key] = _read_str(raw, pos, vlen, end, f"extFields[{key!r}] value") or ""
        pos += vlen
    return RemotingCommand(code, opaque, flag, LANGUAGE_NAMES.get(lang, "OTHER"), version,
                           remark, ext, b"", SerializeType.ROCKETMQ)


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = _LANG_BY_NAME.get(cmd.language, LanguageCode.OTHER)
    remark = (cmd.remark or "").encode()
    parts = [_FIXED.pack(int(cmd.code), lang, cmd.version, cmd.opaque, cmd.flag),
             _LEN.pack(len(remark)), remark, b""]
    ext_parts: list[bytes] = []
    for key, value in string_fields(cmd.ext_fields).items():
        kb, vb = key.encode(), value.encode()
        ext_parts += (_SHORT.pack(len(kb)), kb, _LEN.pack(len(vb)), vb)
    ext = b"".join(ext_parts)
    parts[3] = _LEN.pack(len(ext))
    parts.append(ext)
    return b"".join(parts)
