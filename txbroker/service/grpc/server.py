"""The gRPC endpoint: a ``grpc.aio`` server on the broker's own event loop serving
``apache.rocketmq.v2.MessagingService`` (docs/grpc.md).

The server shares the loop with the remoting and Kafka listeners, so its handlers call the
store and the services directly, as theirs do.  Each RPC is a thin method here that reads the
call's metadata and hands the request to the handler object owning that part (sessions,
routes, sends, transactions, consumption, recall), once access control (``auth.py``, with
``acl_file`` set) admitted the call; a refusal (:class:`GrpcError`) becomes the
response's ``status``, which is where 5.x clients look, and anything unexpected is logged and
answered INTERNAL_ERROR.  RPCs no handler serves (PullMessage, offsets, lite topics) keep the
generated servicer's UNIMPLEMENTED.

Listening follows the broker's order (broker.py): :meth:`GrpcServer.bind` binds the port with
the other listeners, before the store opens, so a clash stops the start with the address;
:meth:`GrpcServer.start` starts serving once every service exists; :meth:`GrpcServer.stop`
stops taking calls, lets running ones finish within the grace, and closes open streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import grpc

from txbroker.config import BrokerConfig
from txbroker.remoting.errors import Refusal
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.grpc import service_pb2_grpc as rpc
from txbroker.service.grpc import messages, settings
from txbroker.service.grpc.auth import GrpcAuth
from txbroker.service.grpc.cluster import ClusterRoutes
from txbroker.service.grpc.route import message_queues
from txbroker.service.grpc.send import SendHandlers
from txbroker.service.grpc.sessions import Sessions, TelemetryChannel
from txbroker.service.grpc.status import Code, GrpcError, status
from txbroker.service.grpc.transactions import TransactionHandlers
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.topics import TopicManager
from txbroker.store.record import Host

log = logging.getLogger(__name__)

CLIENT_ID_HEADER = "x-mq-client-id"
#: A settings answer is sent again this much later on the same stream: the Node.js client
#: (rocketmq-client-nodejs 1.0.8) starts listening for it only once every topic it was given
#: has its route, and one it missed left its start-up waiting for its next settings sync, 5
#: minutes on.  Every client takes a repeated answer as the same settings again.
SETTINGS_REPEAT_S = 1.0
#: Concurrent streams one client connection may open (Telemetry and long-polling receives
#: stay open: a client holds a few).
MAX_CONCURRENT_STREAMS = 256


class BindError(OSError):
    """The gRPC port could not be bound (the message names the address)."""


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def client_id(context: grpc.aio.ServicerContext, *, required: bool = True) -> str:
    cid = metadata(context).get(CLIENT_ID_HEADER, "")
    if required and not cid:
        raise GrpcError(Code.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_HEADER} header is missing")
    return cid


def peer_host(context: grpc.aio.ServicerContext) -> Host:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` -> (host, port); ("0.0.0.0", 0) otherwise."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not port.isdigit():
        return ("0.0.0.0", 0)
    return (host.strip("[]"), int(port))


def answers(response_type: type) -> Callable:
    """A unary RPC method, admitted by the servicer's ``auth`` first (when access control is
    on), whose refusals become ``response_type(status=...)``."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        async def method(self, request, context):
            try:
                await self._admit(fn.__name__, request, context)
                response = await fn(self, request, context)
            except GrpcError as exc:
                response = response_type(status=status(exc.code, exc.message))
            except Exception:
                log.exception("gRPC %s failed", fn.__name__)
                response = response_type(status=status(Code.INTERNAL_ERROR,
                                                       f"{fn.__name__} failed in the broker"))
            if self.metrics is not None:
                self.metrics.grpc_requests.labels(
                    rpc=fn.__name__, code=pb.Code.Name(response.status.code)).inc()
            return response
        return method
    return wrap


