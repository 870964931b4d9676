"""The connection core shared by every listener and by the remoting client: ``asyncio.Protocol`` bases.

Both protocols the broker serves, RocketMQ remoting and Kafka, need the same things from a
connection, and as asyncpg's ``BaseProtocol`` and RocketMQ's ``NettyRemotingAbstract`` do,
:class:`ConnectionCore` holds them once:

* **Framing hook.**  ``data_received`` feeds the protocol's framing object (its ``feed``
  returns whole frames, or raises :class:`ProtocolError` for bytes that are no frame: this
  connection only closes) and hands the frames of one read to the protocol's ``_received``.
* **Dispatch.**  A handler's first step runs inline and only a handler that waits gets a
  task (see :mod:`txbroker.remoting._flow`); the tasks are kept, so a shutdown can wait for them.
* **Writes.**  Frames are corked and leave with one ``transport.writelines`` per flush (at the
  end of a read, once per loop turn, or at :data:`CORK_LIMIT`).  Frames are lists of buffers
  (:func:`encode_parts`), so a pulled batch reaches the socket without being joined.  Over
  TLS a flush is joined and written as one buffer instead: the TLS transport encrypts every
  buffer it is given as a record of its own, which the peer then decrypts one by one, so
  small frames written apart cost both ends a record each (measured in docs/bench.md, "TLS").
* **Back-pressure.**  ``pause_writing``/``resume_writing`` drive :meth:`wait_writable`; an
  end with admission limits (a listener) also starts no request and stops reading meanwhile.
  Requests read beyond a protocol's limits wait in a backlog while reading pauses.
* **Handlers finish.**  A lost connection never cancels a running handler: it runs to its
  end and its answer is dropped, so whatever it changed is changed once and completely.
* **Orderly shutdown.**  :meth:`~ConnectionCore.shutdown` stops reading for good, waits for
  the running handlers (their tasks, not a polling loop) up to a grace period, cancels the
  rest, closes after writing what is buffered and waits for the transport to report the
  connection gone, aborting it at a deadline.

Each protocol adds its framing, its admission rule and how a handler's outcome becomes an
answer: :class:`RemotingConnection` here (requests run concurrently, answers in any order
matched by opaque, either end may send requests), the Kafka listener's connection in
:mod:`txbroker.service.kafka.listener` (one request at a time, answered in arrival order).

The remoting per-request path (``_received`` → :meth:`RemotingConnection._dispatch` →
:meth:`RemotingConnection._finish`, and :meth:`RemotingConnection.request`) is the hottest code
of the broker and of the SDK: in-flight accounting and the signing step are written inline
there, as settings of the end, rather than as methods each end overrides, since every extra
call per request showed up as CPU per round trip (``python -m txbroker.bench.remoting --cpu``).
That is also why this is one file of more than 450 lines: the read, dispatch, finish and write
steps are methods of two classes calling each other directly; time-outs, the one part off that
path, live in :mod:`.timeouts`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import CoroutineType
from typing import Any, Protocol

from txbroker.remoting._flow import continue_coroutine
from txbroker.remoting.codec import FrameDecoder, encode_parts
from txbroker.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from txbroker.remoting.command import ProtocolError, RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.timeouts import RequestTimeouts

log = logging.getLogger("txbroker.remoting.connection")

#: A request handler: its answer, an awaitable of it, or None for no answer.
Handler = Callable[[Any, RemotingCommand], Any]
#: Runs before every request's handler; raising a refusal (``code``/``remark``) stops it.
#: An awaitable it returns runs in the handler's place (a refusal answered after a back-off,
#: without holding up the loop or other connections).
BeforeRequest = Callable[[Any, RemotingCommand], Awaitable[Any] | None]
#: The last change to an outgoing request before it is encoded (the client signs there).
Prepare = Callable[[RemotingCommand], None]


class Framing(Protocol):
    """A protocol's frame decoder, as the core uses it (sans-IO: bytes in, frames out)."""

    def feed(self, data: bytes) -> list[Any]:
        """The whole frames completed by ``data`` (none while one is incomplete); raises
        :class:`ProtocolError` when the bytes cannot be frames of this protocol."""
        ...

#: Frames are collected ("corked") and written once per read or loop turn, up to this many
#: bytes; more is written at once so that write back-pressure can take effect.
CORK_LIMIT = 64 * 1024
#: How long :meth:`ConnectionCore.shutdown` waits for cancelled handlers and for the
#: transport to report a closed connection before it aborts.
CLOSE_DEADLINE = 1.0


