"""The name-server side of a client instance: which name server to ask, the cluster's brokers
and the route cache.

A client names one or more name servers (``"h1:p1;h2:p2"``); one connection is kept to the
first that answers and a failed call moves on to the next, as RocketMQ's clients do.  Routes
are cached per topic: the instance refreshes them every ``route_refresh_interval`` and on
demand after a failure, and a stale route is used while no name server answers.  Each broker
name (a group) maps to every address the name server lists for it, by broker id: id 0 is the
master, 1 and up its slaves.  Sends and END_TRANSACTION go to the master only (a group with no
master has no writable queue); pulls and offsets may use a slave while the master is away
(:meth:`NameServerClient.read_addr`, docs/cluster.md "Clients across several brokers").  The
instance opens the broker connections itself.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Collection
from dataclasses import dataclass, field

from txbroker.client.errors import (
    BrokerError,
    ClientError,
    RouteError,
    TopicNotFoundError,
)
from txbroker.client.rebalance import MessageQueue
from txbroker.config import parse_address_list
from txbroker.remoting.bodies import MASTER_ID, BodyError, ClusterInfo, TopicRouteData
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import PERM_READ, PERM_WRITE, GetRouteInfoRequestHeader
from txbroker.remoting.signing import SessionCredentials
from txbroker.store.record import DEFAULT_TOPIC


def parse_addresses(namesrv: str) -> list[str]:
    """``"h1:p1;h2:p2"`` (RocketMQ's separator; commas accepted too) → validated list; the
    ValueError says which address is wrong and how (not host:port, port out of range)."""
    if not isinstance(namesrv, str) or not namesrv.strip():
        raise ValueError("namesrv must be 'host:port' (several separated by ';')")
    out = parse_address_list(namesrv, "name-server address")
    if not out:
        raise ValueError("namesrv must be 'host:port' (several separated by ';')")
    return out


def pick_read_addr(addrs: dict[int, str], suggested_id: int = MASTER_ID,
                   avoid: Collection[str] = ()) -> str | None:
    """Where to read a group from: the suggested broker id if listed, else the master, else
    the lowest slave (reading from a slave while the master is down); None if none is listed.

    Addresses in ``avoid`` (a master whose connection just failed while the name server still
    lists it) are passed over while another address is listed.
    """
    usable = {i: a for i, a in addrs.items() if a not in avoid} or addrs
    addr = usable.get(suggested_id) or usable.get(MASTER_ID)
    if addr is None and usable:
        addr = usable[min(usable)]
    return addr


@dataclass
class TopicRoute:
    """A topic's queues and every address (by broker id) of each group holding them."""

    topic: str
    addrs: dict[str, dict[int, str]] = field(default_factory=dict)  # name -> {broker id: address}
    queues: list[tuple[str, int, int, int]] = field(default_factory=list)  # name, read, write, perm

    @property
    def brokers(self) -> dict[str, str]:
        """Broker name -> master address, for the groups that have a master now."""
        return {name: ids[MASTER_ID] for name, ids in self.addrs.items() if MASTER_ID in ids}

    @classmethod
    def parse(cls, topic: str, body: bytes) -> TopicRoute:
        """Read a GET_ROUTEINFO_BY_TOPIC body (standard JSON or fastjson's unquoted keys)."""
        try:
            data = TopicRouteData.decode(body)
        except BodyError as exc:
            raise ClientError(f"route of {topic}: {exc.remark}") from None
        route = cls(topic)
        for bd in data.broker_datas:
            if bd.broker_addrs:
                route.addrs[bd.broker_name] = dict(bd.broker_addrs)
        route.queues = [(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, qd.perm)
                        for qd in data.queue_datas]
        return route

    def write_queues(self) -> list[MessageQueue]:
        """Writable queues of the groups with a master (RocketMQ skips a master-less group)."""
        return sorted(MessageQueue(self.topic, name, q) for name, _r, w, perm in self.queues
                      if perm & PERM_WRITE and MASTER_ID in self.addrs.get(name, ()) for q in range(w))

    def read_queues(self) -> list[MessageQueue]:
        """Readable queues of every listed group, with or without a master."""
        return sorted(MessageQueue(self.topic, name, q) for name, r, _w, perm in self.queues
                      if perm & PERM_READ and self.addrs.get(name) for q in range(r))


class NameServerClient:
    """Name-server connection, broker addresses and routes for one client instance.
    Event-loop only."""

    def __init__(self, namesrv: str, *, request_timeout: float,
                 credentials: SessionCredentials | None,
                 ssl: ssl.SSLContext | None = None) -> None:
        self.addrs = parse_addresses(namesrv)
        self.ssl = ssl
        self.request_timeout = request_timeout
        self.credentials = credentials
        self._ns: RemotingClient | None = None
        self._index = 0
        #: topic -> its last route
        self.routes: dict[str, TopicRoute] = {}
        #: broker name -> {broker id: address}, as last listed (a route or the cluster info)
        self.groups: dict[str, dict[int, str]] = {}
        #: cluster name -> its broker names (from the last cluster info)
        self.clusters: dict[str, list[str]] = {}

    async def connect(self) -> RemotingClient:
        """The name-server connection, opened on the first configured address that answers."""
        if self._ns is not None and not getattr(self._ns, "closed", False):
            return self._ns
        errors = []
        last: BaseException | None = None
        for i in range(len(self.addrs)):
            addr = self.addrs[(self._index + i) % len(self.addrs)]
            client = RemotingClient(addr, connect_timeout=self.request_timeout,
                                    credentials=self.credentials, ssl=self.ssl)
            try:
                await client.connect()
            except (OSError, TimeoutError) as exc:
                errors.append(f"{addr}: {exc or type(exc).__name__}")
                last = exc
                with contextlib.suppress(Exception):
                    await client.close()
                continue
            self._index = (self._index + i) % len(self.addrs)
            self._ns = client
            return client
        # Chained, so a caller can tell a refused connection (nothing listening) from a time-out.
        raise RouteError("cannot connect to the name server (" + "; ".join(errors) + ")") from last

    async def invoke(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        ns = await self.connect()
        try:
            return await ns.invoke(cmd, timeout or self.request_timeout)
        except (OSError, ConnectionError, TimeoutError):
            # Next call reconnects, possibly to the next configured name server.
            self._ns = None
            self._index += 1
            with contextlib.suppress(Exception):
                await ns.close()
            raise

    @property
    def broker_addrs(self) -> dict[str, str]:
        """Broker name -> master address, for the groups that have a master now."""
        return {name: ids[MASTER_ID] for name, ids in self.groups.items() if MASTER_ID in ids}

    def all_addrs(self) -> set[str]:
        """Every known address, masters and slaves."""
        return {addr for ids in self.groups.values() for addr in ids.values()}

    async def refresh_cluster(self) -> dict[str, str]:
        """Learn every broker group (all its addresses) and cluster from the name server;
        returns broker name -> master address."""
        resp = await self.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError("cluster info", resp.code, resp.remark, self.addr)
        try:
            info = ClusterInfo.decode(resp.body)
        except BodyError as exc:
            raise ClientError(f"cluster info: {exc.remark}") from None
        for name, bd in info.broker_addr_table.items():
            self.groups[name] = dict(bd.broker_addrs)
        self.clusters = {name: sorted(names) for name, names in info.cluster_addr_table.items()}
        return self.broker_addrs

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        cached = self.routes.get(topic)
        if cached is not None and not refresh:
            return cached
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(
            topic=topic, accept_standard_json_only=True).to_ext())
        try:
            resp = await self.invoke(cmd)
        except (OSError, TimeoutError, RouteError) as exc:
            if cached is not None:
                return cached  # a stale route beats none while the name server is away
            if isinstance(exc, RouteError):
                raise
            raise RouteError(f"no route for topic {topic!r}: name server unreachable: "
                             f"{exc or type(exc).__name__}") from exc
        if resp.code != ResponseCode.SUCCESS:
            self.routes.pop(topic, None)
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                raise TopicNotFoundError(topic, self.addr)
            raise RouteError(f"no route for topic {topic!r}: name server answered "
                             f"{resp.code}: {resp.remark or ''}".rstrip(": "))
        route = TopicRoute.parse(topic, resp.body)
        self.routes[topic] = route
        # A group's listing replaces the old one: after a failover the old master is gone.
        self.groups.update({name: dict(ids) for name, ids in route.addrs.items()})
        return route

    async def publish_route(self, topic: str, queue_nums: int, *, refresh: bool = False) -> TopicRoute:
        """The route a producer sends ``topic`` on.

        A topic that does not exist yet gets the queues of the template topic TBW102, capped
        at ``queue_nums``, as RocketMQ's producers do: the name server answers that route only
        while the broker auto-creates topics, and the broker creates the topic on the first
        send.  Such a route is not cached, so the topic's own route is used once it exists.
        """
        try:
            return await self.route(topic, refresh=refresh)
        except TopicNotFoundError as missing:
            try:
                template = await self.route(DEFAULT_TOPIC, refresh=refresh)
            except TopicNotFoundError:
                raise missing from None  # no auto-creation: the topic must be created first
        return TopicRoute(topic, {name: dict(ids) for name, ids in template.addrs.items()},
                          [(name, min(r, queue_nums), min(w, queue_nums), perm)
                           for name, r, w, perm in template.queues])

    @property
    def addr(self) -> str:
        """The name server in use (or tried next), for error messages."""
        return self.addrs[self._index % len(self.addrs)]

    async def refresh_routes(self) -> None:
        """Look every cached route up again (the instance does every ``route_refresh_interval``)."""
        for topic in list(self.routes):
            with contextlib.suppress(ClientError):
                await self.route(topic, refresh=True)

    def broker_addr(self, broker_name: str) -> str:
        """The master of ``broker_name`` now (sends, END_TRANSACTION, topic changes)."""
        ids = self.groups.get(broker_name)
        if ids is None:
            raise RouteError(f"broker {broker_name!r} is not known to the name server {self.addr}")
        addr = ids.get(MASTER_ID)
        if addr is None:
            raise RouteError(f"broker {broker_name!r} has no master now (name server {self.addr})")
        return addr

    def read_addr(self, broker_name: str, suggested_id: int = MASTER_ID,
                  avoid: Collection[str] = ()) -> str:
        """Where to pull ``broker_name``'s queues: ``suggested_id`` if listed, else the
        master, else the lowest slave, passing over ``avoid`` (see :func:`pick_read_addr`)."""
        addr = pick_read_addr(self.groups.get(broker_name) or {}, suggested_id, avoid)
        if addr is None:
            raise RouteError(f"broker {broker_name!r} is not known to the name server {self.addr}")
        return addr

    def is_master(self, broker_name: str, addr: str) -> bool:
        return (self.groups.get(broker_name) or {}).get(MASTER_ID) == addr

    def offset_addrs(self, broker_name: str) -> list[str]:
        """Where ``broker_name``'s consumer offsets are committed and queried, in order of
        preference: the master, then the slaves by id (RocketMQ: master first, any entry on
        retry), so offsets keep moving while the master is away."""
        ids = self.groups.get(broker_name) or {}
        if not ids:
            raise RouteError(f"broker {broker_name!r} is not known to the name server {self.addr}")
        return [ids[i] for i in sorted(ids)]

    async def close(self) -> None:
        if self._ns is not None:
            with contextlib.suppress(Exception):
                await self._ns.close()
        self._ns = None
