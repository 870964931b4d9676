"""A deliberately independent frame reader for the compat vectors (not txbroker's codec).

It parses both serialize types from the protocol notes (section 1): JSON headers and the
ROCKETMQ binary header, so a test can check *how* the broker encoded its answer.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass


@dataclass
class Frame:
    serialize_type: int
    header: dict
    body: bytes

    @property
    def ext(self) -> dict:
        return self.header.get("extFields") or {}


def parse_binary_header(h: bytes) -> dict:
    code, lang, version, opaque, flag = struct.unpack_from(">hbhii", h, 0)
    pos = 13
    (rlen,) = struct.unpack_from(">i", h, pos)
    pos += 4
    remark = h[pos:pos + rlen].decode() if rlen > 0 else None
    pos += max(rlen, 0)
    (mlen,) = struct.unpack_from(">i", h, pos)
    pos += 4
    end = pos + mlen
    ext: dict[str, str] = {}
    while pos < end:
        (klen,) = struct.unpack_from(">h", h, pos)
        key = h[pos + 2:pos + 2 + klen].decode()
        pos += 2 + klen
        (vlen,) = struct.unpack_from(">i", h, pos)
        ext[key] = h[pos + 4:pos + 4 + vlen].decode()
        pos += 4 + vlen
    assert pos == end == len(h), "binary header has trailing or missing bytes"
    return {"code": code, "language": lang, "version": version, "opaque": opaque, "flag": flag,
            "remark": remark, "extFields": ext}


async def read_frame(reader: asyncio.StreamReader, timeout: float) -> Frame:
    prefix = await asyncio.wait_for(reader.readexactly(8), timeout)
    total, second = struct.unpack(">ii", prefix)
    stype, hlen = (second >> 24) & 0xFF, second & 0xFFFFFF
    rest = await asyncio.wait_for(reader.readexactly(total - 4), timeout)
    h, body = rest[:hlen], rest[hlen:]
    header = json.loads(h) if stype == 0 else parse_binary_header(h)
    return Frame(stype, header, body)


class Wire:
    """One TCP connection: write raw frames, read frames by opaque."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        #: requests the broker initiated (e.g. NOTIFY_CONSUMER_IDS_CHANGED after a heartbeat)
        self.server_requests: list[Frame] = []

    @classmethod
    async def open(cls, addr: str) -> Wire:
        host, port = addr.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    async def read(self, timeout: float = 5.0) -> Frame:
        """The next response; server-initiated requests are set aside in ``server_requests``."""
        while True:
            frame = await read_frame(self.reader, timeout)
            if frame.header.get("flag", 0) & 1:
                return frame
            self.server_requests.append(frame)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