class MessagingServicer(rpc.MessagingServiceServicer):
    """The RPCs, each handed to the object that serves it (see the module docstring)."""

    def __init__(self, config: BrokerConfig, *, broker_name: str, here: Callable[[], pb.Endpoints],
                 topics: TopicManager, sessions: Sessions, send: SendHandlers,
                 transactions: TransactionHandlers, consume: Any = None,
                 recall: Any = None, cluster: ClusterRoutes | None = None,
                 metrics: BrokerMetrics | None = None, auth: GrpcAuth | None = None) -> None:
        self.config = config
        self.broker_name = broker_name
        self.here = here
        self.topics = topics
        self.sessions = sessions
        self.send = send
        self.transactions = transactions
        self.consume = consume
        self.recall = recall
        #: Routes across broker groups (None on a single broker).
        self.cluster = cluster
        self.metrics = metrics
        #: Signed calls checked against the broker's access keys (None: access control off).
        self.auth = auth
        self.store_host = ""

    def to_pb(self, stored, **kw) -> pb.Message:
        return messages.to_pb(stored, store_host=self.store_host, **kw)

    # --- clients ----------------------------------------------------------------------------
    @answers(spb.QueryRouteResponse)
    async def QueryRoute(self, request, context):
        name, namespace = request.topic.name, request.topic.resource_namespace
        tc = self.topics.get(name)
        if self.cluster is None:
            tc = tc or await self._create(name)
            queues = message_queues(tc, self.broker_name, self.here(), namespace)
        else:
            queues = await self.cluster.queues(name, tc, namespace)
            if not queues and tc is None and self.cluster.is_master():
                queues = await self.cluster.queues(name, await self._create(name), namespace)
            if not queues:
                raise GrpcError(Code.TOPIC_NOT_FOUND,
                                f"topic {name!r} has no queue on a master serving gRPC")
        return spb.QueryRouteResponse(status=status(), message_queues=queues)

    async def _create(self, name: str):
        try:
            return await self.topics.get_or_create(name)
        except Refusal as exc:  # not a topic name, or auto-create off
            raise GrpcError(Code.TOPIC_NOT_FOUND, f"topic {name!r}: {exc.remark}") from None

    @answers(spb.HeartbeatResponse)
    async def Heartbeat(self, request, context):
        self.sessions.touch(client_id(context))
        return spb.HeartbeatResponse(status=status())

    @answers(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request, context):
        self.sessions.terminate(client_id(context))
        return spb.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator, context):
        """Settings in, settings and commands out, until either side closes."""
        try:
            await self._admit("Telemetry", spb.TelemetryCommand(), context)
            cid = client_id(context)
        except GrpcError as exc:
            yield spb.TelemetryCommand(status=status(exc.code, exc.message))
            return
        channel = self.sessions.open_channel(cid, context.peer() or "?", self.to_pb)
        reader = asyncio.create_task(self._read_telemetry(request_iterator, channel, context),
                                     name=f"grpc-telemetry-{cid}")
        try:
            async for command in channel.outgoing():
                yield command
        finally:
            reader.cancel()
            self.sessions.close_channel(channel)

    async def _admit(self, rpc: str, request, context: grpc.aio.ServicerContext) -> None:
        """Return if the call may run, else raise its refusal (``service/grpc/auth.py``)."""
        if self.auth is not None:
            await self.auth.admit(rpc, request, metadata(context), context.peer() or "?",
                                  peer_host(context)[0])

    async def _read_telemetry(self, requests, channel: TelemetryChannel,
                              context: grpc.aio.ServicerContext) -> None:
        try:
            async for command in requests:
                kind = command.WhichOneof("command")
                if kind == "settings":
                    try:  # the topics it publishes to, the group and topics it consumes
                        await self._admit("Telemetry", command.settings, context)
                    except GrpcError as exc:  # answered, then the stream ends
                        with contextlib.suppress(RuntimeError):
                            channel.send(spb.TelemetryCommand(status=status(exc.code, exc.message)))
                        break
                    self.sessions.settings_received(channel, command.settings)
                    answer = spb.TelemetryCommand(
                        status=status(), settings=self._settings_for(command.settings))
                    try:
                        channel.send(answer)
                    except RuntimeError:  # the client does not read its stream: ended
                        break
                    channel.send_later(SETTINGS_REPEAT_S, answer)
                # thread stack traces and verify results answer commands never sent
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        except Exception:
            log.exception("telemetry stream of %s failed", channel.session.client_id)
        finally:
            channel.close()

    def _settings_for(self, sent: pb.Settings) -> pb.Settings:
        fifo = False
        if self.consume is not None and sent.HasField("subscription"):
            fifo = self.consume.is_fifo_group(sent.subscription.group.name)
        return settings.answer(self.config, sent, fifo=fifo)

    # --- producers --------------------------------------------------------------------------
    @answers(spb.SendMessageResponse)
    async def SendMessage(self, request, context):
        return await self.send.send(request, client_id(context), peer_host(context))

    @answers(spb.EndTransactionResponse)
    async def EndTransaction(self, request, context):
        return await self.transactions.end(request)

    @answers(spb.RecallMessageResponse)
    async def RecallMessage(self, request, context):
        if self.recall is None:
            raise GrpcError(Code.NOT_IMPLEMENTED, "RecallMessage needs the timer service")
        return await self.recall.recall(request, context)

    # --- consumers (txbroker/service/grpc/consume.py) ----------------------------------------
    def _consume(self):
        if self.consume is None:
            raise GrpcError(Code.NOT_IMPLEMENTED, "POP consumption is not served by this broker")
        return self.consume

    @answers(spb.QueryAssignmentResponse)
    async def QueryAssignment(self, request, context):
        return await self._consume().QueryAssignment(request, context)

    async def ReceiveMessage(self, request, context):
        try:
            await self._admit("ReceiveMessage", request, context)
        except GrpcError as exc:
            yield spb.ReceiveMessageResponse(status=status(exc.code, exc.message))
            return
        if self.consume is None:
            yield spb.ReceiveMessageResponse(
                status=status(Code.NOT_IMPLEMENTED, "POP consumption is not served by this broker"))
            return
        async for response in self.consume.ReceiveMessage(request, context):
            yield response

    @answers(spb.AckMessageResponse)
    async def AckMessage(self, request, context):
        return await self._consume().AckMessage(request, context)

    @answers(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request, context):
        return await self._consume().ChangeInvisibleDuration(request, context)

    @answers(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request, context):
        return await self._consume().ForwardMessageToDeadLetterQueue(request, context)


