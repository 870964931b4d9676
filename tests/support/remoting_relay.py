"""A TCP relay of RocketMQ remoting frames whose every frame a test may see, keep, drop or
answer itself: the on-path attacker of the cluster-link tests.

``FrameRelay(target, tap)`` listens on 127.0.0.1 port 0 (``await relay.start()`` returns
its address) and connects each client to ``target``.  For every whole frame,
``tap(cmd, frame, to_target, pair)`` returns True to forward it as it came; otherwise the
frame is gone unless the tap wrote something itself with ``pair.to_client(cmd)`` or
``pair.to_target(cmd)`` (a recorded answer with a new opaque, say).  Without a tap
everything is forwarded.  ``close()`` ends every connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from txbroker.remoting.codec import decode_frame, encode, frame_length
from txbroker.remoting.command import RemotingCommand


class Pair:
    """One client connection and its connection to the target."""

    def __init__(self, client: asyncio.StreamWriter, target: asyncio.StreamWriter) -> None:
        self._client = client
        self._target = target

    def to_client(self, cmd: RemotingCommand) -> None:
        self._client.write(encode(cmd))

    def to_target(self, cmd: RemotingCommand) -> None:
        self._target.write(encode(cmd))


Tap = Callable[[RemotingCommand, bytes, bool, Pair], bool]


class FrameRelay:
    def __init__(self, target: str, tap: Tap | None = None) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.tap = tap
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        pair = Pair(writer, up_writer)
        for task in (self._pump(reader, up_writer, True, pair),
                     self._pump(up_reader, writer, False, pair)):
            t = asyncio.create_task(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    to_target: bool, pair: Pair) -> None:
        buf = bytearray()
        try:
            while data := await reader.read(65536):
                buf += data
                while (n := frame_length(buf)) is not None:
                    frame = bytes(buf[:n])
                    del buf[:n]
                    if self.tap is None or self.tap(decode_frame(frame), frame, to_target, pair):
                        writer.write(frame)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
