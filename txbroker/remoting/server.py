"""asyncio remoting server: one :class:`Connection` (an ``asyncio.Protocol``) per client.

The transport only moves bytes and enforces limits; the codec parses, handlers decide.  What a
RocketMQ client needs from it (docs/protocol.md §8):

* **Concurrency per connection.**  A push consumer keeps one long-poll PULL per queue on a
  single connection and still expects other requests answered within its time-out, or it
  drops the connection.  Every request therefore runs on its own, answers go out in whatever
  order they finish, matched by the request's opaque.
* **One-way requests** (flag bit 1) are never answered.  The C++ client never sets the bit, so
  its "one-way" requests are answered and it ignores the answers harmlessly.
* **Errors stay local.**  An unknown code, a refusal (:class:`Refusal`, e.g. a bad header) or a
  handler bug becomes an error response and the connection stays up; only bytes that are not
  a frame (:class:`ProtocolError`) close the connection, and only that one.
* **One gate before every handler.**  ``before_request`` (the broker's ACL, when enabled)
  sees each request first, like RocketMQ's RPC hooks; what it refuses never reaches a handler.

Limits (``BrokerConfig``): ``max_connections`` (connections beyond it are closed at once),
``max_inflight_per_connection`` (above it the connection stops reading; requests already read
wait in a backlog, so the bound is exact), ``max_frame_size``, and write back-pressure: while the
transport is above its high-water mark, handlers wait before writing their answer, and because
they stay in flight meanwhile, a client that does not read ends up not being read either.

The server can also call the client: :meth:`Connection.request` (matched by opaque) and
:meth:`Connection.send_oneway` carry CHECK_TRANSACTION_STATE and NOTIFY_CONSUMER_IDS_CHANGED.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from types import CoroutineType
from typing import Any

from txbroker.config import BrokerConfig
from txbroker.remoting._flow import continue_coroutine
from txbroker.remoting.codec import (
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    encode,
)
from txbroker.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from txbroker.remoting.errors import Refusal

log = logging.getLogger("txbroker.remoting.server")

Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
#: Runs before every request's handler; raising a :class:`Refusal` stops it.
BeforeRequest = Callable[["Connection", RemotingCommand], None]
DisconnectCallback = Callable[["Connection"], Any]

#: Server-to-client opaques start high so they never look like a client's own counter
#: (clients count up from 0; these only need to be unique per connection).
_SERVER_OPAQUE_START = 1 << 30
#: Answers are collected ("corked") and written once per read or loop turn, up to this many
#: bytes; more is written at once so that write back-pressure can take effect.
CORK_LIMIT = 64 * 1024


def install_uvloop() -> bool:
    """Make uvloop the event loop policy when it is installed; returns whether it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when available, else the default asyncio loop (for ``asyncio.Runner``)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Connection(asyncio.Protocol):
    """One client connection: decodes frames, runs handlers, writes answers.

    ``attributes`` is free for the service layer (client id, groups).  Not thread-safe: used
    from the event loop only.
    """

    def __init__(self, server: RemotingServer, conn_id: int) -> None:
        self.server = server
        self.id = conn_id
        self.peer = "?"
        self.attributes: dict[str, Any] = {}
        self.transport: asyncio.Transport | None = None
        self._loop = server._loop
        self._decoder = FrameDecoder(server.config.max_frame_size)
        self._closed = False
        self._accepted = False
        self._inflight = 0
        self._max_inflight = server.config.max_inflight_per_connection
        self._backlog: collections.deque[RemotingCommand] = collections.deque()
        self._reading_paused = False
        self._tasks: set[asyncio.Task] = set()
        # writes: frames corked until the end of the current callback / loop turn
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._in_feed = False
        self._write_paused = False
        self._writable: asyncio.Future | None = None
        # server-to-client requests
        self._opaques = itertools.count(_SERVER_OPAQUE_START)
        self._pending: dict[int, asyncio.Future] = {}
        #: Counters: requests started, handlers that raised (not a Refusal).
        self.requests = 0
        self.handler_errors = 0

    # --- lifecycle ---------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def writable(self) -> bool:
        """False while the peer is not reading what was sent (the transport is above its
        high-water mark) or the connection is closed."""
        return not self._write_paused and not self._closed

    @property
    def inflight(self) -> int:
        """Requests being handled or waiting in the backlog."""
        return self._inflight + len(self._backlog)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self.server
        if server._closing or len(server.connections) >= server.config.max_connections:
            self._closed = True
            reason = "shutting down" if server._closing else \
                f"limit of {server.config.max_connections} connections reached"
            log.warning("refusing connection from %s: %s", self.peer, reason)
            transport.abort()
            return
        self._accepted = True
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        server.connections.add(self)
        log.debug("connection %d from %s", self.id, self.peer)

    def connection_lost(self, exc: BaseException | None) -> None:
        was_open = not self._closed
        self._closed = True
        self._out.clear()
        self._backlog.clear()
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionError(f"connection to {self.peer} lost"))
            self._writable.exception()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"connection to {self.peer} closed before "
                                                  f"the answer arrived"))
        self._pending.clear()
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
        # Handlers still running find the connection closed when they answer; their
        # answers are dropped.

    def close(self) -> None:
        """Close after writing what is buffered."""
        if self.transport is not None and not self.transport.is_closing():
            self._flush()
            self.transport.close()
        self._closed = True

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._closed = True

    # --- reading -----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            commands = self._decoder.feed(data)
        except ProtocolError as exc:
            self.server.protocol_errors += 1
            log.warning("closing connection %d from %s: protocol error: %s", self.id, self.peer, exc)
            self.abort()
            return
        self._in_feed = True
        try:
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    self._on_response(cmd)
                elif self._inflight >= self._max_inflight or self._backlog or self._write_paused:
                    self._backlog.append(cmd)
                else:
                    self._dispatch(cmd)
            if self._backlog and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
        finally:
            self._in_feed = False
            if self._out:
                self._flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def _on_response(self, cmd: RemotingCommand) -> None:
        fut = self._pending.pop(cmd.opaque, None)
        if fut is None:
            log.debug("connection %d: dropping response with unknown opaque %d", self.id, cmd.opaque)
        elif not fut.done():
            fut.set_result(cmd)

    def _dispatch(self, cmd: RemotingCommand) -> None:
        self._inflight += 1
        self.requests += 1
        server = self.server
        if server._before_request is not None:
            # Access control runs before any handler, unknown codes included (RocketMQ's
            # RPC hook); its Refusal is answered like a handler's (one-way: not at all).
            try:
                server._before_request(self, cmd)
            except Exception as exc:  # noqa: BLE001 - becomes the error answer
                self._finish(cmd, None, exc)
                return
        handler = server._handlers.get(cmd.code) or server._default_handler
        if handler is None:
            self._finish(cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                           f" request type {cmd.code} not supported"), None)
            return
        try:
            coro = handler(self, cmd)
            if coro.__class__ is not CoroutineType:
                if isinstance(coro, Awaitable):
                    coro = _await(coro)
                else:  # a plain function's result
                    self._finish(cmd, coro, None)
                    return
            # First step inline (see _flow.run_fast): most handlers finish without waiting.
            yielded = coro.send(None)
        except StopIteration as stop:
            self._finish(cmd, stop.value, None)
            return
        except BaseException as exc:  # noqa: BLE001 - becomes the error answer
            self._finish(cmd, None, exc)
            return
        task = self._loop.create_task(
            continue_coroutine(coro, yielded, lambda value, exc: self._finish(cmd, value, exc)))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # already reported through _finish; mark retrieved

    def _finish(self, cmd: RemotingCommand, result: Any, exc: BaseException | None) -> None:
        """A handler ended: answer (unless one-way), then admit backlog."""
        self._inflight -= 1
        response: RemotingCommand | None
        if exc is None:
            response = result if isinstance(result, RemotingCommand) else None
            if result is not None and response is None:
                log.error("handler for code %d returned %r, not a RemotingCommand", cmd.code, result)
                response = cmd.response(ResponseCode.SYSTEM_ERROR, "handler returned no command")
        elif isinstance(exc, Refusal):
            log.debug("request %d on connection %d refused: %s", cmd.code, self.id, exc.remark)
            response = exc.answer(cmd)
        elif isinstance(exc, asyncio.CancelledError):
            response = None  # shutting down: the connection is about to close
        elif isinstance(exc, Exception):
            self.handler_errors += 1
            log.error("handler for code %d on connection %d failed", cmd.code, self.id,
                      exc_info=exc)
            response = cmd.response(ResponseCode.SYSTEM_ERROR,
                                    f"{type(exc).__name__}: {exc}"[:512])
        else:
            raise exc  # KeyboardInterrupt / SystemExit
        if response is not None and not cmd.flag & FLAG_ONEWAY and not self._closed:
            response.opaque = cmd.opaque
            response.flag |= FLAG_RESPONSE
            response.serialize_type = cmd.serialize_type
            try:
                frame = encode(response)
            except Exception:
                log.exception("encoding the response to code %d failed", cmd.code)
                frame = encode(cmd.response(ResponseCode.SYSTEM_ERROR, "response not encodable"))
            self._write(frame)
        if self._backlog:
            self._admit()

    def _admit(self) -> None:
        while self._backlog and self._inflight < self._max_inflight and not self._closed \
                and not self._write_paused:
            self._dispatch(self._backlog.popleft())
        if not self._backlog and not self._write_paused and self._reading_paused \
                and not self._closed and not self.server._closing:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    # --- writing -----------------------------------------------------------------------
    def _write(self, frame: bytes) -> None:
        """Queue a frame; frames written in one loop turn leave in one system call.

        Large output is written at once instead: the transport then sees it and can signal
        back-pressure (pause_writing) before the next request of the same read is started.
        """
        self._out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes >= CORK_LIMIT:
            self._flush()
        elif not self._in_feed and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._out_bytes = 0
        out = self._out
        if not out or self.transport is None or self.transport.is_closing():
            out.clear()
            return
        if len(out) == 1:
            self.transport.write(out[0])
        else:
            self.transport.write(b"".join(out))
        out.clear()

    def pause_writing(self) -> None:
        # The peer is not reading our answers: stop reading its requests too.  Handlers
        # already running finish and queue their answers (bounded by the in-flight limit).
        self._write_paused = True
        if not self._reading_paused and not self._closed:
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None
        if not self._closed:
            if self._out and not self._flush_scheduled and not self._in_feed:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
            self._admit()

    async def wait_writable(self) -> None:
        """Wait while the peer is not reading (the transport is above its high-water mark).

        The connection itself stops starting new requests while paused; a handler about to
        produce a large answer (a pull) can also wait here first.
        """
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        if not self._write_paused:
            return
        if self._writable is None:
            self._writable = self._loop.create_future()
        await asyncio.shield(self._writable)

    # --- server-to-client ----------------------------------------------------------------
    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque > 0x7FFFFFFF:
            self._opaques = itertools.count(_SERVER_OPAQUE_START)
            opaque = next(self._opaques)
        return opaque

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request to the client and wait for its answer (matched by opaque)."""
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        cmd.opaque = self._next_opaque()
        cmd.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        fut = self._loop.create_future()
        self._pending[cmd.opaque] = fut
        try:
            await self.wait_writable()
            self._write(encode(cmd))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(cmd.opaque, None)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send a one-way request (flag bit 1) to the client; nothing comes back.

        Raises ConnectionError when the connection is gone.  Never waits: a caller that may
        send many (the check service) looks at :attr:`writable` first.
        """
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        self._write(encode(cmd))

    def __repr__(self) -> str:
        return f"<Connection {self.id} {self.peer}{' closed' if self._closed else ''}>"


