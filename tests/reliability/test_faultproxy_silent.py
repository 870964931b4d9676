"""The fault proxy's silent mode: the request is forwarded and handled, its answer never
arrives, and the connection is neither closed nor reset (a lost reply)."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.bench.chaos.faultproxy import FaultProxy


async def test_silent_mode_forwards_the_request_then_black_holes_the_connection():
    received: list[bytes] = []

    async def handle(r, w):
        while data := await r.read(1024):
            received.append(data)
            w.write(b"answer:" + data)
            await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = await FaultProxy("127.0.0.1", port, silence_after=lambda chunk: chunk == b"second").start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
        w.write(b"first")
        assert await asyncio.wait_for(r.readexactly(12), 10) == b"answer:first"
        w.write(b"second")
        await w.drain()
        with pytest.raises(TimeoutError):  # silence: neither an answer nor an EOF
            await asyncio.wait_for(r.read(100), 1.0)
        assert received[-1] == b"second"  # the request was forwarded and handled
        w.write(b"third")  # later bytes vanish too, without an error on the client's side
        await w.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(100), 0.5)
        assert b"third" not in b"".join(received)
        assert not r.at_eof() and not w.is_closing()
        assert proxy.stats.silenced == 1
        w.close()
    finally:
        await proxy.close()
        server.close()
