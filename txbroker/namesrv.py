"""The standalone name server's composition root (``txbroker namesrv``): one listener, the
route tables of :class:`~txbroker.cluster.routeinfo.RouteInfoManager`, and the scan that drops
silent brokers.

Name servers are independent of each other, as in RocketMQ: each learns the cluster only from
the brokers' REGISTER_BROKER requests, so a broker registers with every one of them and a client
may ask any.  A broker is dropped when the connection it registered over closes or when it has
been silent for ``broker_expiry`` seconds (checked every ``scan_interval``).  Requests other
than the name server's own are answered REQUEST_CODE_NOT_SUPPORTED by the remoting server (a
Java client sends END_TRANSACTION here when a group has no master; it must not crash anything).

With ``cluster_secret`` set, the requests that change what this name server answers
(:data:`BROKER_CODES`) must come in the cluster envelope, as the controller's do
(:mod:`txbroker.service.cluster_auth`): signed over their named fields and body, fresh, and
never seen before; anything else is refused NO_PERMISSION before a handler sees it, so a peer
without the secret cannot rewrite routes, and a recorded registration cannot keep a dead
broker listed.  Their answers (a slave learns its master's address from one) are signed over
the request's nonce.  Without a secret every
registration is accepted, signed or not (RocketMQ's name server has no authentication, and a
cluster's brokers may carry a secret for the controller only).
With ``tls`` (``txbroker namesrv --tls-mode ...``) the port speaks TLS as a broker's does:
permissive or enforcing, a client certificate none, optional or required.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Self

import orjson

from txbroker.broker import bind_listener
from txbroker.cluster.routeinfo import DEFAULT_BROKER_EXPIRY, RouteInfoManager
from txbroker.config import MIN_SECRET_LENGTH, BrokerConfig
from txbroker.remoting.bodies import (
    VERSION_REGISTER_BODY,
    DataVersion,
    RegisterBrokerBody,
    TopicConfigSerializeWrapper,
    body_crc32,
    wants_standard_json,
)
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import (
    GetRouteInfoRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from txbroker.remoting.server import Connection, RemotingServer
from txbroker.remoting.tls import ServerTLS
from txbroker.service.cluster_auth import ClusterGuard

log = logging.getLogger(__name__)

#: RocketMQ scans every 10 s for a 120 s expiry; a shorter expiry is scanned proportionally.
MAX_SCAN_INTERVAL = 5.0
#: The codes of RocketMQ's ``DefaultRequestProcessor`` served here that change state: a
#: registration, its removal, and QUERY_DATA_VERSION (an unchanged answer keeps a broker
#: alive).  Signed when a cluster secret is set; the read codes stay open to clients.
BROKER_CODES = frozenset({RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER,
                          RequestCode.QUERY_DATA_VERSION})


class NameServerProcess:
    """A name server listening on ``listen_host:port`` (port 0 = ephemeral)."""

    def __init__(self, *, listen_host: str = "127.0.0.1", port: int = 9876,
                 broker_expiry: float = DEFAULT_BROKER_EXPIRY, scan_interval: float | None = None,
                 clock: Callable[[], float] = time.time,
                 cluster_secret: str | None = None, tls: ServerTLS | None = None) -> None:
        if broker_expiry <= 0:
            raise ValueError(f"broker_expiry={broker_expiry!r}: must be > 0")
        if cluster_secret is not None and len(cluster_secret) < MIN_SECRET_LENGTH:
            raise ValueError(f"cluster_secret must be at least {MIN_SECRET_LENGTH} characters")
        self.listen_host = listen_host
        self.port = port
        self.broker_expiry = broker_expiry
        self.scan_interval = scan_interval or min(MAX_SCAN_INTERVAL, broker_expiry / 4)
        self.routes = RouteInfoManager(clock=clock, expiry=broker_expiry)
        #: Refuses unsigned registrations when a secret is set (None: none is checked).
        self.guard = (ClusterGuard(cluster_secret, BROKER_CODES)
                      if cluster_secret is not None else None)
        # The remoting limits (frame size, connections) are the broker's defaults.
        self.server = RemotingServer(BrokerConfig(listen_host=listen_host), tls=tls,
                                     what="name-server port", before_request=self.guard)
        self._scan: asyncio.Task | None = None

    @property
    def addr(self) -> str:
        host = "127.0.0.1" if self.listen_host in ("", "0.0.0.0", "::") else self.listen_host
        return f"{host}:{self.port}"

    def handlers(self) -> dict[int, Callable]:
        return {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_topic_list,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.BROKERS_DOWN: self.brokers_down,
        }

    async def start(self) -> None:
        """Bind (a clash raises :class:`~txbroker.broker.ListenError` naming the address),
        then serve."""
        sock = bind_listener(self.listen_host, self.port, "name-server port")
        for code, handler in self.handlers().items():
            if self.guard is not None and code in BROKER_CODES:
                handler = self.guard.signed(handler)
            self.server.register(int(code), handler)
        self.server.on_disconnect(self.routes.on_connection_closed)
        self.port = await self.server.start(self.listen_host, self.port, sock=sock)
        self._scan = asyncio.create_task(self._scan_loop(), name="txbroker-namesrv-scan")
        log.info("name server listening on %s (brokers expire after %g s of silence)",
                 self.addr, self.broker_expiry)

    async def stop(self) -> None:
        if self._scan is not None:
            self._scan.cancel()
            self._scan = None
        await self.server.close(1.0)

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval)
            self.scan()

    def scan(self) -> None:
        """Drop brokers silent past the expiry and close their connections."""
        for channel in self.routes.expire():
            if isinstance(channel, Connection):
                channel.close()

    # --- handlers -----------------------------------------------------------------------
    async def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = RegisterBrokerRequestHeader.from_ext(cmd.ext_fields)
        if h.body_crc32 != 0 and body_crc32(cmd.body) != h.body_crc32:
            raise Refusal(ResponseCode.SYSTEM_ERROR,
                          f"crc32 not match: broker {h.broker_addr} sent bodyCrc32="
                          f"{h.body_crc32}, the body's is {body_crc32(cmd.body)}")
        if not cmd.body:
            wrapper = TopicConfigSerializeWrapper()
        elif cmd.version >= VERSION_REGISTER_BODY:
            wrapper = RegisterBrokerBody.decode(cmd.body, compressed=h.compressed,
                                                limit=self.server.config.max_frame_size
                                                ).topic_config_wrapper
        else:
            wrapper = TopicConfigSerializeWrapper.decode(cmd.body)
        result = self.routes.register(h.cluster_name, h.broker_addr, h.broker_name, h.broker_id,
                                      h.ha_server_addr, wrapper, conn)
        answer = RegisterBrokerResponseHeader(ha_server_addr=result.ha_server_addr,
                                              master_addr=result.master_addr)
        return cmd.response(ResponseCode.SUCCESS, ext=answer.to_ext())

    async def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = UnRegisterBrokerRequestHeader.from_ext(cmd.ext_fields)
        self.routes.unregister(h.cluster_name, h.broker_addr, h.broker_name, h.broker_id)
        return cmd.response(ResponseCode.SUCCESS)

    async def query_data_version(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryDataVersionRequestHeader.from_ext(cmd.ext_fields)
        changed = self.routes.is_topic_config_changed(h.broker_addr, DataVersion.decode(cmd.body))
        if not changed:
            self.routes.touch(h.broker_addr)
        stored = self.routes.data_version(h.broker_addr)
        return cmd.response(ResponseCode.SUCCESS,
                            ext=QueryDataVersionResponseHeader(changed=changed).to_ext(),
                            body=stored.encode() if stored is not None else b"")

    async def get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetRouteInfoRequestHeader.from_ext(cmd.ext_fields)
        data = self.routes.pickup_route(h.topic)
        if data is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST,
                          f"No topic route info in name server for the topic: {h.topic}")
        standard = wants_standard_json(cmd.version, h.accept_standard_json_only)
        return cmd.response(ResponseCode.SUCCESS, body=data.encode(standard_json=standard))

    async def get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        # Standard JSON (quoted broker ids), as the embedded name server answers: every client
        # version reads it.
        body = self.routes.cluster_info().encode(standard_json=True)
        return cmd.response(ResponseCode.SUCCESS, body=body)

    async def get_topic_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS,
                            body=orjson.dumps({"topicList": self.routes.topic_list()}))

    async def brokers_down(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """txbroker's own: the brokers this name server dropped and not seen since, so
        ``txbroker status`` can list a dead member of a group as down."""
        body = orjson.dumps([d.to_json() for d in self.routes.brokers_down()])
        return cmd.response(ResponseCode.SUCCESS, body=body)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
