"""The Kafka-protocol listener: one :class:`KafkaConnection` per client, on the connection core.

The connection core (``remoting/connection.py``, shared with the RocketMQ listener) moves
bytes, corks writes, applies back-pressure and shuts down in order; Kafka's framing
(:class:`KafkaFraming`) cuts frames, the codec (``remoting/kafka/framing.py``) parses them and
the handlers decide.  What Kafka clients rely on (docs/kafka.md, "Listener"):

* **One request at a time, answered in order.**  Kafka mutes a connection while it handles a
  request, and kafka-python matches each answer to its oldest request in flight; so requests
  of one connection run one after another in arrival order (a Produce with ``acks=0`` has no
  answer and takes no place in that order).  No request goes from the broker to a Kafka
  client, so nothing is matched by correlation id here.
* **ApiVersions never closes.**  An ApiVersions version we do not serve gets Kafka's v0 error
  answer; any other unknown API or version, a malformed request or a handler failure closes
  the connection with one log line naming the peer and the API (a client reconnects; half an
  answer would desynchronise it).
* **Bounded, never cut off for being fast.**  ``max_connections``, ``max_frame_size`` (a larger
  frame closes the connection), and per connection ``kafka_max_inflight_per_connection``
  requests read and not yet answered and ``kafka_max_queued_bytes`` of requests waiting their
  turn: at either limit, and while the client does not read its answers, the connection is
  not read, so a pipelining client is slowed down by TCP, not disconnected.
* **Authenticated first, when SASL is on.**  Until a connection has authenticated
  (``service/kafka/sasl.py``), only ApiVersions, SaslHandshake and SaslAuthenticate (or the
  raw tokens after a SaslHandshake v0) are read, frames are bounded by
  ``kafka_sasl_max_receive_size``, and anything else closes the connection, as Kafka does; a
  failed authentication is answered, then the connection closes.
* **TLS as the broker port has it** (``tls_mode``, docs/security.md "Kafka over TLS"): with TLS
  on, a :class:`~txbroker.remoting.tls_listener.TLSListener` accepts, peeks at each
  connection's first byte and hands it over with or without TLS, so ``enforcing`` is Kafka's
  SSL / SASL_SSL listener and ``permissive`` serves both on one port.  A Kafka frame starts
  with its int32 size, whose first byte is 0x16 only for a frame of 352 MiB or more, which
  ``max_frame_size`` never allows with TLS on (``BrokerConfig``).  SASL/PLAIN is offered on a
  TLS connection, and on a plaintext one only with ``kafka_sasl_plain_over_plaintext``.
* **Handlers finish.**  A dropped connection does not cancel the request being handled: a
  Produce whose client went away still completes its store write and its bookkeeping (only
  its answer is dropped), so the client's retry finds a consistent partition.  At stop, the
  running requests get ``shutdown_grace`` to finish, those of dropped connections included.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import socket
from types import CoroutineType
from typing import Any

from txbroker.config import BrokerConfig, ConfigError
from txbroker.remoting.command import ProtocolError
from txbroker.remoting.connection import ConnectionCore
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import (
    FrameSplitter,
    FrameTooLarge,
    KafkaRequest,
    UnsupportedVersion,
    api_versions_unsupported,
    decode_request,
    encode_response,
)
from txbroker.remoting.kafka.primitives import KafkaDecodeError
from txbroker.remoting.tls import ServerTLS
from txbroker.remoting.tls_listener import TLSListener
from txbroker.service.auth_throttle import AuthThrottle
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.peer_auth import ClusterAccount
from txbroker.service.kafka.sasl import (
    CredentialLookup,
    SaslFailure,
    SaslSession,
    SaslState,
    authenticated_handlers,
)
from txbroker.service.metrics import BrokerMetrics

log = logging.getLogger("txbroker.kafka")

#: Bytes the transport may buffer for a slow reader before reading pauses (a Fetch answer
#: is often megabytes: a lower mark would pause and resume around every one).
WRITE_HIGH_WATER = 4 * 1024 * 1024


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return f"api {api_key}"


class KafkaFraming:
    """Kafka's framing as the connection core uses it: int32-size-prefixed frames; a size
    above ``max_frame_size`` (or negative) is a :class:`ProtocolError`.  Sans-IO."""

    __slots__ = ("_limit_name", "_splitter")

    def __init__(self, max_frame_size: int, limit_name: str = "max_frame_size") -> None:
        self._splitter = FrameSplitter(max_frame_size)
        #: The setting the bound comes from, named in the error.
        self._limit_name = limit_name

    def set_max_frame_size(self, size: int, limit_name: str) -> None:
        """Frames from now on may be this large (raised once a connection authenticated)."""
        self._splitter.max_size = size
        self._limit_name = limit_name

    def feed(self, data: bytes) -> list[bytes]:
        try:
            return self._splitter.feed(data)
        except FrameTooLarge as exc:
            raise ProtocolError(f"frame of {exc.size} bytes is larger than {self._limit_name} "
                                f"{exc.max_size}") from None


class KafkaConnection(ConnectionCore):
    """One accepted Kafka connection: frames in, handled one at a time in arrival order,
    answers out in that order.  Not thread-safe: event loop only."""

    def __init__(self, listener: KafkaListener, conn_id: int) -> None:
        config = listener.config
        #: None when the port needs no authentication; made in :meth:`connection_made`,
        #: where it is known whether this connection is TLS (PLAIN depends on it).
        self.sasl: SaslSession | None = None
        self._framing = (KafkaFraming(config.kafka_sasl_max_receive_size,
                                      "kafka_sasl_max_receive_size (not authenticated yet)")
                         if listener.sasl_required else KafkaFraming(config.max_frame_size))
        super().__init__(listener.loop, self._framing, "?", limited=True)
        self.listener = listener
        self.id = conn_id
        #: Requests read and not answered (the one running included) before reading pauses.
        self._max_requests = config.kafka_max_inflight_per_connection
        #: Bytes of requests waiting their turn before reading pauses.
        self._max_queued_bytes = config.kafka_max_queued_bytes
        self._queued_bytes = 0
        #: True while :meth:`_admit` starts requests (a handler finishing inline must not
        #: start the next one from inside it).
        self._admitting = False
        self._accepted = False

    @property
    def queued_bytes(self) -> int:
        """Bytes of the requests read and waiting their turn."""
        return self._queued_bytes

    # --- lifecycle ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        listener = self.listener
        if listener.closing or len(listener.connections) >= listener.config.max_connections:
            self.transport = transport  # type: ignore[assignment]
            self._closed = True
            reason = "shutting down" if listener.closing else \
                f"limit of {listener.config.max_connections} connections reached"
            log.warning("refusing Kafka connection from %s: %s", self.peer, reason)
            transport.abort()
            return
        self.sasl = listener.new_sasl_session(
            tls=transport.get_extra_info("ssl_object") is not None)
        super().connection_made(transport)
        self._accepted = True
        listener.connections.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._queued_bytes = 0
        if not self._accepted:
            return
        self.listener.connections.discard(self)
        if self._tasks:  # its handler finishes; a stop waits for it
            self.listener.lingering.add(self)

    def _task_done(self, task: asyncio.Task) -> None:
        super()._task_done(task)
        if self._closed and not self._tasks:
            self.listener.lingering.discard(self)

    def stop_reading(self) -> None:
        super().stop_reading()
        self._queued_bytes = 0

    def close(self, reason: str | None = None, *, logged: bool = False) -> None:
        """Close after writing the answers already made; requests not started are dropped
        (the client resends them after reconnecting)."""
        if reason is not None and not logged and not self._closed:
            log.warning("closing Kafka connection %d from %s: %s", self.id, self.peer, reason)
        self._backlog.clear()
        self._queued_bytes = 0
        super().close()

    def _protocol_error(self, exc: ProtocolError) -> None:
        self.close(str(exc))

    # --- admission: one at a time, in order ------------------------------------------------
    def _received(self, frames: list[bytes]) -> None:
        for frame in frames:
            if self._closed:
                return
            if self._inflight or self._backlog or self._write_paused:
                self._backlog.append(frame)
                self._queued_bytes += len(frame)
                if self._inflight + len(self._backlog) >= self._max_requests \
                        or self._queued_bytes >= self._max_queued_bytes:
                    self._pause_reading()
            else:
                self._dispatch(frame)

    def _admit(self) -> None:
        if self._admitting:
            return
        self._admitting = True
        try:
            while self._backlog and not self._inflight and not self._closed \
                    and not self._write_paused:
                frame = self._backlog.popleft()
                self._queued_bytes -= len(frame)
                self._dispatch(frame)
        finally:
            self._admitting = False
        if self._inflight + len(self._backlog) < self._max_requests \
                and self._queued_bytes < self._max_queued_bytes:
            self._resume_reading()

    # --- requests ---------------------------------------------------------------------------
    def _dispatch(self, frame: bytes) -> None:
        listener = self.listener
        sasl = self.sasl
        if sasl is not None and sasl.state is SaslState.RAW_TOKENS:
            self._start_sasl(self._raw_token(sasl, frame), self._finish_raw)
            return
        try:
            req = decode_request(frame)
        except UnsupportedVersion as exc:
            if exc.api_key == ApiKey.API_VERSIONS:
                listener.metrics.kafka_requests.labels(api="api_versions").inc()
                self._write([api_versions_unsupported(exc.correlation_id)])
                return
            self.close(f"{_api_name(exc.api_key)} v{exc.api_version} is not served")
            return
        except KafkaDecodeError as exc:
            key = int.from_bytes(frame[:2], "big", signed=True) if len(frame) >= 2 else -1
            self.close(f"malformed {_api_name(key)} request: {exc}")
            return
        name = _api_name(req.api_key)
        if sasl is not None and not sasl.authenticated:
            if not sasl.allows(req.api_key):
                self.close(f"{name} before SASL authentication ({sasl.state.value})")
                return
            if req.api_key != ApiKey.API_VERSIONS:
                listener.metrics.kafka_requests.labels(api=name).inc()
                self._start_sasl(self._sasl_request(sasl, req),
                                 lambda value, exc: self._finish(req, name, value, exc))
                return
        handler = listener.handlers.get(req.api_key)
        if handler is None:
            self.close(f"{name} is not handled")
            return
        listener.metrics.kafka_requests.labels(api=name).inc()
        ctx = KafkaRequestContext(req.api_key, req.api_version, req.correlation_id,
                                  req.client_id, self.peer, self.id,
                                  None if sasl is None else f"User:{sasl.user}")
        self._inflight += 1
        self.requests += 1
        try:
            coro = handler(ctx, req.body)
            if coro.__class__ is not CoroutineType:
                coro = _await(coro)
            # First step inline (see remoting/_flow.py): many handlers never wait.
            yielded = coro.send(None)
        except StopIteration as stop:
            self._finish(req, name, stop.value, None)
            return
        except BaseException as exc:  # noqa: BLE001 - closes the connection in _finish
            self._finish(req, name, None, exc)
            return
        self._spawn(coro, yielded, lambda value, exc: self._finish(req, name, value, exc))

    # --- authentication (service/kafka/sasl.py) -------------------------------------------
    def _start_sasl(self, coro: Any, on_done: Any) -> None:
        """Run one authentication step as a request: in order, and finished even when the
        connection drops."""
        self._inflight += 1
        self.requests += 1
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            on_done(stop.value, None)
            return
        except BaseException as exc:  # noqa: BLE001 - closes the connection in on_done
            on_done(None, exc)
            return
        self._spawn(coro, yielded, on_done)

    async def _throttled(self) -> None:
        delay = self.listener.throttle.delay(self.peer.rpartition(":")[0])
        if delay > 0:
            await asyncio.sleep(delay)

    async def _sasl_request(self, sasl: SaslSession, req: KafkaRequest) -> dict:
        if req.api_key == ApiKey.SASL_HANDSHAKE:
            answer = sasl.handshake(req.api_version, req.body)
        else:
            await self._throttled()
            answer = sasl.authenticate(req.api_version, req.body)
        self._sasl_outcome(sasl)
        return answer

    async def _raw_token(self, sasl: SaslSession, frame: bytes) -> bytes | None:
        await self._throttled()
        try:
            reply: bytes | None = sasl.token(frame)
        except SaslFailure:
            reply = None  # a raw exchange has no way to say why: the connection closes
        self._sasl_outcome(sasl)
        return reply

    def _sasl_outcome(self, sasl: SaslSession) -> None:
        """Book a step's outcome: the frame limit rises once authenticated; a failure is
        counted against the address and logged at most once a minute per address."""
        address = self.peer.rpartition(":")[0]
        throttle = self.listener.throttle
        if sasl.authenticated:
            throttle.succeeded(address)
            self._framing.set_max_frame_size(self.listener.config.max_frame_size,
                                             "max_frame_size")
            log.debug("Kafka connection %d from %s authenticated as %r (%s)", self.id,
                     self.peer, sasl.user, sasl.mechanism)
        elif sasl.state is SaslState.FAILED and throttle.failed(address):
            log.warning("Kafka authentication failed from %s, user %r, mechanism %s: %s "
                        "(further failures from %s are not logged for a minute)", self.peer,
                        sasl.user, sasl.mechanism, sasl.failure, address)

    def _finish_raw(self, reply: bytes | None, exc: BaseException | None) -> None:
        """A raw token step ended: its reply goes out size-prefixed, as Kafka writes it."""
        self._inflight -= 1
        if exc is not None and not isinstance(exc, Exception | asyncio.CancelledError):
            raise exc
        if exc is None and reply is not None and not self._closed:
            self._write([len(reply).to_bytes(4, "big") + reply])
        if self.sasl is not None and self.sasl.state is SaslState.FAILED:
            self.close()
        elif exc is not None:
            self.close(f"SASL step failed: {exc!r}")
        if not self._closed:
            self._admit()

    def _finish(self, req: KafkaRequest, name: str, answer: dict | None,
                exc: BaseException | None) -> None:
        """A handler ended: write its answer (none for acks=0), or close on a failure; then
        start the next request."""
        self._inflight -= 1
        if exc is None:
            if answer is not None and not self._closed:
                try:
                    out = encode_response(req.api_key, req.api_version, req.correlation_id, answer)
                except Exception as enc_exc:
                    log.exception("encoding the Kafka %s v%d answer to %s failed", name,
                                  req.api_version, self.peer)
                    self.close(f"{name} answer not encodable: {enc_exc!r}", logged=True)
                else:
                    self._write([out])
        elif isinstance(exc, asyncio.CancelledError):
            pass  # the stop's grace ran out: the connection is closing
        elif isinstance(exc, Exception):
            self.handler_errors += 1
            log.error("Kafka %s v%d from %s failed", name, req.api_version, self.peer,
                      exc_info=exc)
            self.close(f"{name} handler failed: {exc!r}", logged=True)
        else:
            raise exc  # KeyboardInterrupt / SystemExit
        if self.sasl is not None and self.sasl.state is SaslState.FAILED:
            self.close()  # after the failure answer, as Kafka does
        if not self._closed:
            self._admit()

    def __repr__(self) -> str:
        return f"<KafkaConnection {self.id} {self.peer}{' closed' if self._closed else ''}>"


async def _await(awaitable: Any) -> Any:
    return await awaitable


class KafkaListener:
    """Listens on one socket and hands each Kafka request to the handler of its API key."""

    def __init__(self, config: BrokerConfig, handlers: dict[int, Handler],
                 metrics: BrokerMetrics, credentials: CredentialLookup | None = None,
                 tls: ServerTLS | None = None) -> None:
        self.config = config
        #: The broker's TLS (None with ``tls_mode=off``): the same certificate, modes and
        #: reload as the broker port.
        self.tls = tls
        self.handlers = {int(k): h for k, h in authenticated_handlers().items()}
        self.handlers.update((int(k), h) for k, h in handlers.items())
        self._mechanisms = config.kafka_sasl_mechanism_list()
        if self._mechanisms and credentials is None:
            raise ConfigError(f"kafka_sasl_mechanisms={config.kafka_sasl_mechanisms!r}: needs "
                              "users_file (the user store that 'txbroker user add' writes)")
        #: The users, and the cluster's own account for the other brokers (peer_auth.py).
        self._credentials = None if credentials is None else \
            ClusterAccount(credentials, config.cluster_secret)
        #: The key of made-up SCRAM salts while the user store has none (a store that has
        #: never had a password: no account to tell apart from an unknown name).
        self._fallback_salt_key = secrets.token_bytes(32)
        self.throttle = AuthThrottle()
        self.metrics = metrics
        self.connections: set[KafkaConnection] = set()
        #: Connections already lost whose handler still runs: the stop waits for them too.
        self.lingering: set[KafkaConnection] = set()
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.closing = False
        self._server: asyncio.AbstractServer | TLSListener | None = None
        self._ids = itertools.count(1)

    @property
    def sasl_required(self) -> bool:
        """Whether a client must authenticate before anything but ApiVersions."""
        return bool(self._mechanisms) and self._credentials is not None

    def new_sasl_session(self, *, tls: bool) -> SaslSession | None:
        """A new connection's authentication state; None when the port needs none.  PLAIN
        is allowed on a TLS connection, else only with ``kafka_sasl_plain_over_plaintext``."""
        if not self.sasl_required:
            return None
        assert self._credentials is not None
        # The salt key is looked up per connection: the store may get one while we run.
        return SaslSession(self._mechanisms, self._credentials,
                           self._credentials.salt_key() or self._fallback_salt_key,
                           tls or self.config.kafka_sasl_plain_over_plaintext)

    @property
    def tls_refusals(self) -> int:
        """Plaintext connections closed by an enforcing TLS port."""
        return self._server.refusals if isinstance(self._server, TLSListener) else 0

    @property
    def tls_failures(self) -> int:
        """Failed TLS handshakes."""
        return self._server.failures if isinstance(self._server, TLSListener) else 0

    async def start(self, sock: socket.socket) -> None:
        """Serve on ``sock`` (bound and listening), through a :class:`TLSListener` with TLS."""
        self.loop = asyncio.get_running_loop()

        def factory() -> KafkaConnection:
            return KafkaConnection(self, next(self._ids))

        if self.tls is None:
            self._server = await self.loop.create_server(factory, sock=sock, backlog=1024)
        else:
            self._server = TLSListener(self.tls, factory, what="Kafka port",
                                       max_pending=self.config.max_connections)
            self._server.start(sock)

    async def close(self, grace: float) -> None:
        """Stop accepting and reading; requests in progress get ``grace`` seconds to finish
        (their answers are written), then every connection closes: the remoting server's
        order (:meth:`ConnectionCore.shutdown` per connection)."""
        if self.closing:
            return
        self.closing = True
        if self._server is not None:
            self._server.close()
        conns = list(self.connections | self.lingering)
        for conn in conns:
            conn.stop_reading()  # at once, not when its shutdown task first runs
        await asyncio.gather(*(conn.shutdown(grace) for conn in conns))
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except TimeoutError:
                pass
