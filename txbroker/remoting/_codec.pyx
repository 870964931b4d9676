# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of the hot path of ``codec.py``: frame splitting, the JSON header decode and
the frame encode.

``codec.py`` is the reference and loads this module in place of its own ``FrameDecoder``,
``encode_parts`` and ``_decode_json_header`` when it was built (and ``TXBROKER_NO_EXTENSIONS``
is not set).  This module does the common case in C (a well-formed JSON frame, an all-string
header) and hands anything else to the reference functions: every refusal, every lenient
conversion and every binary (ROCKETMQ) header goes through the same Python code, so both
implementations raise the same exceptions with the same messages, which
tests/test_extensions.py checks on random frames.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy

import orjson

from txbroker.remoting.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    MAX_HEADER_SIZE,
    SEPARATE_BODY_FROM,
    _decode_at,
    _normalise_ext,
    frame_length,
    py_decode_json_header,
    py_encode_parts,
)
from txbroker.remoting.codes import FLAG_RESPONSE, SerializeType
from txbroker.remoting.command import ProtocolError, RemotingCommand, string_fields

cdef object _loads = orjson.loads
cdef object _dumps = orjson.dumps
cdef object _JSONDecodeError = orjson.JSONDecodeError
cdef object _SORT_KEYS = orjson.OPT_SORT_KEYS
cdef object _JSON = SerializeType.JSON
cdef long _ROCKETMQ = int(SerializeType.ROCKETMQ)
cdef long _FLAG_RESPONSE = FLAG_RESPONSE
cdef Py_ssize_t _MAX_HEADER = MAX_HEADER_SIZE
cdef Py_ssize_t _SEPARATE = SEPARATE_BODY_FROM
cdef Py_ssize_t _PREFIX_SIZE = 8
cdef long long _I32_MIN = -(1 << 31)
cdef long long _I32_MAX = (1 << 31) - 1


cdef inline long long _be32(const unsigned char* p) noexcept:
    """A big-endian signed 32-bit integer, as struct's ``>i`` reads it."""
    cdef unsigned int u = ((<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16)
                           | (<unsigned int>p[2] << 8) | <unsigned int>p[3])
    return <long long>(<int>u)


cdef inline void _put_be32(unsigned char* p, unsigned int u) noexcept:
    p[0] = (u >> 24) & 0xFF
    p[1] = (u >> 16) & 0xFF
    p[2] = (u >> 8) & 0xFF
    p[3] = u & 0xFF


cdef inline bint _is_i32(object value):
    """``value`` is a Python int (not a bool) within the int32 range."""
    return type(value) is int and _I32_MIN <= value <= _I32_MAX


def _decode_json_header(raw):
    """``codec._decode_json_header``: the reference's result for every input."""
    try:
        doc = _loads(raw)
    except _JSONDecodeError:
        return py_decode_json_header(raw)  # the reference words the refusal
    if type(doc) is not dict:
        return py_decode_json_header(raw)
    cdef dict d = <dict>doc
    code = d.get("code")
    opaque = d.get("opaque", 0)
    flag = d.get("flag", 0)
    version = d.get("version", 0)
    language = d.get("language", "JAVA")
    remark = d.get("remark")
    ext = d.get("extFields")
    serialize = d.get("serializeTypeCurrentRPC")
    if not (_is_i32(code) and _is_i32(opaque) and _is_i32(flag) and _is_i32(version)
            and type(language) is str and (remark is None or type(remark) is str)
            and (serialize is None or type(serialize) is str)):
        return py_decode_json_header(raw)
    if ext is None:
        ext = {}
    elif type(ext) is not dict:
        return py_decode_json_header(raw)
    else:
        for value in (<dict>ext).values():
            if type(value) is not str:
                ext = _normalise_ext(ext)
                break
    return RemotingCommand(code, opaque, flag, language, version, remark, ext, b"", _JSON)


cdef bytes _encode_json_header(cmd):
    """``codec._encode_json_header``: the same bytes (fastjson's key order, extFields always on
    a response and string values only)."""
    ext = cmd.ext_fields
    if ext:
        ext = string_fields(ext)
    elif not (cmd.flag & _FLAG_RESPONSE):
        ext = None
    remark = cmd.remark
    if remark is None:
        if ext is None:
            return _dumps({"code": cmd.code, "flag": cmd.flag, "language": cmd.language,
                           "opaque": cmd.opaque, "serializeTypeCurrentRPC": "JSON",
                           "version": cmd.version})
        return _dumps({"code": cmd.code, "extFields": ext, "flag": cmd.flag,
                       "language": cmd.language, "opaque": cmd.opaque,
                       "serializeTypeCurrentRPC": "JSON", "version": cmd.version})
    doc = {"code": cmd.code, "flag": cmd.flag, "language": cmd.language, "opaque": cmd.opaque,
           "remark": remark, "serializeTypeCurrentRPC": "JSON", "version": cmd.version}
    if ext is not None:
        doc["extFields"] = ext
    return _dumps(doc, option=_SORT_KEYS)