async def finish_tasks(tasks: Iterable[asyncio.Task], grace: float) -> None:
    """Let ``tasks`` end within ``grace`` seconds; cancel those still running then."""
    tasks = list(tasks)
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(grace, 0.0))
    if pending:
        log.warning("%d request(s) still running after %.1f s of grace; cancelling",
                    len(pending), grace)
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=CLOSE_DEADLINE)


class ConnectionCore(asyncio.Protocol):
    """One connection of either protocol, either end.  Not thread-safe: event loop only.

    A protocol subclass sets ``_decoder`` (its framing object) and implements ``_received``
    (the frames of one read), ``_admit`` (start backlogged requests, resume reading when its
    limits allow) and ``_protocol_error``.  With ``limited`` the end starts no request and
    stops reading while the peer does not read (the listeners' rule); the client is not.
    """

    # Slots: the per-request path reads and writes these many times per request, and an
    # end's subclass adds attributes of its own; past about 30 attributes an instance dict
    # no longer shares its keys and every access costs more.  Subclasses keep a __dict__.
    __slots__ = (
        "_backlog",
        "_closed",
        "_decoder",
        "_flush_scheduled",
        "_gone",
        "_in_feed",
        "_inflight",
        "_join_writes",
        "_limited",
        "_loop",
        "_out",
        "_out_bytes",
        "_reading_paused",
        "_stopping",
        "_tasks",
        "_writable",
        "_write_paused",
        "handler_errors",
        "peer",
        "requests",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, decoder: Framing, peer: str, *,
                 limited: bool) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self._loop = loop
        self._decoder = decoder
        self._closed = False
        #: Done when the transport reported the connection lost.
        self._gone: asyncio.Future[None] = loop.create_future()
        self._tasks: set[asyncio.Task] = set()
        self._reading_paused = False
        #: Set by :meth:`stop_reading`: reading never resumes.
        self._stopping = False
        # admission: requests running, and those read but waiting for their turn
        self._limited = limited
        self._inflight = 0
        self._backlog: collections.deque[Any] = collections.deque()
        # writes: buffers corked until the end of the current callback / loop turn
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._in_feed = False
        self._write_paused = False
        self._writable: asyncio.Future | None = None
        #: Set for a TLS transport: a flush leaves as one buffer (one record, not one per frame).
        self._join_writes = False
        #: Counters: requests started, handlers that raised (not a refusal).
        self.requests = 0
        self.handler_errors = 0

    # --- state -------------------------------------------------------------------------
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

    @property
    def busy(self) -> bool:
        """A handler is still running (it may outlive the connection: handlers finish)."""
        return bool(self._tasks)

    # --- lifecycle ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._join_writes = transport.get_extra_info("ssl_object") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc: BaseException | None) -> None:
        """Fail what waits on this connection; handlers still running are not cancelled:
        they find it closed when they answer, and their answers are dropped."""
        self._closed = True
        self._out.clear()
        self._backlog.clear()
        if self._writable is not None and not self._writable.done():
            reason = f": {exc}" if exc else ""
            self._writable.set_exception(ConnectionError(f"connection to {self.peer} closed{reason}"))
            self._writable.exception()
        if not self._gone.done():
            self._gone.set_result(None)

    def eof_received(self) -> bool | None:
        return None  # close our side too

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

    def stop_reading(self) -> None:
        """Start no more requests, for good: requests read but not started are dropped and
        reading pauses, never to resume (the first step of a shutdown)."""
        self._stopping = True
        self._backlog.clear()
        self._pause_reading()

    async def shutdown(self, grace: float) -> None:
        """Stop reading, let running handlers answer within ``grace`` seconds (cancelling
        those still running then), close after writing what is buffered, and return once the
        transport reports the connection gone (aborting it after :data:`CLOSE_DEADLINE`)."""
        self.stop_reading()
        await finish_tasks(self._tasks, grace)
        self.close()
        if self.transport is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._gone), CLOSE_DEADLINE)
        except TimeoutError:
            self.abort()

    # --- reading -----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self._protocol_error(exc)
            if not self._closed:
                self.abort()
            return
        self._in_feed = True
        try:
            self._received(frames)
        finally:
            self._in_feed = False
            if self._out:
                self._flush()

    def _received(self, frames: list[Any]) -> None:
        """Start, or keep in the backlog, the requests of one read (the protocol's rule)."""
        raise NotImplementedError

    def _admit(self) -> None:
        """Start backlogged requests the protocol's limits allow; resume reading when they
        allow reading again (called when a handler ends and when the peer reads again)."""
        raise NotImplementedError

    def _protocol_error(self, exc: ProtocolError) -> None:
        """Bytes that are not a frame: say so (the connection is aborted next unless this
        closed it)."""
        log.warning("closing connection to %s: protocol error: %s", self.peer, exc)

    def _spawn(self, coro: Coroutine[Any, Any, Any], yielded: Any,
               on_done: Callable[[Any, BaseException | None], None]) -> None:
        """Run the rest of a handler whose first step yielded ``yielded`` as a kept task."""
        task = self._loop.create_task(continue_coroutine(coro, yielded, on_done))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # already reported through the protocol's finish; mark retrieved

    # --- writing -----------------------------------------------------------------------
    def _write(self, parts: list[bytes]) -> None:
        """Queue a frame's buffers; what is written in one loop turn leaves in one call.

        Large output is written at once instead: the transport then sees it and can signal
        back-pressure (pause_writing) before the next request of the same read is started.
        """
        if len(parts) == 1:
            frame = parts[0]
            self._out.append(frame)
            self._out_bytes += len(frame)
        else:
            self._out += parts
            self._out_bytes += sum(map(len, parts))
        if self._out_bytes >= CORK_LIMIT:
            self._flush()
        elif not self._in_feed and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._out_bytes = 0
        out = self._out
        if not out:
            return
        self._out = []
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self._join_writes and len(out) > 1:
                transport.write(b"".join(out))
            else:
                transport.writelines(out)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._limited:
            # The peer is not reading our answers: stop reading its requests too.  Handlers
            # already running finish and queue their answers (bounded by the in-flight limit).
            self._pause_reading()

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

        A handler about to produce a large answer (a pull) or a caller about to send can
        wait here first.
        """
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        if not self._write_paused:
            return
        if self._writable is None:
            self._writable = self._loop.create_future()
        await asyncio.shield(self._writable)

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self._closed and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and not self._closed and not self._stopping \
                and not self._write_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]


class RemotingConnection(ConnectionCore):
    """One remoting connection, either end.  Not thread-safe: event loop only.

    Requests go to ``handlers[code](connection, cmd)`` (else ``default_handler``, else
    REQUEST_CODE_NOT_SUPPORTED), after ``before_request(connection, cmd)`` when given.  With
    ``max_inflight`` at most that many run at once; requests read beyond it wait in a backlog
    and reading pauses, as it does while the peer is not reading (the server's rules); without
    it (the client) every request starts when read.  ``prepare(cmd)`` runs on every request
    this end sends, just before encoding.  Subclasses extend the protocol callbacks.  Opaques of
    requests this end sends count from ``OPAQUE_FIRST`` and wrap after ``OPAQUE_LAST``.
    """

    OPAQUE_FIRST = 0
    OPAQUE_LAST = 0x7FFFFFFF

    __slots__ = (
        "_before_request",
        "_default_handler",
        "_handlers",
        "_max_inflight",
        "_opaques",
        "_pending",
        "_prepare",
        "_timeouts",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, max_frame_size: int, peer: str,
                 handlers: dict[int, Handler], default_handler: Handler | None = None,
                 before_request: BeforeRequest | None = None, *, max_inflight: int | None = None,
                 prepare: Prepare | None = None) -> None:
        super().__init__(loop, FrameDecoder(max_frame_size), peer, limited=max_inflight is not None)
        self._handlers = handlers  # the owner's table, shared by all its connections
        self._default_handler = default_handler
        self._before_request = before_request
        self._prepare = prepare
        self._max_inflight = max_inflight if max_inflight is not None else sys.maxsize
        # requests this end sent, waiting for their answers
        self._opaques = itertools.count(self.OPAQUE_FIRST)
        self._pending: dict[int, asyncio.Future] = {}
        self._timeouts = RequestTimeouts(loop, peer)

    # --- lifecycle ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._timeouts.peer = self.peer  # the server learns it only now

    def connection_lost(self, exc: BaseException | None) -> None:
        """Fail the calls waiting for the peer's answers, then what the core fails."""
        self._closed = True
        reason = f": {exc}" if exc else ""
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(
                    f"connection to {self.peer} closed before the answer arrived{reason}"))
        self._pending.clear()
        self._timeouts.close()
        super().connection_lost(exc)

    # --- reading -----------------------------------------------------------------------
    def _received(self, commands: list[RemotingCommand]) -> None:
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                fut = self._pending.pop(cmd.opaque, None)
                if fut is None:
                    log.debug("%s: dropping answer with unknown opaque %d", self.peer, cmd.opaque)
                elif not fut.done():
                    fut.set_result(cmd)
            elif self._inflight >= self._max_inflight or self._backlog or \
                    (self._write_paused and self._limited):
                self._backlog.append(cmd)
                self._pause_reading()
            else:
                self._dispatch(cmd)

    # --- handling requests ---------------------------------------------------------------
    def _dispatch(self, cmd: RemotingCommand) -> None:
        self._inflight += 1
        self.requests += 1
        try:
            # Runs before any handler, unknown codes included (RocketMQ's RPC hook); its
            # refusal is answered like a HeaderError (one-way: not at all), at once when
            # raised, when the awaitable it returns ends otherwise.
            coro = None if self._before_request is None else self._before_request(self, cmd)
            if coro is None:
                handler = self._handlers.get(cmd.code) or self._default_handler
                if handler is None:
                    self._finish(cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                                   f" request type {cmd.code} not supported"), None)
                    return
                coro = handler(self, cmd)
            cls = coro.__class__
            if cls not in _COROUTINE_TYPES:
                if cls is RemotingCommand or coro is None:  # a plain function's answer
                    self._finish(cmd, coro, None)
                    return
                if isinstance(coro, Coroutine):  # a compiled module's coroutine type
                    _COROUTINE_TYPES.add(cls)
                elif isinstance(coro, Awaitable):
                    coro = _await(coro)
                else:
                    self._finish(cmd, coro, None)
                    return
            # First step inline (see _flow): most handlers finish without waiting.
            yielded = coro.send(None)
        except StopIteration as stop:
            self._finish(cmd, stop.value, None)
            return
        except BaseException as exc:  # noqa: BLE001 - becomes the error answer
            self._finish(cmd, None, exc)
            return
        self._spawn(coro, yielded, lambda value, exc: self._finish(cmd, value, exc))

    def _finish(self, cmd: RemotingCommand, result: Any, exc: BaseException | None) -> None:
        """A handler ended: answer (unless one-way or nothing to say), then admit the backlog."""
        self._inflight -= 1
        response: RemotingCommand | None
        if exc is None:
            response = result if isinstance(result, RemotingCommand) else None
            if result is not None and response is None:
                log.error("handler for code %d returned %r, not a RemotingCommand", cmd.code, result)
                response = cmd.response(ResponseCode.SYSTEM_ERROR, "handler returned no command")
        elif isinstance(exc, Refusal):  # the one place a refusal becomes its answer
            log.debug("code %d from %s refused: %s", cmd.code, self.peer, exc.remark)
            response = exc.answer(cmd)
        elif isinstance(exc, asyncio.CancelledError):
            response = None  # shutting down: the connection is about to close
        elif isinstance(exc, Exception):
            self.handler_errors += 1
            log.error("handler for code %d from %s failed", cmd.code, self.peer, exc_info=exc)
            response = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"[:512])
        else:
            raise exc  # KeyboardInterrupt / SystemExit
        if response is not None and not cmd.flag & FLAG_ONEWAY and not self._closed:
            response.opaque = cmd.opaque
            response.flag |= FLAG_RESPONSE
            response.serialize_type = cmd.serialize_type
            try:
                parts = encode_parts(response)
            except Exception:
                log.exception("encoding the response to code %d failed", cmd.code)
                parts = encode_parts(cmd.response(ResponseCode.SYSTEM_ERROR, "response not encodable"))
            self._write(parts)
        if self._backlog:
            self._admit()

    def _admit(self) -> None:
        """Start backlogged requests while slots are free; resume reading once none wait."""
        while self._backlog and self._inflight < self._max_inflight and not self._closed \
                and not self._write_paused:
            self._dispatch(self._backlog.popleft())
        if not self._backlog:
            self._resume_reading()

    # --- requests to the peer --------------------------------------------------------------
    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque > self.OPAQUE_LAST:
            self._opaques = itertools.count(self.OPAQUE_FIRST)
            opaque = next(self._opaques)
        return opaque

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its answer; TimeoutError fails this call only."""
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        if self._write_paused:
            await self.wait_writable()
        opaque = self._next_opaque()
        cmd.opaque = opaque
        cmd.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        if self._prepare is not None:
            self._prepare(cmd)
        parts = encode_parts(cmd)
        fut = self._loop.create_future()
        self._pending[opaque] = fut
        self._timeouts.add(fut, opaque, timeout)
        self._write(parts)
        try:
            return await fut
        finally:
            self._pending.pop(opaque, None)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send a one-way request (flag bit 1); nothing comes back.

        Raises ConnectionError when the connection is gone.  Never waits: a caller that may
        send many looks at :attr:`writable` first.
        """
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        if self._prepare is not None:
            self._prepare(cmd)
        self._write(encode_parts(cmd))


#: Classes of the coroutine objects handlers return: Python's, and those of compiled modules
#: (Cython's coroutine type registers as a ``Coroutine`` but is not ``CoroutineType``), added
#: when first seen, so a coroutine is stepped directly and not through :func:`_await`.
_COROUTINE_TYPES: set[type] = {CoroutineType}


async def _await(fut: Awaitable[Any]) -> Any:
    return await fut
