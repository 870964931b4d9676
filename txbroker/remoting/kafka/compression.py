"""RecordBatch compression codecs by Kafka's codec id (docs/kafka.md, "Wire codec"): 0 none,
1 gzip, 2 snappy, 3 lz4 (frame format), 4 zstd.

Snappy comes in two framings: Java and the Python clients write xerial's block stream (a
16-byte header, then `[int32 length][raw snappy block]` chunks), librdkafka writes one raw
snappy block.  Decompression accepts both; compression writes the xerial form, as Kafka's own
Java client does.

Decompression is bounded: a peer's few hundred bytes can claim gigabytes (a zstd frame of
zeros inflates about 30000 times), so every codec stops at a byte limit the caller gives (the
broker's ``max_message_size``) and answers MESSAGE_TOO_LARGE past it, without ever holding
more than the limit.  zlib and gzip stream through ``max_length``; a raw snappy block declares
its length up front, which is checked before the block is inflated; lz4 and zstd inflate into
a buffer no larger than the limit, which cramjam refuses to overrun."""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam

from txbroker.remoting.kafka.errors import ErrorCode

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # format version 1, compatible with 1
_XERIAL_BLOCK = 32 * 1024  # xerial's default: uncompressed bytes per block
_I32 = struct.Struct(">i")
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream

#: What a batch may inflate to when the caller names no limit: BrokerConfig.max_message_size's
#: default.  The broker passes its configured value.
DEFAULT_MAX_INFLATED = 4 * 1024 * 1024
#: The first buffer lz4 and zstd inflate into (or four times the input, when larger); it
#: grows fourfold up to the limit, so a small batch never costs a limit-sized allocation.
_FIRST_BUFFER = 64 * 1024
#: cramjam's words (Rust's ``WriteZero``) when lz4 or zstd output does not fit the buffer.
_OUTPUT_FULL = "failed to write whole buffer"
#: Output bytes :func:`inflated_size` holds at a time.
_SIZE_STEP = 64 * 1024


