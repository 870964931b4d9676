"""asyncio remoting server: one :class:`Connection` (an ``asyncio.Protocol``) per client.

The transport only moves bytes and enforces limits; the codec parses, handlers decide.  What a
RocketMQ client needs from it (docs/protocol.md §8):

* **Concurrency per connection.**  A push consumer keeps one long-poll PULL per queue on a
  single connection and still expects other requests answered within its time-out, or it
  drops the connection.  Every request therefore runs on its own, answers go out in whatever
  order they finish, matched by the request's opaque.
* **One-way requests** (flag bit 1) are never answered.  The C++ client never sets the bit, so
  its "one-way" requests are answered and it ignores the answers harmlessly.
* **Errors stay local.**  An unknown code, a refused header (:class:`HeaderError`) or a
  handler bug becomes an error response and the connection stays up; only bytes that are not
  a frame (:class:`ProtocolError`) close the connection, and only that one.
* **One gate before every handler.**  ``before_request`` (the broker's ACL, when enabled)
  sees each request first, like RocketMQ's RPC hooks; what it refuses never reaches a handler.

Limits (``BrokerConfig``): ``max_connections`` (connections beyond it are closed at once),
``max_inflight_per_connection`` (above it the connection stops reading; requests already read
wait in a backlog, so the bound is exact), ``max_frame_size``, and write back-pressure: while the
transport is above its high-water mark, handlers wait before writing their answer, and because
they stay in flight meanwhile, a client that does not read ends up not being read either.

TLS (``tls=``, a :class:`~txbroker.remoting.tls.ServerTLS`): a
:class:`~txbroker.remoting.tls_listener.TLSListener` accepts connections, peeks at each
one's first byte without reading it (a TLS ClientHello starts with 0x16) and hands the socket to the loop with or without the current TLS context, so no byte is
lost and plaintext and TLS share one port in ``permissive`` mode; in ``enforcing`` mode a
plaintext connection is closed before any of its bytes is read (logged once per peer per
minute).  A connection silent for :data:`~txbroker.remoting.tls.FIRST_BYTE_TIMEOUT` is closed.

The server can also call the client: :meth:`Connection.request` (matched by opaque) and
:meth:`Connection.send_oneway` carry CHECK_TRANSACTION_STATE and NOTIFY_CONSUMER_IDS_CHANGED.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from txbroker.config import BrokerConfig
from txbroker.remoting.command import ProtocolError, RemotingCommand
from txbroker.remoting.connection import RemotingConnection
from txbroker.remoting.tls import ServerTLS
from txbroker.remoting.tls_listener import TLSListener

log = logging.getLogger("txbroker.remoting.server")

Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
#: Runs before every request's handler; raising a refusal (``code``/``remark``) stops it.
BeforeRequest = Callable[["Connection", RemotingCommand], None]
DisconnectCallback = Callable[["Connection"], Any]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when available, else the default asyncio loop (for ``asyncio.Runner``)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Connection(RemotingConnection):
    """One accepted client connection: the connection core plus the server's admission rules
    (connection limit, in-flight limit, the ``before_request`` gate) and disconnect callbacks.

    ``attributes`` is free for the service layer (client id, groups).  Not thread-safe: used
    from the event loop only.
    """

    #: Server-to-client opaques start high so they never look like a client's own counter
    #: (clients count up from 0; these only need to be unique per connection).
    OPAQUE_FIRST = 1 << 30

    def __init__(self, server: RemotingServer, conn_id: int) -> None:
        super().__init__(server._loop, server.config.max_frame_size, "?", server._handlers,
                         server._default_handler, server._before_request,
                         max_inflight=server.config.max_inflight_per_connection)
        self.server = server
        self.id = conn_id
        self.attributes: dict[str, Any] = {}
        self._accepted = False

    # --- lifecycle ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self.server
        if server._closing or len(server.connections) >= server.config.max_connections:
            self.transport = transport  # type: ignore[assignment]
            self._closed = True
            reason = "shutting down" if server._closing else \
                f"limit of {server.config.max_connections} connections reached"
            log.warning("refusing connection from %s: %s", self.peer, reason)
            transport.abort()
            return
        super().connection_made(transport)
        self._accepted = True
        server.connections.add(self)
        log.debug("connection %d from %s", self.id, self.peer)

    def connection_lost(self, exc: BaseException | None) -> None:
        was_open = not self._closed
        super().connection_lost(exc)
        if not self._accepted:
            return
        self.server.connections.discard(self)
        log.debug("connection %d from %s closed%s", self.id, self.peer,
                  f": {exc}" if exc and was_open else "")
        for callback in list(self.server._disconnect_callbacks):
            try:
                callback(self)
            except Exception:
                log.exception("disconnect callback %r failed for connection %d", callback, self.id)

    # --- requests ------------------------------------------------------------------------
    def _protocol_error(self, exc: ProtocolError) -> None:
        self.server.protocol_errors += 1
        log.warning("closing connection %d from %s: protocol error: %s", self.id, self.peer, exc)

    def __repr__(self) -> str:
        return f"<Connection {self.id} {self.peer}{' closed' if self._closed else ''}>"


class RemotingServer:
    """Listens on one address and hands each request to the handler registered for its code."""

    def __init__(self, config: BrokerConfig, *, default_handler: Handler | None = None,
                 before_request: BeforeRequest | None = None,
                 tls: ServerTLS | None = None, what: str = "broker port") -> None:
        self.config = config
        self.tls = tls
        #: How log lines name this port ("name-server port", "controller port").
        self.what = what
        self._handlers: dict[int, Handler] = {}
        self._default_handler = default_handler
        self._before_request = before_request
        self._disconnect_callbacks: list[DisconnectCallback] = []
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._ids = itertools.count(1)
        self._closing = False
        self.connections: set[Connection] = set()
        self.protocol_errors = 0
        #: With TLS: accepts, peeks at each connection's first byte and hands it over.
        self._listener: TLSListener | None = None
        self.port = 0

    @property
    def tls_refusals(self) -> int:
        """Plaintext connections closed by an enforcing TLS listener."""
        return self._listener.refusals if self._listener is not None else 0

    @property
    def tls_failures(self) -> int:
        """Failed TLS handshakes."""
        return self._listener.failures if self._listener is not None else 0

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[int(code)] = handler

    def on_disconnect(self, fn: DisconnectCallback) -> None:
        self._disconnect_callbacks.append(fn)

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> int:
        """Start listening (on ``sock`` if given, already bound); returns the bound port."""
        self._loop = asyncio.get_running_loop()

        if self.tls is not None:
            return self._start_tls(host, port, sock)

        def factory() -> Connection:
            return Connection(self, next(self._ids))

        if sock is not None:
            self._server = await self._loop.create_server(factory, sock=sock, backlog=1024)
        else:
            self._server = await self._loop.create_server(factory, host, port, backlog=1024,
                                                          reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def _start_tls(self, host: str, port: int, sock: socket.socket | None) -> int:
        assert self.tls is not None
        if sock is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server((host, port), family=family, backlog=1024)

        def factory() -> Connection:
            return Connection(self, next(self._ids))

        self._listener = TLSListener(self.tls, factory, what=self.what,
                                     max_pending=self.config.max_connections)
        self.port = self._listener.start(sock)
        return self.port

    async def close(self, grace: float) -> None:
        """Stop accepting, let in-flight handlers finish within ``grace`` seconds, then close.

        Every connection stops being read at once, so no new request starts, and then shuts
        down (:meth:`RemotingConnection.shutdown`): handlers still running at the deadline are
        cancelled; answers already written are flushed before it closes.
        """
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()
        for conn in self.connections:
            conn.stop_reading()  # at once, not when its shutdown task first runs
        await asyncio.gather(*(conn.shutdown(grace) for conn in list(self.connections)))
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except TimeoutError:
                pass