cdef bytes _frame(bytes header, bytes body):
    """Prefix, header and body in one new buffer: one allocation, two copies."""
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(header)
    cdef Py_ssize_t bl = PyBytes_GET_SIZE(body)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _PREFIX_SIZE + hl + bl)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    _put_be32(p, <unsigned int>(4 + hl + bl))
    _put_be32(p + 4, <unsigned int>hl)
    memcpy(p + 8, PyBytes_AS_STRING(header), hl)
    if bl:
        memcpy(p + 8 + hl, PyBytes_AS_STRING(body), bl)
    return out


def encode_parts(cmd):
    """``codec.encode_parts``: the same buffers for every command."""
    if cmd.serialize_type == _ROCKETMQ or cmd.body_parts:
        return py_encode_parts(cmd)  # binary header / a parted body: rare, left to the reference
    cdef bytes header = _encode_json_header(cmd)
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(header)
    body = cmd.body
    if type(body) is not bytes:
        body = bytes(body)  # a memoryview of a mapped file, a bytearray
    cdef Py_ssize_t bl = PyBytes_GET_SIZE(body)
    if hl > _MAX_HEADER or 4 + hl + bl > _I32_MAX:
        return py_encode_parts(cmd)  # the reference raises the error
    if bl < _SEPARATE:
        return [_frame(header, body)]
    return [_prefix_and_header(header, bl), body]


cdef bytes _prefix_and_header(bytes header, Py_ssize_t bl):
    """Prefix and header of a frame whose body of ``bl`` bytes is written separately."""
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(header)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _PREFIX_SIZE + hl)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    _put_be32(p, <unsigned int>(4 + hl + bl))
    _put_be32(p + 4, <unsigned int>hl)
    memcpy(p + 8, PyBytes_AS_STRING(header), hl)
    return out


cdef class FrameDecoder:
    """``codec.FrameDecoder``: the same commands and the same refusals for every input.

    Buffers at most one incomplete frame; after a :class:`ProtocolError` it refuses further
    input, as the reference does.
    """

    cdef bytearray _buf
    cdef object _failed
    cdef public object max_frame_size

    def __init__(self, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
        if max_frame_size < _PREFIX_SIZE:
            raise ValueError(f"max_frame_size {max_frame_size} is below the {_PREFIX_SIZE}-byte prefix")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._failed = None

    @property
    def buffered(self):
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data):
        """Decode every whole frame now available; keep the incomplete rest."""
        if self._failed is not None:
            raise ProtocolError(f"decoder already failed: {self._failed}")
        if self._buf:
            self._buf += data
            src = self._buf
        elif type(data) is bytes:
            src = data
        else:
            src = bytes(data)
        cdef const unsigned char* p
        cdef Py_ssize_t end
        if type(src) is bytes:
            p = <const unsigned char*>PyBytes_AS_STRING(src)
            end = PyBytes_GET_SIZE(src)
        else:
            p = <const unsigned char*>PyByteArray_AS_STRING(src)
            end = PyByteArray_GET_SIZE(src)
        # A limit beyond any possible frame compares the same as the limit itself.
        limit_obj = self.max_frame_size
        cdef long long limit = limit_obj if limit_obj < (1 << 62) else (1 << 62)
        cdef list out = []
        cdef Py_ssize_t pos = 0, start, stop
        cdef long long total, mark, header_len
        try:
            while end - pos >= _PREFIX_SIZE:
                total = _be32(p + pos)
                mark = _be32(p + pos + 4)
                stop = pos + 4 + total
                header_len = mark & 0xFFFFFF
                if ((mark >> 24) != 0 or total < 4 or 4 + total > limit
                        or header_len > total - 4 or header_len > _MAX_HEADER):
                    n = frame_length(src, limit_obj, pos)  # raises for a bad prefix
                    if n is None:
                        break
                    out.append(_decode_at(src, pos, n))  # a binary header
                    pos += n
                    continue
                if stop > end:
                    break
                start = pos + _PREFIX_SIZE
                cmd = _decode_json_header(
                    PyBytes_FromStringAndSize(<const char*>p + start, header_len))
                if start + header_len < stop:
                    cmd.body = PyBytes_FromStringAndSize(<const char*>p + start + header_len,
                                                         stop - start - header_len)
                out.append(cmd)
                pos = stop
            if pos < end:
                frame_length(src, limit_obj, pos)  # refuse a bad partial prefix early
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
