"""A listener that accepts TLS, plaintext or both on one port: the accept-and-peek every TLS
port shares (RocketMQ remoting, name servers, the controller, HA, metrics).

Each accepted connection is left unread until it is readable; its first byte is then peeked
with ``MSG_PEEK`` (nothing leaves the socket) and the socket is handed to the event loop with
the current TLS context (the byte was 0x16, a ClientHello: :func:`~txbroker.remoting.tls.starts_tls`)
or without one.  In ``enforcing`` mode a plaintext connection is closed before any of its bytes
is read.  So one rule serves every protocol whose first byte is never 0x16: a RocketMQ frame
(its length's top byte), an HA stream (a slave's first message: see docs/security.md "TLS"),
an HTTP request line (a method's first letter).

The listener only decides and hands over; what runs on a connection is the protocol its
``factory`` makes, so the remoting server passes its ``Connection`` and a stream server
(:func:`start_stream_server`) an ``asyncio.StreamReaderProtocol``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from txbroker.remoting.tls import (
    FIRST_BYTE_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    RefusalLog,
    ServerTLS,
    starts_tls,
)

log = logging.getLogger("txbroker.remoting.tls")

#: Connections waiting for their first byte beyond which new ones are closed at once, unless
#: the caller gives its own bound (the remoting server passes ``max_connections``).
DEFAULT_MAX_PENDING = 1024

StreamCallback = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None] | None]


class TLSListener:
    """Accepts on a bound socket and hands each connection to ``factory()``'s protocol, with
    or without TLS as its first byte and ``tls.mode`` say.  ``what`` names the port in log
    lines ("HA port").  Event-loop only."""

    def __init__(self, tls: ServerTLS, factory: Callable[[], asyncio.BaseProtocol], *,
                 what: str = "port", max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.tls = tls
        self.factory = factory
        self.what = what
        self.max_pending = max_pending
        #: Plaintext connections closed in enforcing mode, and failed TLS handshakes.
        self.refusals = 0
        self.failures = 0
        self._refusal_log = RefusalLog()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task | None = None
        self._admitting: set[asyncio.Task] = set()
        self._closing = False
        self.port = 0

    @property
    def sockets(self) -> list[socket.socket]:
        """The listening socket, as ``asyncio.Server.sockets`` has it."""
        return [self._sock] if self._sock is not None else []

    def start(self, sock: socket.socket) -> int:
        """Start accepting on ``sock`` (bound and listening); returns its port."""
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._accept_task = self._loop.create_task(self._accept_loop(sock),
                                                   name=f"txbroker-accept-{self.port}")
        return self.port

    def close(self) -> None:
        """Stop accepting and drop connections not yet handed over (those handed over are
        their protocol's to close)."""
        if self._closing:
            return
        self._closing = True
        sock = self._sock
        if self._accept_task is not None and sock is not None:
            # Closed once the accept loop has let go of it, whether or not anyone waits.
            self._accept_task.add_done_callback(lambda _: sock.close())
            self._accept_task.cancel()
        for task in list(self._admitting):
            task.cancel()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accept_task, *self._admitting) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self, lsock: socket.socket) -> None:
        assert self._loop is not None
        while not self._closing:
            try:
                conn, addr = await self._loop.sock_accept(lsock)
            except OSError as exc:
                if self._closing:
                    return
                log.warning("accept on %s %d failed: %s", self.what, self.port, exc)
                await asyncio.sleep(0.1)  # e.g. out of file descriptors: do not spin
                continue
            task = self._loop.create_task(self._admit(conn, addr))
            self._admitting.add(task)
            task.add_done_callback(self._admitting.discard)

    async def _admit(self, conn: socket.socket, addr: Any) -> None:
        """Peek at the first byte, then hand ``conn`` over with TLS, without, or close it."""
        assert self._loop is not None
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        handed = False
        try:
            if len(self._admitting) > self.max_pending:
                log.warning("refusing connection from %s: %d connections waiting for their "
                            "first byte", peer, len(self._admitting))
                return
            try:
                first = await asyncio.wait_for(self._peek(conn), FIRST_BYTE_TIMEOUT)
            except (TimeoutError, OSError):
                return  # silent or reset before deciding: nothing to serve
            if not first:
                return
            if starts_tls(first):
                ctx: ssl.SSLContext | None = self.tls.context()
            elif self.tls.enforcing:
                self.refusals += 1
                if self._refusal_log.should_log(peer.rpartition(":")[0], self._loop.time()):
                    log.warning("closing plaintext connection from %s: %s %d requires TLS "
                                "(tls_mode=enforcing)", peer, self.what, self.port)
                return
            else:
                ctx = None
            try:
                if ctx is None:
                    await self._loop.connect_accepted_socket(self.factory, conn)
                else:
                    await self._loop.connect_accepted_socket(
                        self.factory, conn, ssl=ctx, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
                handed = True
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                self.failures += 1
                if self._refusal_log.should_log(peer.rpartition(":")[0], self._loop.time()):
                    log.warning("TLS handshake with %s on %s %d failed: %s", peer, self.what,
                                self.port, str(exc) or type(exc).__name__)
        finally:
            if not handed:
                conn.close()

    async def _peek(self, conn: socket.socket) -> bytes:
        """The connection's first byte, left in the socket for whoever reads it next."""
        assert self._loop is not None
        readable = self._loop.create_future()
        fd = conn.fileno()
        self._loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await readable
        finally:
            self._loop.remove_reader(fd)
        return conn.recv(1, socket.MSG_PEEK)


async def start_stream_server(callback: StreamCallback, *, sock: socket.socket,
                              tls: ServerTLS | None, what: str) -> asyncio.AbstractServer | TLSListener:
    """``asyncio.start_server(callback, sock=sock)``, through a :class:`TLSListener` when
    ``tls`` is set.  Either result has ``sockets``, ``close()`` and ``wait_closed()``."""
    if tls is None:
        return await asyncio.start_server(callback, sock=sock)
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.StreamReaderProtocol:
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), callback, loop=loop)

    listener = TLSListener(tls, factory, what=what)
    listener.start(sock)
    return listener
