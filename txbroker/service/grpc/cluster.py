"""Routes across a cluster: every broker group's master, each at its own gRPC endpoint.

A 5.x client asks one endpoint for a topic's route and then talks to every endpoint the route
names, as it would to a set of proxies.  So in a cluster (``namesrv_addr`` set) QueryRoute
lists the queues of every broker group holding the topic, as the name servers route it, each
group's queues pointing at its master's gRPC endpoint.  A master publishes that endpoint in its
runtime info (GET_BROKER_RUNTIME_INFO ``grpcAddr``, as the Kafka view finds Kafka ports),
learned here per master address and kept :data:`ENDPOINT_TTL_S`: after a failover the name
servers list the new master, whose own endpoint is learned on first use.  A group whose master
publishes no gRPC endpoint (the port is off there) is left out of the route, and this broker's
own group is answered from what it knows itself while it is the master.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable

from txbroker.config import parse_address_list
from txbroker.remoting.bodies import KVTable, TopicRouteData
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.headers import GetRouteInfoRequestHeader
from txbroker.remoting.signing import SessionCredentials
from txbroker.service.grpc.route import endpoints, message_queues
from txbroker.service.topics import TopicConfig

log = logging.getLogger(__name__)

#: The runtime-info key under which a broker publishes its gRPC endpoint (``host:port``).
GRPC_ADDR_KEY = "grpcAddr"
#: How long a master's published endpoint is reused before it is asked again.
ENDPOINT_TTL_S = 30.0
REQUEST_TIMEOUT_S = 3.0


class ClusterRoutes:
    """QueryRoute's queues in a cluster (see the module docstring)."""

    def __init__(self, namesrv_addr: str, *, broker_name: str, here: Callable[[], pb.Endpoints],
                 is_master: Callable[[], bool], credentials: SessionCredentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._namesrvs = parse_address_list(namesrv_addr)
        self.broker_name = broker_name
        self.here = here
        self.is_master = is_master
        self.credentials = credentials
        self.tls = tls
        self._clients: dict[str, RemotingClient] = {}
        self._endpoint_of: dict[str, tuple[float, pb.Endpoints | None]] = {}

    async def queues(self, topic: str, local: TopicConfig | None,
                     namespace: str = "") -> list[pb.MessageQueue]:
        route = await self._route(topic)
        out: list[pb.MessageQueue] = []
        listed_here = False
        if route is not None:
            masters = {b.broker_name: b.master_addr() for b in route.broker_datas}
            for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
                if qd.broker_name == self.broker_name and self.is_master():
                    listed_here = True
                    here = self.here()
                else:
                    master = masters.get(qd.broker_name)
                    here = await self._endpoint(master) if master else None
                if here is None:
                    continue
                tc = TopicConfig(topic, qd.read_queue_nums, qd.write_queue_nums, qd.perm)
                out.extend(message_queues(tc, qd.broker_name, here, namespace))
        if local is not None and not listed_here and self.is_master():
            # Created here a moment ago: the name servers learn it with the next registration.
            out.extend(message_queues(local, self.broker_name, self.here(), namespace))
        return out

    async def _route(self, topic: str) -> TopicRouteData | None:
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                      GetRouteInfoRequestHeader(topic=topic).to_ext())
        for addr in self._namesrvs:
            try:
                resp = await self._client(addr).invoke(cmd, REQUEST_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                log.debug("route of %s from %s: %s", topic, addr, exc)
                continue
            if resp.code == ResponseCode.SUCCESS:
                return TopicRouteData.decode(resp.body)
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
        return None

    async def _endpoint(self, master: str) -> pb.Endpoints | None:
        known = self._endpoint_of.get(master)
        if known is not None and time.monotonic() - known[0] < ENDPOINT_TTL_S:
            return known[1]
        found = None
        try:
            resp = await self._client(master).invoke(
                RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), REQUEST_TIMEOUT_S)
            table = KVTable.decode(resp.body or b"{}").table if resp.code == ResponseCode.SUCCESS else {}
            host, _, port = table.get(GRPC_ADDR_KEY, "").rpartition(":")
            if host and port.isdigit():
                found = endpoints(host, int(port))
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("gRPC endpoint of %s: %s", master, exc)
        self._endpoint_of[master] = (time.monotonic(), found)
        return found

    def _client(self, addr: str) -> RemotingClient:
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = RemotingClient(
                addr, connect_timeout=REQUEST_TIMEOUT_S, credentials=self.credentials,
                ssl=self.tls)
        return client

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