class GrpcServer:
    """The listener: bound early, started last, stopped in mirror order (module docstring)."""

    def __init__(self, config: BrokerConfig, tls=None) -> None:
        self.config = config
        self.tls = tls
        self.port = -1
        self._server: grpc.aio.Server | None = None
        self.servicer: MessagingServicer | None = None

    def bind(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0: ephemeral); returns the bound port."""
        cfg = self.config
        limit = max(cfg.max_frame_size, settings.max_body_size(cfg) + 64 * 1024)
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ])
        shown = f"[{host}]" if ":" in host else host
        address = f"{shown}:{port}"
        try:
            if self.tls is not None:
                bound = self._server.add_secure_port(address, self._credentials())
            else:
                bound = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise BindError(f"cannot listen on {address} (gRPC port): {exc}") from None
        if not bound:
            raise BindError(f"cannot listen on {address} (gRPC port): address in use or "
                            "not available")
        self.port = bound
        return bound

    def _credentials(self) -> grpc.ServerCredentials:
        """The broker's certificate, and the CA client certificates are checked against; read
        again at the next handshake after a file changes, so a renewed certificate reaches the
        gRPC port as it reaches the others."""
        cfg = self.config
        files = [cfg.tls_cert, cfg.tls_key]
        ca_file = cfg.tls_ca if cfg.tls_ca and cfg.tls_client_auth != "none" else None
        if ca_file:
            files.append(ca_file)

        def stamp() -> tuple[float, ...]:
            return tuple(os.stat(f).st_mtime_ns for f in files)

        def configuration() -> grpc.ServerCertificateConfiguration:
            with open(cfg.tls_key, "rb") as f:
                key = f.read()
            with open(cfg.tls_cert, "rb") as f:
                cert = f.read()
            ca = None
            if ca_file:
                with open(ca_file, "rb") as f:
                    ca = f.read()
            return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

        seen = [stamp()]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            try:
                now = stamp()
                if now == seen[0]:
                    return None
                renewed = configuration()
            except OSError as exc:  # mid-rotation: keep serving the certificate loaded
                log.warning("gRPC port: TLS files not reloaded: %s", exc)
                return None
            seen[0] = now
            log.info("gRPC port: TLS certificate reloaded from %s", cfg.tls_cert)
            return renewed

        return grpc.dynamic_ssl_server_credentials(
            configuration(), fetch,
            require_client_authentication=cfg.tls_client_auth == "required")

    async def start(self, servicer: MessagingServicer) -> None:
        assert self._server is not None
        self.servicer = servicer
        rpc.add_MessagingServiceServicer_to_server(servicer, self._server)
        await self._server.start()

    async def stop(self, grace: float) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        if self.servicer is not None:  # open Telemetry streams end now, not after the grace
            self.servicer.sessions.close_all()
        await server.stop(grace)
        if self.servicer is not None and self.servicer.cluster is not None:
            await self.servicer.cluster.close()