async def _await(fut: Awaitable[Any]) -> Any:
    return await fut


class RemotingServer:
    """Listens on one address and hands each request to the handler registered for its code."""

    def __init__(self, config: BrokerConfig, *, default_handler: Handler | None = None,
                 before_request: BeforeRequest | None = None) -> None:
        self.config = config
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
        self.port = 0

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[int(code)] = handler

    def on_disconnect(self, fn: DisconnectCallback) -> None:
        self._disconnect_callbacks.append(fn)

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> int:
        """Start listening (on ``sock`` if given, already bound); returns the bound port."""
        self._loop = asyncio.get_running_loop()

        def factory() -> Connection:
            return Connection(self, next(self._ids))

        if sock is not None:
            self._server = await self._loop.create_server(factory, sock=sock, backlog=1024)
        else:
            self._server = await self._loop.create_server(factory, host, port, backlog=1024,
                                                          reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self, grace: float) -> None:
        """Stop accepting, let in-flight handlers finish within ``grace`` seconds, then close.

        Connections stop being read at once, so no new request starts; handlers still
        running at the deadline are cancelled.  Answers already written are flushed before
        each connection closes.
        """
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        conns = list(self.connections)
        for conn in conns:
            conn._backlog.clear()
            if conn.transport is not None and not conn._reading_paused and not conn.closed:
                conn._reading_paused = True
                conn.transport.pause_reading()
        tasks = [t for conn in conns for t in conn._tasks]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(grace, 0.0))
            if pending:
                log.warning("%d request(s) still running after %.1f s of grace; cancelling",
                            len(pending), grace)
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=1.0)
        for conn in conns:
            conn.close()
        lost = [c for c in conns if c.transport is not None]
        deadline = self._loop.time() + 1.0
        while any(c in self.connections for c in lost) and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except TimeoutError:
                pass