class RecordsError(ValueError):
    """Bad record data; `error_code` is the Kafka error the broker answers with."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(f"{error_code.name}: {message}")
        self.error_code = error_code


def _snappy_compress(data: bytes) -> bytes:
    out = bytearray(_XERIAL_HEADER)
    view = memoryview(data)
    for i in range(0, len(data), _XERIAL_BLOCK):
        block = cramjam.snappy.compress_raw(view[i : i + _XERIAL_BLOCK])
        out += _I32.pack(len(block))
        out += block
    return bytes(out)


def inflate(data: bytes | memoryview, limit: int, wbits: int = zlib.MAX_WBITS) -> bytes | None:
    """A zlib (or, with ``wbits`` 31, gzip) stream inflated, or None when it holds more than
    ``limit`` bytes; ``zlib.error`` when it is not one.  Output is produced ``limit + 1`` bytes
    at most, whatever the stream claims.  Gzip members may follow one another (as Java's
    GZIPInputStream reads them); a zlib stream is one stream, trailing bytes ignored."""
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(wbits)
        part = d.decompress(rest, limit + 1 - total)
        total += len(part)
        if total > limit:
            return None
        if not d.eof:
            raise zlib.error("incomplete or truncated stream")
        parts.append(part)
        rest = d.unused_data
        if not rest or wbits != _GZIP_WBITS:
            return parts[0] if len(parts) == 1 else b"".join(parts)


def inflated_size(data: bytes | memoryview, limit: int) -> int | None:
    """What a zlib stream inflates to, or None past ``limit``, holding no more than
    ``_SIZE_STEP`` bytes of output at a time: a check that costs no memory, for a caller whose
    limit is large enough that inflating a bomb up to it would itself be the harm."""
    d = zlib.decompressobj()
    total = 0
    pending = bytes(data)
    while pending and total <= limit:
        total += len(d.decompress(pending, _SIZE_STEP))
        pending = d.unconsumed_tail
    if total <= limit and not d.eof:
        total += len(d.flush())
    return None if total > limit else total


def _gzip_decompress(data: bytes, limit: int) -> bytes | None:
    return inflate(data, limit, _GZIP_WBITS)


def _snappy_decompress(data: bytes, limit: int) -> bytes | None:
    if len(data) < 16 or data[:8] != _XERIAL_MAGIC:
        if cramjam.snappy.decompress_raw_len(data) > limit:
            return None
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    view = memoryview(data)
    pos, end = 16, len(data)
    while pos < end:
        if end - pos < 4:
            raise RecordsError(ErrorCode.CORRUPT_MESSAGE, "truncated xerial snappy block length")
        size = _I32.unpack_from(view, pos)[0]
        pos += 4
        if size < 0 or pos + size > end:
            raise RecordsError(ErrorCode.CORRUPT_MESSAGE, "truncated xerial snappy block")
        block = view[pos : pos + size]
        if len(out) + cramjam.snappy.decompress_raw_len(block) > limit:
            return None
        out += cramjam.snappy.decompress_raw(block)
        pos += size
    return bytes(out)


def _bounded(decompress_into):
    """An lz4 or zstd decompression that inflates into a buffer of at most ``limit + 1``
    bytes: the codec refuses to write past the buffer, so a bomb stops there."""

    def run(data: bytes, limit: int) -> bytes | None:
        size = min(limit + 1, max(_FIRST_BUFFER, 4 * len(data)))
        while True:
            out = bytearray(size)
            try:
                n = decompress_into(data, out)
            except cramjam.DecompressionError as e:
                if _OUTPUT_FULL not in str(e):
                    raise
                if size > limit:
                    return None
                size = min(limit + 1, size * 4)
                continue
            return None if n > limit else bytes(memoryview(out)[:n])

    return run


def _lz4_compress(data: bytes) -> bytes:
    # independent blocks and no content checksum: what Kafka's LZ4 frames use (KIP-57)
    c = cramjam.lz4.Compressor(level=9, content_checksum=False, block_linked=False)
    c.compress(data)
    return bytes(c.finish())


_COMPRESS = {
    GZIP: lambda data: gzip.compress(data, compresslevel=6),
    SNAPPY: _snappy_compress,
    LZ4: _lz4_compress,
    ZSTD: lambda data: bytes(cramjam.zstd.compress(data, level=3)),
}

_DECOMPRESS = {
    GZIP: _gzip_decompress,
    SNAPPY: _snappy_decompress,
    LZ4: _bounded(cramjam.lz4.decompress_into),
    ZSTD: _bounded(cramjam.zstd.decompress_into),
}


def _codec(table: dict, codec: int):
    try:
        return table[codec]
    except KeyError:
        raise RecordsError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                           f"unknown compression codec {codec}") from None


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return bytes(data)
    return _codec(_COMPRESS, codec)(data)


def decompress(codec: int, data: bytes, limit: int = DEFAULT_MAX_INFLATED) -> bytes:
    """Decompressed bytes, at most ``limit`` of them.  RecordsError(MESSAGE_TOO_LARGE) past
    the limit (Kafka's answer to a batch above ``max.message.bytes`` once the broker has
    re-encoded it, which is what storing records uncompressed amounts to),
    RecordsError(CORRUPT_MESSAGE) when the data is not valid for the codec,
    RecordsError(UNSUPPORTED_COMPRESSION_TYPE) for an unknown codec."""
    if codec == NONE:
        return bytes(data)
    fn = _codec(_DECOMPRESS, codec)
    try:
        out = fn(data, limit)
    except RecordsError:
        raise
    except (OSError, EOFError, ValueError, zlib.error, cramjam.DecompressionError) as e:
        raise RecordsError(ErrorCode.CORRUPT_MESSAGE, f"cannot decompress codec {codec}: {e}") from None
    if out is None:
        raise RecordsError(ErrorCode.MESSAGE_TOO_LARGE,
                           f"codec {codec} batch inflates past {limit} bytes (max_message_size)")
    return out
