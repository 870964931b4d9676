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
* A request may come encoded ahead of time but for its opaque (an :class:`Encoded`, the
  SDK's frame templates): the connection numbers it and writes its buffers as they are.
* With ``credentials`` every request leaving through :meth:`invoke` / :meth:`invoke_oneway` is
  signed (``AccessKey`` + ``Signature``, RocketMQ's ``AclClientRPCHook``) as the last step
  before encoding, so no caller can add a field the signature does not cover.
* With ``ssl`` (an ``ssl.SSLContext``, see :mod:`txbroker.remoting.tls`) the connection is
  TLS, the server's certificate checked against the address's host name as the context says.
  A plaintext connection the broker closes before answering anything says that the broker may
  require TLS: that is how an enforcing TLS port refuses a plaintext client.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from txbroker.remoting.codec import DEFAULT_MAX_FRAME_SIZE
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.connection import Handler, RemotingConnection
from txbroker.remoting.signing import SessionCredentials

log = logging.getLogger("txbroker.remoting.client")

ClientHandler = Callable[[RemotingCommand], Awaitable[RemotingCommand | None] | RemotingCommand | None]

#: Reconnect back-off after a failed connect: first delay, factor, cap (seconds).
RECONNECT_BACKOFF_MIN = 0.05
RECONNECT_BACKOFF_MAX = 5.0
DEFAULT_CONNECT_TIMEOUT = 3.0


def parse_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``[::1]:port``) to a (host, port) pair."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class Encoded(Protocol):
    """A request encoded but for its opaque (``txbroker.client.frames``): what the SDK sends
    most, built without a command or a JSON encoding per request."""

    def frame(self, opaque: int) -> list[bytes]:
        """The frame's buffers with ``opaque`` in place (the request's flag is its own)."""
        ...

    def command(self) -> RemotingCommand:
        """The same request as a command, for an end that signs what it sends."""
        ...


class _ClientProtocol(RemotingConnection):
    """The connection core for one connection attempt; a new one is made per reconnect.

    It adds what a client end does: sign outgoing requests (the core's ``prepare`` step), run
    the handlers registered for the server's requests with no in-flight limit, tell the client
    when the connection is lost.
    """

    #: Stay below the server's own range, as Java's counter would wrap.
    OPAQUE_LAST = 0x3FFFFFFF

    def __init__(self, client: RemotingClient) -> None:
        credentials = client.credentials
        super().__init__(asyncio.get_running_loop(), client.max_frame_size, client.addr,
                         client._handlers,
                         prepare=credentials.sign if credentials is not None else None)
        self.client = client

    def connection_lost(self, exc: BaseException | None) -> None:
        # The first request of this connection still waits for its answer: the peer closed
        # without answering anything (no per-read bookkeeping needed to know it).
        if self.OPAQUE_FIRST in self._pending and self.client.ssl is None:
            # Closed on the first request without a word: an enforcing TLS port does that.
            reason = f" ({exc})" if exc else ""
            error = ConnectionError(f"connection to {self.peer} closed before any answer"
                                    f"{reason}; if that broker requires TLS, connect with TLS "
                                    f"(the SDK's tls=, the CLI's --tls)")
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
        super().connection_lost(exc)
        self.client._lost(self)

    async def request_encoded(self, req: Encoded, timeout: float) -> RemotingCommand:
        """:meth:`request` for a request encoded ahead: the same steps, with the frame's
        buffers from ``req`` instead of the codec (a signing end encodes its command)."""
        if self._prepare is not None:
            return await self.request(req.command(), timeout)
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        if self._write_paused:
            await self.wait_writable()
        opaque = next(self._opaques)  # _next_opaque's common case inline
        if opaque > self.OPAQUE_LAST:
            opaque = self._next_opaque()  # wraps
        parts = req.frame(opaque)
        fut = self._loop.create_future()
        self._pending[opaque] = fut
        self._timeouts.add(fut, opaque, timeout)
        self._write(parts)
        try:
            return await fut
        finally:
            self._pending.pop(opaque, None)

    def send_oneway_encoded(self, req: Encoded) -> None:
        """:meth:`send_oneway` for a one-way request encoded ahead."""
        if self._prepare is not None:
            self.send_oneway(req.command())
            return
        if self._closed:
            raise ConnectionError(f"connection to {self.peer} is closed")
        self._write(req.frame(self._next_opaque()))


class RemotingClient:
    """A connection to one broker or name server address (``"host:port"``)."""

    def __init__(self, addr: str, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 reconnect: bool = True, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 on_lost: Callable[[], None] | None = None,
                 credentials: SessionCredentials | None = None,
                 ssl: ssl.SSLContext | None = None) -> None:
        self.addr = addr
        self.credentials = credentials
        #: TLS context (None: plaintext); the server is verified as the context says.
        self.ssl = ssl
        #: Called when the connection drops (not on :meth:`close`): an owner that must stay
        #: reachable by the server, as a transactional producer must for check-backs, uses it
        #: to reconnect at once instead of at its next call.
        self.on_lost = on_lost
        self.host, self.port = parse_addr(addr)
        self.max_frame_size = max_frame_size
        self.reconnect = reconnect
        self.connect_timeout = connect_timeout
        self._handlers: dict[int, Handler] = {}
        self._proto: _ClientProtocol | None = None
        self._connecting: asyncio.Future | None = None
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
        return self._proto is not None and not self._proto.closed

    @property
    def local_addr(self) -> tuple[str, int] | None:
        if self._proto is None or self._proto.transport is None:
            return None
        return self._proto.transport.get_extra_info("sockname")

    def register(self, code: int, handler: ClientHandler) -> None:
        """Handle requests the server sends with ``code``; the result is the answer."""
        self._handlers[int(code)] = lambda _conn, cmd: handler(cmd)

    # --- connecting ----------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect now (also done implicitly by the first call)."""
        await self._ensure()

    async def _ensure(self) -> _ClientProtocol:
        proto = self._proto
        if proto is not None and not proto.closed:
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
                loop.create_connection(lambda: _ClientProtocol(self), self.host, self.port,
                                       ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None),
                self.connect_timeout)
        except (TimeoutError, OSError) as exc:
            self._backoff = min(max(self._backoff * 2, RECONNECT_BACKOFF_MIN), RECONNECT_BACKOFF_MAX)
            self._retry_at = loop.time() + self._backoff
            error = ConnectionError(f"cannot connect to {self.addr}: "
                                    f"{str(exc) or type(exc).__name__}")
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
        """Close for good; pending calls fail with ConnectionError.

        Handlers still running for the server's requests are cancelled; what is buffered is
        written; returns once the connection is gone.
        """
        self._closed = True
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            await proto.shutdown(grace=0.0)

    # --- calls ---------------------------------------------------------------------------
    def invoke(self, cmd: RemotingCommand | Encoded,
               timeout: float) -> Coroutine[Any, Any, RemotingCommand]:
        """Send a request and wait for its answer; TimeoutError fails this call only.

        Await the result, as of a coroutine function: it is the connection's own
        :meth:`~RemotingConnection.request` when connected, so a call costs no coroutine of
        its own on top (see the per-request path in :mod:`txbroker.remoting.connection`).
        """
        proto = self._proto
        if proto is None or proto._closed:  # the attribute: a property costs a call
            return self._connect_and_invoke(cmd, timeout)
        if cmd.__class__ is RemotingCommand:
            return proto.request(cmd, timeout)  # type: ignore[arg-type]
        return proto.request_encoded(cmd, timeout)  # type: ignore[arg-type]

    async def _connect_and_invoke(self, cmd: RemotingCommand | Encoded,
                                  timeout: float) -> RemotingCommand:
        proto = await self._ensure()
        if isinstance(cmd, RemotingCommand):
            return await proto.request(cmd, timeout)
        return await proto.request_encoded(cmd, timeout)

    def send_oneway_now(self, cmd: RemotingCommand | Encoded) -> bool:
        """Send a one-way request if that needs no wait (connected, peer reading): True when
        sent; False when the caller must use :meth:`invoke_oneway`, which connects or waits."""
        proto = self._proto
        if proto is None or proto._closed or proto._write_paused:
            return False
        if cmd.__class__ is RemotingCommand:
            proto.send_oneway(cmd)  # type: ignore[arg-type]
        else:
            proto.send_oneway_encoded(cmd)  # type: ignore[arg-type]
        return True

    async def invoke_oneway(self, cmd: RemotingCommand | Encoded) -> None:
        """Send a one-way request (flag bit 1): no answer is expected or awaited."""
        proto = self._proto
        if proto is None or proto.closed:
            proto = await self._ensure()
        if not proto.writable:
            await proto.wait_writable()
        if isinstance(cmd, RemotingCommand):
            proto.send_oneway(cmd)
        else:
            proto.send_oneway_encoded(cmd)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self.connected else "idle"
        return f"<RemotingClient {self.addr} {state}>"

