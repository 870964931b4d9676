"""The Kafka-protocol listener: one :class:`KafkaConnection` (an ``asyncio.Protocol``) per client.

The transport moves frames, the codec (``remoting/kafka/framing.py``) parses them and the
handlers decide.  What Kafka clients rely on (docs/kafka.md, "Listener"):

* **One request at a time, answered in order.**  Kafka mutes a connection while it handles a
  request, and kafka-python matches each answer to its oldest request in flight; so requests
  of one connection run one after another in arrival order (a Produce with ``acks=0`` has no
  answer and takes no place in that order).
* **ApiVersions never closes.**  An ApiVersions version we do not serve gets Kafka's v0 error
  answer; any other unknown API or version, a malformed request or a handler failure closes
  the connection with one log line naming the peer and the API (a client reconnects; half an
  answer would desynchronise it).
* **Bounded.**  ``max_connections``, ``max_frame_size`` (a larger frame closes the connection),
  and back-pressure both ways: reading pauses while the transport's write buffer is above its
  high-water mark and while too many read requests wait their turn.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import (
    FrameSplitter,
    FrameTooLarge,
    UnsupportedVersion,
    api_versions_unsupported,
    decode_request,
    encode_response,
)
from txbroker.remoting.kafka.primitives import KafkaDecodeError
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.metrics import BrokerMetrics

log = logging.getLogger("txbroker.kafka")

#: Requests read ahead of the one being handled before reading pauses (pipelining clients
#: such as aiokafka keep up to 5 in flight; more only costs memory).
MAX_QUEUED = 32
#: Bytes the transport may buffer for a slow reader before reading pauses.
WRITE_HIGH_WATER = 4 * 1024 * 1024


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return f"api {api_key}"


class KafkaConnection(asyncio.Protocol):
    """One accepted connection: frames in, handled in order by one task, answers out."""

    def __init__(self, listener: KafkaListener, conn_id: int) -> None:
        self.listener = listener
        self.id = conn_id
        self.peer = "?"
        self.transport: asyncio.Transport | None = None
        self._splitter = FrameSplitter(listener.config.max_frame_size)
        self._queue: collections.deque[bytes] = collections.deque()
        self._worker: asyncio.Task | None = None
        self._closed = False
        self._write_paused = False
        self._read_paused = False

    # --- transport callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        listener = self.listener
        if listener._closing or len(listener.connections) >= listener.config.max_connections:
            self._closed = True
            reason = "shutting down" if listener._closing else \
                f"limit of {listener.config.max_connections} connections reached"
            log.warning("refusing Kafka connection from %s: %s", self.peer, reason)
            transport.abort()
            return
        listener.connections.add(self)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self.listener.connections.discard(self)
        self._queue.clear()
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            frames = self._splitter.feed(data)
        except FrameTooLarge as exc:
            self.close(f"frame of {exc.size} bytes is larger than max_frame_size {exc.max_size}")
            return
        if not frames:
            return
        self._queue.extend(frames)
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work())
        self._update_reading()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        if self._closed or self.transport is None:
            return
        want_pause = (self._write_paused or len(self._queue) >= MAX_QUEUED
                      or self.listener._closing)
        if want_pause != self._read_paused:
            self._read_paused = want_pause
            if want_pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # --- requests ---------------------------------------------------------------------------
    async def _work(self) -> None:
        """Handle queued requests one by one until none is left (then the task ends)."""
        try:
            while self._queue and not self._closed:
                frame = self._queue.popleft()
                await self._handle(frame)
                self._update_reading()
        finally:
            self._worker = None

    async def _handle(self, frame: bytes) -> None:
        listener = self.listener
        try:
            req = decode_request(frame)
        except UnsupportedVersion as exc:
            if exc.api_key == ApiKey.API_VERSIONS:
                listener.metrics.kafka_requests.labels(api="api_versions").inc()
                self._write(api_versions_unsupported(exc.correlation_id))
                return
            self.close(f"{_api_name(exc.api_key)} v{exc.api_version} is not served")
            return
        except KafkaDecodeError as exc:
            key = int.from_bytes(frame[:2], "big", signed=True) if len(frame) >= 2 else -1
            self.close(f"malformed {_api_name(key)} request: {exc}")
            return
        name = _api_name(req.api_key)
        handler = listener.handlers.get(req.api_key)
        if handler is None:
            self.close(f"{name} is not handled")
            return
        listener.metrics.kafka_requests.labels(api=name).inc()
        ctx = KafkaRequestContext(req.api_key, req.api_version, req.correlation_id,
                                  req.client_id, self.peer, self.id)
        try:
            answer = await handler(ctx, req.body)
            if answer is None:
                return
            out = encode_response(req.api_key, req.api_version, req.correlation_id, answer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("Kafka %s v%d from %s failed", name, req.api_version, self.peer)
            self.close(f"{name} handler failed: {exc!r}", logged=True)
            return
        self._write(out)

    def _write(self, data: bytes) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(data)

    def close(self, reason: str | None = None, *, logged: bool = False) -> None:
        """Close the connection (answers already written are flushed first)."""
        if self._closed:
            return
        self._closed = True
        if reason is not None and not logged:
            log.warning("closing Kafka connection %d from %s: %s", self.id, self.peer, reason)
        self._queue.clear()
        if self.transport is not None:
            self.transport.close()

    @property
    def busy(self) -> bool:
        return self._worker is not None


class KafkaListener:
    """Listens on one socket and hands each Kafka request to the handler of its API key."""

    def __init__(self, config: BrokerConfig, handlers: dict[int, Handler],
                 metrics: BrokerMetrics) -> None:
        self.config = config
        self.handlers = {int(k): h for k, h in handlers.items()}
        self.metrics = metrics
        self.connections: set[KafkaConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._ids = itertools.count(1)
        self._closing = False

    async def start(self, sock: socket.socket) -> None:
        """Serve on ``sock`` (bound and listening)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self, next(self._ids)), sock=sock, backlog=1024)

    async def close(self, grace: float) -> None:
        """Stop accepting and reading; requests in progress get ``grace`` seconds to finish
        (their answers are written), then every connection closes."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn._queue.clear()  # not started: the client resends after reconnecting
            conn._update_reading()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(c.busy for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn._worker is not None:
                conn._worker.cancel()
            conn.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except TimeoutError:
                pass
