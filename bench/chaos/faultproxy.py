"""An asyncio TCP proxy that delays and cuts connections at random (127.0.0.1 only).

Modelled on asyncpg's ``TCPFuzzingProxy``: the proxy sits between clients and the broker and
forwards bytes both ways, but before forwarding a chunk it may sleep (delay) or close both
sides (cut).  A cut on the broker->client direction loses an answer whose request the broker
already handled ("half stored but answer lost", "check-back lost"); a cut on the
client->broker direction loses a request such as a one-way END_TRANSACTION.  Bytes are never
altered or silently dropped inside a live stream: a TCP peer can only lose a connection, not
a slice of it, so that is the fault worth simulating.

**Silent mode** (``silence_after``): a client->server chunk it picks is forwarded, and then
that connection is black-holed without being closed: whatever either side sends afterwards
is read and dropped, no FIN, no RST, until the proxy closes.  The request was handled, its
answer never arrives, and the client learns nothing but a time-out: the lost reply of a
silent network partition that began just after the request went out.

**Hold** (:meth:`FaultProxy.hold` / :meth:`FaultProxy.release`): nothing is forwarded either way
and a new connection is accepted but not carried on to the target until the release; bytes wait
(at most one chunk per direction in the proxy, the rest in the sockets' buffers, which then push
back) and flow again at the release.  That is a partition TCP survives: silent while it lasts,
connections stalled rather than closed, everything sent meanwhile delivered after the heal.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class FaultStats:
    connections: int = 0
    chunks: int = 0
    delays: int = 0
    cuts_to_server: int = 0
    cuts_to_client: int = 0
    silenced: int = 0


@dataclass
class FaultProxy:
    """Forward ``listen_port`` on 127.0.0.1 to ``target``; faults are drawn from ``seed``."""

    target_host: str
    target_port: int
    listen_port: int = 0
    seed: int = 0
    cut_probability: float = 0.0
    delay_probability: float = 0.0
    max_delay: float = 0.05
    #: Scripted faults: ``cut_when(to_server, chunk)`` returning True cuts that connection
    #: before the chunk is forwarded (e.g. exactly the answer to a SEND).
    cut_when: Callable[[bool, bytes], bool] | None = None
    #: Silent mode: ``silence_after(chunk)`` returning True for a client->server chunk forwards
    #: it and then black-holes that connection (both ways, nothing closed).
    silence_after: Callable[[bytes], bool] | None = None
    stats: FaultStats = field(default_factory=FaultStats)

    def __post_init__(self) -> None:
        for name in ("cut_probability", "delay_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        self._rng = random.Random(self.seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.enabled = True
        #: Set while traffic flows; cleared by :meth:`hold`.
        self._flowing = asyncio.Event()
        self._flowing.set()

    def hold(self) -> None:
        """Forward nothing, either way, until :meth:`release` (call on the proxy's loop)."""
        self._flowing.clear()

    def release(self) -> None:
        """Forward again what waited and what comes."""
        self._flowing.set()

    @property
    def held(self) -> bool:
        return not self._flowing.is_set()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self._flowing.set()
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        await self._flowing.wait()
        if self._server is None or not self._server.is_serving():
            c_writer.close()  # closed while this connection waited for a release
            return
        try:
            s_reader, s_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            c_writer.close()
            return
        self._writers.update((c_writer, s_writer))
        silent = asyncio.Event()
        up = asyncio.ensure_future(self._pump(c_reader, s_writer, (c_writer, s_writer), True, silent))
        down = asyncio.ensure_future(self._pump(s_reader, c_writer, (c_writer, s_writer), False, silent))
        for t in (up, down):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        await asyncio.gather(up, down, return_exceptions=True)
        self._writers.difference_update((c_writer, s_writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    both: tuple[asyncio.StreamWriter, ...], to_server: bool,
                    silent: asyncio.Event) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if silent.is_set():
                    continue  # black-holed: read and dropped, the connection stays open
                await self._flowing.wait()
                self.stats.chunks += 1
                if self.enabled and self._rng.random() < self.delay_probability:
                    self.stats.delays += 1
                    await asyncio.sleep(self._rng.uniform(0, self.max_delay))
                if self.enabled and (self._rng.random() < self.cut_probability
                                     or (self.cut_when is not None and self.cut_when(to_server, data))):
                    if to_server:
                        self.stats.cuts_to_server += 1
                    else:
                        self.stats.cuts_to_client += 1
                    break
                writer.write(data)
                await writer.drain()
                if self.enabled and to_server and self.silence_after is not None \
                        and self.silence_after(data):
                    self.stats.silenced += 1
                    silent.set()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in both:
                w.close()
