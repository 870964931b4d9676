"""What every producer and consumer needs underneath: a client id, routes, broker connections
and heartbeats.

Mirrors RocketMQ's ``MQClientInstance`` with the parts that matter for correctness kept and the
timing fixed where the C++ client gets it wrong (docs/protocol.md §8.7):

* at start the instance asks the name server for the cluster and heartbeats every broker
  *before* the first send, so a transactional producer's group is known to the broker before
  any half message exists (a check-back needs a live connection of the group);
* a connection to a broker is heartbeated as soon as it is opened, and every
  ``heartbeat_interval`` (30 s, RocketMQ's default) afterwards;
* a dropped broker connection is reopened and heartbeated at once, with back-off, not at the
  next heartbeat: a restarted broker knows no connection of a producer group until then, so a
  RocketMQ client leaves its check-backs unanswerable for up to 30 s after a broker restart;
* routes are cached (``namesrv.py``) and refreshed every ``route_refresh_interval`` (30 s)
  and on demand after a failure;
* broker-initiated requests (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED) are handed to
  the owning producer or consumer, which must not block the connection's read path;
* a broker that cannot be reached is reported once when its connection is lost and once when
  it answers again (``reachability.py``), however many requests retry in between.

One instance belongs to one :class:`Producer`, :class:`TransactionProducer` or
:class:`Consumer`, so each has its own client id: two consumers of one group in one process
are two members, as they would be in two processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable

from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.namesrv import NameServerClient
from txbroker.client.reachability import Reachability, is_connection_loss
from txbroker.remoting.bodies import ConsumerData, HeartbeatData, ProducerData
from txbroker.remoting.client import Encoded, RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import UnregisterClientRequestHeader
from txbroker.remoting.signing import SessionCredentials, credentials
from txbroker.remoting.tls import ClientTLS, client_context

log = logging.getLogger(__name__)

DEFAULT_NAMESRV = "127.0.0.1:9876"
#: First wait before reopening a dropped broker connection (doubles up to the heartbeat interval).
REJOIN_DELAY_MIN = 0.1

#: A handler for a broker-initiated request: (broker address, command).
ServerRequestHandler = Callable[[str, RemotingCommand], Awaitable[None] | None]


class ClientInstance:
    """Connections, routes and heartbeats for one client id.  Event-loop only."""

    def __init__(self, namesrv: str = DEFAULT_NAMESRV, *, request_timeout: float = 3.0,
                 heartbeat_interval: float = 30.0, route_refresh_interval: float = 30.0,
                 instance_name: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None,
                 tls: ClientTLS | ssl.SSLContext | None = None) -> None:
        #: TLS for every connection, name servers and brokers alike (None: plaintext).  Built
        #: here, so a CA or certificate file that cannot be loaded fails the constructor.
        self.ssl = client_context(tls)
        #: Signs every request to name servers and brokers (brokers with ACL require it).
        self.credentials: SessionCredentials | None = credentials(access_key, secret_key)
        if request_timeout <= 0 or heartbeat_interval <= 0 or route_refresh_interval <= 0:
            raise ValueError("timeouts and intervals must be positive")
        #: Routes and broker addresses (``namesrv.route(topic)``, ``namesrv.broker_addr(name)``).
        self.namesrv = NameServerClient(namesrv, request_timeout=request_timeout,
                                        credentials=self.credentials, ssl=self.ssl)
        self.request_timeout = request_timeout
        self.heartbeat_interval = heartbeat_interval
        self.route_refresh_interval = route_refresh_interval
        #: Our address as the name server sees it (set at start; loopback until then).
        self.ip = "127.0.0.1"
        self._instance_name = instance_name or f"{os.getpid()}-{secrets.token_hex(3)}"
        #: RocketMQ's ``ip@instanceName``; one per Producer/Consumer object.
        self.client_id = f"{self.ip}@{self._instance_name}"
        self.producer_groups: set[str] = set()
        #: consumer group -> callable returning its ConsumerData for heartbeats.
        self.consumer_data: dict[str, Callable[[], ConsumerData]] = {}
        self._handlers: dict[int, ServerRequestHandler] = {}
        self._conns: dict[str, RemotingClient] = {}
        #: RemotingClient.reconnects last seen per address: a silent reconnect means the
        #: broker forgot our heartbeat (and with it where to send check-backs).
        self._reconnects: dict[str, int] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        #: Addresses whose dropped connection is being reopened (one task each).
        self._rejoining: set[str] = set()
        #: Broker addresses unreachable now; callers ask ``is_down`` to keep quiet meanwhile.
        self.reachability = Reachability()
        self._started = False
        self._closed = False

    # --- lifecycle -----------------------------------------------------------------------
    def on_request(self, code: int, handler: ServerRequestHandler) -> None:
        """Route broker-initiated requests of ``code`` to ``handler`` (set before start)."""
        self._handlers[int(code)] = handler

    async def start(self) -> None:
        if self._started:
            return
        ns = await self.namesrv.connect()
        local = ns.local_addr
        if local and isinstance(local[0], str) and local[0].count(".") == 3:
            self.ip = local[0]
            self.client_id = f"{self.ip}@{self._instance_name}"
        await self.namesrv.refresh_cluster()
        await self.heartbeat_all()
        self._started = True
        self._tasks = [
            asyncio.create_task(self._every(self.heartbeat_interval, self.heartbeat_all),
                                name=f"txbroker-heartbeat-{self.client_id}"),
            asyncio.create_task(self._every(self.route_refresh_interval, self.namesrv.refresh_routes),
                                name=f"txbroker-routes-{self.client_id}"),
        ]

    async def shutdown(self) -> None:
        """Unregister every group from every broker, then close the connections."""
        if self._closed:
            return
        self._closed = True
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        headers = [UnregisterClientRequestHeader(client_id=self.client_id, producer_group=g)
                   for g in sorted(self.producer_groups)]
        headers += [UnregisterClientRequestHeader(client_id=self.client_id, consumer_group=g)
                    for g in sorted(self.consumer_data)]
        for addr in list(self._conns):
            for header in headers:
                group = header.producer_group or header.consumer_group
                cmd = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, header.to_ext())
                try:
                    await self._conns[addr].invoke(cmd, self.request_timeout)
                except (ClientError, OSError, TimeoutError) as exc:  # shutdown goes on: the broker expires us anyway
                    log.debug("unregister %s from %s failed: %s", group, addr, exc)
        await self._close_connections()

    async def abort_start(self) -> None:
        """Undo a failed start (tasks stopped, connections closed) so start() may run again;
        the broker forgets our heartbeats when the connections close."""
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._started = False
        await self._close_connections()

    async def _close_connections(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(Exception):
                await conn.close()
        self._conns.clear()
        await self.namesrv.close()

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except (ClientError, OSError, TimeoutError) as exc:
                log.warning("%s: periodic %s failed: %s", self.client_id, fn.__name__, exc)

    # --- brokers -------------------------------------------------------------------------
    def connected(self, addr: str) -> bool:
        """Whether a connection to ``addr`` is open now (no await needed to use it)."""
        conn = self._conns.get(addr)
        return conn is not None and not getattr(conn, "closed", False)

    async def connection(self, addr: str) -> RemotingClient:
        """The connection to ``addr``, opened (and heartbeated) on first use."""
        conn = self._conns.get(addr)
        if conn is not None and not getattr(conn, "closed", False):
            return conn
        pending = self._connecting.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        fut = asyncio.get_running_loop().create_future()
        self._connecting[addr] = fut
        conn = RemotingClient(addr, connect_timeout=self.request_timeout,
                              credentials=self.credentials, ssl=self.ssl,
                              on_lost=lambda: self._schedule_rejoin(addr))
        try:
            for code, handler in self._handlers.items():
                conn.register(code, self._dispatcher(addr, handler))
            await conn.connect()
            if self.producer_groups or self.consumer_data:
                await self._heartbeat(addr, conn)
            self._conns[addr] = conn
            self._reconnects[addr] = conn.reconnects
            self._answered(addr)
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await conn.close()
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                self._lost(addr, exc)
                fut.set_exception(exc)
                fut.exception()  # retrieved: concurrent waiters get it, nobody logs it unretrieved
            raise
        finally:
            self._connecting.pop(addr, None)

    def _dispatcher(self, addr: str, handler: ServerRequestHandler):
        async def dispatch(cmd: RemotingCommand, *_: object) -> None:
            try:
                result = handler(addr, cmd)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("%s: handling request %d from %s failed", self.client_id, cmd.code, addr)
        return dispatch

    def drop_connection(self, addr: str) -> None:
        """Forget a connection that failed; the next use reconnects (and heartbeats)."""
        conn = self._conns.pop(addr, None)
        if conn is not None:
            task = asyncio.get_running_loop().create_task(conn.close())
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def invoke(self, addr: str, cmd: RemotingCommand | Encoded,
                     timeout: float | None = None) -> RemotingCommand:
        conn = self._conns.get(addr)
        if conn is None or conn.closed:  # an open connection needs no await to be found
            conn = await self.connection(addr)
        try:
            resp = await conn.invoke(cmd, timeout or self.request_timeout)
        except (OSError, ConnectionError) as exc:
            self._lost(addr, exc)
            self.drop_connection(addr)
            raise
        finally:
            self._check_reconnected(addr, conn)
        self._answered(addr)
        return resp

    def send_oneway_now(self, addr: str, cmd: RemotingCommand | Encoded) -> bool:
        """Send a one-way request to ``addr`` if that needs no wait (connected, broker
        reading): True when sent; False when the caller must await :meth:`invoke_oneway`."""
        conn = self._conns.get(addr)
        if conn is None or not conn.send_oneway_now(cmd):
            return False
        self._check_reconnected(addr, conn)
        return True

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand | Encoded) -> None:
        if self.send_oneway_now(addr, cmd):
            return
        conn = await self.connection(addr)
        try:
            await conn.invoke_oneway(cmd)
        except (OSError, ConnectionError) as exc:
            self._lost(addr, exc)
            self.drop_connection(addr)
            raise
        finally:
            self._check_reconnected(addr, conn)

    def _lost(self, addr: str, exc: BaseException) -> None:
        if self.reachability.lost(addr, exc):
            log.warning("%s: lost the connection to %s (%s); retrying until it answers",
                        self.client_id, self._describe(addr), exc or type(exc).__name__)

    def _answered(self, addr: str) -> None:
        down_for = self.reachability.answered(addr)
        if down_for is not None:
            # WARNING, as the line it ends: whoever saw the outage reported sees its end.
            log.warning("%s: the connection to %s is back after %.1f s", self.client_id,
                        self._describe(addr), down_for)

    def _describe(self, addr: str) -> str:
        """``broker-a at 127.0.0.1:10911``: the broker group's name when the routes list it."""
        name = next((name for name, ids in self.namesrv.groups.items() if addr in ids.values()), None)
        return f"{name} at {addr}" if name else f"broker at {addr}"

    def _check_reconnected(self, addr: str, conn: RemotingClient) -> None:
        """Heartbeat again at once when the transport reconnected under us."""
        seen = self._reconnects.get(addr)
        if seen is None or conn.reconnects == seen or self._closed:
            return
        self._reconnects[addr] = conn.reconnects
        if self.producer_groups or self.consumer_data:
            task = asyncio.get_running_loop().create_task(self._heartbeat(addr, conn))
            self._background.add(task)
            task.add_done_callback(self._background_done)

    def _schedule_rejoin(self, addr: str) -> None:
        if self._closed or addr in self._rejoining or not (self.producer_groups or self.consumer_data):
            return
        self._rejoining.add(addr)
        task = asyncio.get_running_loop().create_task(self._rejoin(addr))
        self._background.add(task)
        task.add_done_callback(self._background_done)

    async def _rejoin(self, addr: str) -> None:
        """Reopen a dropped broker connection and heartbeat it, backing off up to the
        heartbeat interval; ends once connected, or when the broker is no longer routed."""
        delay = REJOIN_DELAY_MIN
        group = next((name for name, ids in self.namesrv.groups.items() if addr in ids.values()), None)
        try:
            while not self._closed:
                await asyncio.sleep(delay)
                if addr in self.namesrv.all_addrs():
                    conn = self._conns.get(addr)
                    try:
                        if conn is None or conn.closed:
                            await self.connection(addr)  # heartbeats on connect
                        elif not conn.connected:
                            await conn.connect()
                            self._check_reconnected(addr, conn)
                        return
                    except (OSError, ConnectionError, TimeoutError, ClientError) as exc:
                        log.debug("%s: reconnecting to %s failed: %s", self.client_id, addr, exc)
                # Gone, maybe for good: a slave promoted in its place must learn our groups
                # before it checks back the halves the lost master left (docs/cluster.md).
                await self._meet_new_brokers()
                master = self.namesrv.broker_addrs.get(group) if group else None
                if addr not in self.namesrv.all_addrs() and (group is None or (
                        master is not None and master != addr and master in self._conns)):
                    return
                delay = min(delay * 2, self.heartbeat_interval)
        finally:
            self._rejoining.discard(addr)

    async def _meet_new_brokers(self) -> None:
        """Ask the name server for the cluster again and heartbeat every broker this
        instance has no connection to yet."""
        try:
            await self.namesrv.refresh_cluster()
        except (OSError, TimeoutError, ClientError) as exc:
            log.debug("%s: cluster refresh failed: %s", self.client_id, exc)
            return
        for addr in sorted(self.heartbeat_addrs() - set(self._conns)):
            try:
                await self.connection(addr)  # heartbeats on connect
            except (OSError, ConnectionError, TimeoutError, ClientError) as exc:
                log.debug("%s: cannot reach %s: %s", self.client_id, addr, exc)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: heartbeat after reconnect failed: %s", self.client_id, task.exception())

    # --- heartbeats ----------------------------------------------------------------------
    def heartbeat_body(self) -> bytes:
        return HeartbeatData(
            self.client_id,
            [ProducerData(g) for g in sorted(self.producer_groups)],
            [fn() for _, fn in sorted(self.consumer_data.items())],
        ).encode()

    async def _heartbeat(self, addr: str, conn: RemotingClient) -> None:
        cmd = RemotingCommand.request(RequestCode.HEART_BEAT, body=self.heartbeat_body())
        resp = await conn.invoke(cmd, self.request_timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError("heartbeat", resp.code, resp.remark, addr)

    def heartbeat_addrs(self) -> set[str]:
        """Masters only for a producer; every address, slaves too, once a consumer is here
        (it may pull from a slave, which must know the group), as RocketMQ's clients do."""
        if self.consumer_data:
            return self.namesrv.all_addrs()
        return set(self.namesrv.broker_addrs.values())

    async def heartbeat_all(self) -> None:
        """Heartbeat every known broker; one unreachable broker does not stop the others."""
        if not (self.producer_groups or self.consumer_data):
            return
        errors = []
        for addr in sorted(self.heartbeat_addrs()):
            try:
                conn = self._conns.get(addr)
                if conn is None or getattr(conn, "closed", False):
                    await self.connection(addr)  # heartbeats on connect
                else:
                    await self._heartbeat(addr, conn)
                    self._answered(addr)
            except (OSError, ConnectionError, TimeoutError, ClientError) as exc:
                if isinstance(exc, (OSError, ConnectionError)):
                    self.drop_connection(addr)
                self._lost(addr, exc)
                if is_connection_loss(exc):  # reported once, as an outage
                    log.debug("%s: heartbeat to %s failed: %s", self.client_id, addr, exc)
                    continue
                errors.append(f"{addr}: {exc or type(exc).__name__}")
        if errors:
            log.warning("%s: heartbeat failed for %s", self.client_id, "; ".join(errors))
