"""asyncio remoting client: one TCP connection, many requests in flight, matched by opaque.

Used by the Python SDK, the CLI, benchmarks and tests.  Design points:

* Requests are multiplexed: each gets an opaque from this client's counter and a future; the
  answer completes the future whatever order answers arrive in.
* A time-out fails that one request and nothing else.  (The C++ client closes the whole
  connection on a time-out, which is what made a held pull cost it unrelated requests;
  docs/protocol.md §8.5.)  A late answer to a timed-out request is dropped.
* The broker calls the client too (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED):
  handlers registered per code run for those requests, and what a handler returns is sent
  back as the response unless the request is one-way.
* When the connection drops, every pending call fails with :class:`ConnectionError`; the next
  call reconnects, with exponential back-off between failed attempts so that a dead broker is
  not hammered.  :meth:`close` is final.
* With ``credentials`` every request leaving through :meth:`invoke` / :meth:`invoke_oneway` is
  signed (``AccessKey`` + ``Signature``, RocketMQ's ``AclClientRPCHook``) as the last step
  before encoding, so no caller can add a field the signature does not cover.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from txbroker.remoting._flow import run_fast
from txbroker.remoting.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    encode,
)
from txbroker.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from txbroker.remoting.errors import Refusal
from txbroker.remoting.signing import SessionCredentials

log = logging.getLogger("txbroker.remoting.client")

ClientHandler = Callable[[RemotingCommand], Awaitable[RemotingCommand | None] | RemotingCommand | None]

#: Reconnect back-off after a failed connect: first delay, factor, cap (seconds).
RECONNECT_BACKOFF_MIN = 0.05
RECONNECT_BACKOFF_MAX = 5.0
DEFAULT_CONNECT_TIMEOUT = 3.0
#: Frames are collected and written once per loop turn, up to this many bytes.
CORK_LIMIT = 64 * 1024


def parse_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``[::1]:port``) to a (host, port) pair."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class _ClientProtocol(asyncio.Protocol):
    """The wire side of one connection attempt; a new one is made per reconnect."""

    def __init__(self, client: RemotingClient) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(client.max_frame_size)
        self.pending: dict[int, asyncio.Future] = {}
        self.lost = False
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_scheduled = False
        self.in_feed = False
        self.write_paused = False
        self.writable: asyncio.Future | None = None
        self.tasks: set[asyncio.Task] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.out.clear()
        reason = f": {exc}" if exc else ""
        error = ConnectionError(f"connection to {self.client.addr} closed{reason}")
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(error)
        self.pending.clear()
        if self.writable is not None and not self.writable.done():
            self.writable.set_exception(error)
            self.writable.exception()
        self.client._lost(self)

    def data_received(self, data: bytes) -> None:
        try:
            commands = self.decoder.feed(data)
        except ProtocolError as exc:
            log.warning("closing connection to %s: protocol error: %s", self.client.addr, exc)
            self.transport.abort()  # type: ignore[union-attr]
            return
        self.in_feed = True
        try:
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    fut = self.pending.pop(cmd.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                    elif fut is None:
                        log.debug("%s: dropping answer with unknown opaque %d",
                                  self.client.addr, cmd.opaque)
                else:
                    self._serve(cmd)
        finally:
            self.in_feed = False
            if self.out:
                self.flush()

    def _serve(self, cmd: RemotingCommand) -> None:
        """A request from the server: run its handler, answer unless one-way."""
        handler = self.client._handlers.get(cmd.code)
        if handler is None:
            log.debug("%s: no handler for server request code %d", self.client.addr, cmd.code)
            self._answered(cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                             f" request type {cmd.code} not supported"), None)
            return
        try:
            result = handler(cmd)
        except BaseException as exc:  # noqa: BLE001 - becomes an error answer
            self._answered(cmd, None, exc)
            return
        if not asyncio.iscoroutine(result):
            self._answered(cmd, result, None)
            return
        task = run_fast(result, lambda value, exc: self._answered(cmd, value, exc), self.loop)
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            task.exception()

    def _answered(self, cmd: RemotingCommand, result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            if isinstance(exc, asyncio.CancelledError):
                return
            if not isinstance(exc, Exception):
                raise exc
            if isinstance(exc, Refusal):
                result = exc.answer(cmd)
            else:
                log.error("%s: handler for server request %d failed", self.client.addr, cmd.code,
                          exc_info=exc)
                result = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"[:512])
        if cmd.flag & FLAG_ONEWAY or not isinstance(result, RemotingCommand) or self.lost:
            return
        result.opaque = cmd.opaque
        result.flag |= FLAG_RESPONSE
        result.serialize_type = cmd.serialize_type
        self.write(encode(result))

    # --- writing -----------------------------------------------------------------------
    def write(self, frame: bytes) -> None:
        """Queue a frame; frames written in one loop turn leave in one system call."""
        self.out.append(frame)
        self.out_bytes += len(frame)
        if self.out_bytes >= CORK_LIMIT:
            self.flush()
        elif not self.in_feed and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        self.out_bytes = 0
        out = self.out
        if not out or self.transport is None or self.transport.is_closing():
            out.clear()
            return
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    async def wait_writable(self) -> None:
        if self.write_paused and not self.lost:
            if self.writable is None:
                self.writable = self.loop.create_future()
            await asyncio.shield(self.writable)


class RemotingClient:
    """A connection to one broker or name server address (``"host:port"``)."""

    def __init__(self, addr: str, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 reconnect: bool = True, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 on_lost: Callable[[], None] | None = None,
                 credentials: SessionCredentials | None = None) -> None:
        self.addr = addr
        self.credentials = credentials
        #: Called when the connection drops (not on :meth:`close`): an owner that must stay
        #: reachable by the server, as a transactional producer must for check-backs, uses it
        #: to reconnect at once instead of at its next call.
        self.on_lost = on_lost
        self.host, self.port = parse_addr(addr)
        self.max_frame_size = max_frame_size
        self.reconnect = reconnect
        self.connect_timeout = connect_timeout
        self._handlers: dict[int, ClientHandler] = {}
        self._proto: _ClientProtocol | None = None
        self._connecting: asyncio.Future | None = None
        self._opaques = itertools.count(0)
        self._closed = False
        self._ever_connected = False
        self._backoff = 0.0
        self._retry_at = 0.0
        self.reconnects = 0

    # --- state -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (a dropped connection reconnects instead)."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._proto is not None and not self._proto.lost

    @property
    def local_addr(self) -> tuple[str, int] | None:
        if self._proto is None or self._proto.transport is None:
            return None
        return self._proto.transport.get_extra_info("sockname")

    def register(self, code: int, handler: ClientHandler) -> None:
        """Handle requests the server sends with ``code``; the result is the answer."""
        self._handlers[int(code)] = handler

    # --- connecting ----------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect now (also done implicitly by the first call)."""
        await self._ensure()

    async def _ensure(self) -> _ClientProtocol:
        proto = self._proto
        if proto is not None and not proto.lost:
            return proto
        if self._closed:
            raise ConnectionError(f"client for {self.addr} is closed")
        if self._ever_connected and not self.reconnect:
            raise ConnectionError(f"connection to {self.addr} was lost (reconnect disabled)")
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        wait = self._retry_at - loop.time()
        if wait > 0:
            raise ConnectionError(f"connection to {self.addr} failed recently; "
                                  f"next attempt in {wait:.2f} s")
        fut: asyncio.Future = loop.create_future()
        self._connecting = fut
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientProtocol(self), self.host, self.port),
                self.connect_timeout)
        except (TimeoutError, OSError) as exc:
            self._backoff = min(max(self._backoff * 2, RECONNECT_BACKOFF_MIN), RECONNECT_BACKOFF_MAX)
            self._retry_at = loop.time() + self._backoff
            error = ConnectionError(f"cannot connect to {self.addr}: "
                                    f"{exc or type(exc).__name__}")
            fut.set_exception(error)
            fut.exception()
            raise error from exc
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()
            raise
        finally:
            self._connecting = None
        if self._closed:  # closed while connecting
            proto.transport.close()  # type: ignore[union-attr]
            error = ConnectionError(f"client for {self.addr} is closed")
            fut.set_exception(error)
            fut.exception()
            raise error
        if self._ever_connected:
            self.reconnects += 1
            log.info("reconnected to %s", self.addr)
        self._ever_connected = True
        self._backoff = 0.0
        self._retry_at = 0.0
        self._proto = proto
        fut.set_result(proto)
        return proto

    def _lost(self, proto: _ClientProtocol) -> None:
        if self._proto is proto:
            self._proto = None
            if not self._closed:
                log.info("connection to %s lost", self.addr)
                if self.on_lost is not None:
                    self.on_lost()

    async def close(self) -> None:
        """Close for good; pending calls fail with ConnectionError."""
        self._closed = True
        proto, self._proto = self._proto, None
        if proto is None or proto.transport is None:
            return
        proto.flush()
        proto.transport.close()
        for task in list(proto.tasks):
            task.cancel()
        if not proto.lost:
            proto.connection_lost(None)

    # --- calls ---------------------------------------------------------------------------
    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque > 0x3FFFFFFF:  # stay below the server's own range, as Java's counter would wrap
            self._opaques = itertools.count(0)
            opaque = next(self._opaques)
        return opaque

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its answer; TimeoutError fails this call only."""
        proto = self._proto
        if proto is None or proto.lost:
            proto = await self._ensure()
        if proto.write_paused:
            await proto.wait_writable()
        opaque = self._next_opaque()
        cmd.opaque = opaque
        cmd.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        if self.credentials is not None:
            self.credentials.sign(cmd)
        frame = encode(cmd)
        fut = proto.loop.create_future()
        proto.pending[opaque] = fut
        timer = proto.loop.call_later(timeout, _expire, fut, opaque, timeout, self.addr)
        proto.write(frame)
        try:
            return await fut
        finally:
            timer.cancel()
            proto.pending.pop(opaque, None)

    async def invoke_oneway(self, cmd: RemotingCommand) -> None:
        """Send a one-way request (flag bit 1): no answer is expected or awaited."""
        proto = self._proto
        if proto is None or proto.lost:
            proto = await self._ensure()
        if proto.write_paused:
            await proto.wait_writable()
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        if self.credentials is not None:
            self.credentials.sign(cmd)
        proto.write(encode(cmd))

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self.connected else "idle"
        return f"<RemotingClient {self.addr} {state}>"


def _expire(fut: asyncio.Future, opaque: int, timeout: float, addr: str) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"no answer from {addr} within {timeout:g} s "
                                       f"(opaque {opaque})"))
