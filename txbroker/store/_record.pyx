# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of the decode side of ``record.py``: ``string_to_properties``,
``decode_record`` and ``decode_records``.

``record.py`` is the reference and loads these in place of its own when this module was built
(and ``TXBROKER_NO_EXTENSIONS`` is not set).  A whole, valid IPv4 record in a ``bytes`` buffer
is decoded here; anything else (a memoryview, a short or lying record, text that is not UTF-8,
a CRC mismatch) is handed to the reference functions, so both give the same messages and the
same errors, which tests/test_extensions.py checks on random records.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

from dataclasses import fields

from txbroker.store.record import (
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    STOREHOST_V6_FLAG,
    StoredMessage,
    body_crc,
    py_decode_record,
    py_string_to_properties,
)

cdef Py_ssize_t _MIN = MIN_RECORD_SIZE
cdef unsigned int _MAGIC = MESSAGE_MAGIC
cdef long long _V6 = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG
#: Bytes before BODYLEN in a record with IPv4 hosts.
cdef Py_ssize_t _HEADER = 84


cdef inline unsigned int _u32(const unsigned char* p) noexcept:
    return ((<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16)
            | (<unsigned int>p[2] << 8) | <unsigned int>p[3])


cdef inline long long _i32(const unsigned char* p) noexcept:
    return <long long>(<int>_u32(p))


cdef inline long long _i64(const unsigned char* p) noexcept:
    return <long long>((<unsigned long long>_u32(p) << 32) | <unsigned long long>_u32(p + 4))


cdef class _HostText:
    """The dotted text of the last IPv4 address seen at one place in a record: pulled records
    mostly repeat their hosts, so a one-entry cache spares formatting them again."""

    cdef unsigned int last
    cdef str text

    cdef str of(self, const unsigned char* p):
        cdef unsigned int ip = _u32(p)
        if self.text is None or ip != self.last:
            self.text = f"{p[0]}.{p[1]}.{p[2]}.{p[3]}"  # as socket.inet_ntoa writes it
            self.last = ip
        return self.text


cdef _HostText _born_host = _HostText()
cdef _HostText _store_host = _HostText()

#: StoredMessage's fields, in order.  While it is a plain dataclass (no __post_init__, no
#: slots, these fields), a decoded record is built by filling its __dict__ as its generated
#: __init__ would, without the keyword-argument call; otherwise the class is called.
_FIELDS = ("topic", "queue_id", "body", "flag", "properties", "sys_flag", "born_timestamp",
           "born_host", "reconsume_times", "prepared_transaction_offset", "store_timestamp",
           "store_size", "body_crc", "queue_offset", "physical_offset", "store_host")
cdef bint _PLAIN = (not hasattr(StoredMessage, "__post_init__")
                    and "__slots__" not in vars(StoredMessage)
                    and tuple(f.name for f in fields(StoredMessage)) == _FIELDS)
cdef object _new = object.__new__


cdef extern from "Python.h":
    Py_ssize_t PyUnicode_FindChar(object text, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end,
                                  int direction) except -2


def string_to_properties(text):
    """``record.string_to_properties``: the same dict for every input."""
    if not text:
        return {}
    if type(text) is not str:
        return py_string_to_properties(text)
    cdef str s = <str>text
    cdef dict props = {}
    cdef Py_ssize_t n = len(s), start = 0, end, i
    while True:
        end = PyUnicode_FindChar(s, 0x02, start, n, 1)
        if end == -1:
            end = n
        if end - start >= 3:
            i = PyUnicode_FindChar(s, 0x01, start, end, 1)
            # A key before the first separator and a value after it, both non-empty.
            if start < i < end - 1:
                props[s[start:i]] = s[i + 1:end]
        if end >= n:
            return props
        start = end + 1


cdef object _decode(bytes buf, Py_ssize_t pos, bint check_crc):
    """The record at ``pos``, or None when the reference must decide (it raises)."""
    cdef Py_ssize_t avail = PyBytes_GET_SIZE(buf) - pos
    if pos < 0 or avail < _MIN:
        return None
    cdef const unsigned char* base = <const unsigned char*>PyBytes_AS_STRING(buf)
    cdef const unsigned char* r = base + pos
    cdef long long size = _i32(r)
    if _u32(r + 4) != _MAGIC or size < _MIN or size > avail:
        return None
    cdef long long sys_flag = _i32(r + 36)
    if sys_flag & _V6:
        return None
    cdef Py_ssize_t p = _HEADER
    cdef long long body_len = _i32(r + p)
    p += 4
    if body_len < 0 or p + body_len + 3 > size:
        return None
    body = PyBytes_FromStringAndSize(<const char*>r + p, body_len)
    p += body_len
    cdef Py_ssize_t topic_len = r[p]
    p += 1
    if p + topic_len + 2 > size:
        return None
    try:
        topic = PyUnicode_DecodeUTF8(<const char*>r + p, topic_len, NULL)
    except UnicodeDecodeError:
        return None
    p += topic_len
    cdef long long prop_len = <short>((r[p] << 8) | r[p + 1])
    p += 2
    if prop_len < 0 or p + prop_len != size:
        return None
    try:
        text = PyUnicode_DecodeUTF8(<const char*>r + p, prop_len, NULL)
    except UnicodeDecodeError:
        return None
    crc = _i32(r + 8)
    if check_crc and body_crc(body) != crc:
        return None
    values = {
        "topic": topic, "queue_id": _i32(r + 12), "body": body, "flag": _i32(r + 16),
        "properties": string_to_properties(text), "sys_flag": sys_flag,
        "born_timestamp": _i64(r + 40), "born_host": (_born_host.of(r + 48), _i32(r + 52)),
        "reconsume_times": _i32(r + 72), "prepared_transaction_offset": _i64(r + 76),
        "store_timestamp": _i64(r + 56), "store_size": size, "body_crc": crc,
        "queue_offset": _i64(r + 20), "physical_offset": _i64(r + 28),
        "store_host": (_store_host.of(r + 64), _i32(r + 68)),
    }
    if not _PLAIN:
        return StoredMessage(**values)
    msg = _new(StoredMessage)
    msg.__dict__ = values
    return msg


def decode_record(buf, pos=0, *, check_crc=False):
    """``record.decode_record``: the same message, or the same error, for every input."""
    if type(buf) is bytes and type(pos) is int and 0 <= pos < PyBytes_GET_SIZE(buf):
        msg = _decode(<bytes>buf, pos, check_crc)
        if msg is not None:
            return msg
    return py_decode_record(buf, pos, check_crc=check_crc)


def decode_records(buf, *, check_crc=False):
    """``record.decode_records``: a concatenation of records (a PULL response body)."""
    cdef list out = []
    cdef Py_ssize_t pos = 0
    while pos < len(buf):
        msg = decode_record(buf, pos, check_crc=check_crc)
        out.append(msg)
        pos += msg.store_size
    return out
