"""RecordBatch compression codecs by Kafka's codec id (docs/kafka.md, "Wire codec"): 0 none,
1 gzip, 2 snappy, 3 lz4 (frame format), 4 zstd.

Snappy comes in two framings: Java and the Python clients write xerial's block stream (a
16-byte header, then `[int32 length][raw snappy block]` chunks), librdkafka writes one raw
snappy block.  Decompression accepts both; compression writes the xerial form, as Kafka's own
Java client does."""

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


def _snappy_decompress(data: bytes) -> bytes:
    if len(data) < 16 or data[:8] != _XERIAL_MAGIC:
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
        out += cramjam.snappy.decompress_raw(view[pos : pos + size])
        pos += size
    return bytes(out)


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
    GZIP: gzip.decompress,
    SNAPPY: _snappy_decompress,
    LZ4: lambda data: bytes(cramjam.lz4.decompress(data)),
    ZSTD: lambda data: bytes(cramjam.zstd.decompress(data)),
}


def _codec(table: dict, codec: int):
    if codec == NONE:
        return bytes
    try:
        return table[codec]
    except KeyError:
        raise RecordsError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                           f"unknown compression codec {codec}") from None


def compress(codec: int, data: bytes) -> bytes:
    return _codec(_COMPRESS, codec)(data)


def decompress(codec: int, data: bytes) -> bytes:
    """Decompressed bytes; RecordsError(CORRUPT_MESSAGE) when the data is not valid for the
    codec, RecordsError(UNSUPPORTED_COMPRESSION_TYPE) for an unknown codec."""
    fn = _codec(_DECOMPRESS, codec)
    try:
        return fn(data)
    except RecordsError:
        raise
    except (OSError, EOFError, ValueError, zlib.error, cramjam.DecompressionError) as e:
        raise RecordsError(ErrorCode.CORRUPT_MESSAGE, f"cannot decompress codec {codec}: {e}") from None
