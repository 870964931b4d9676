"""The composition root: one :class:`Broker` builds the store, services and servers from one
:class:`~txbroker.config.BrokerConfig` and runs them.

Ports are bound *before* the store is built because the store stamps its host and port into
every offsetMsgId (clients decode END_TRANSACTION offsets from it), and with port 0 the port is
only known once bound.  The broker port also answers name-server requests, so one port is a
complete installation; the separate name-server port (``namesrv_port``, -1 = off) exists for
clients configured with RocketMQ's usual two addresses.

Shutdown order (``stop``): stop accepting and answer held pulls, drain in-flight requests within
``shutdown_grace``, stop the transaction service (no check-back may start against a closing
store), then close the store (final flush, offsets, clean-shutdown marker).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import time
from collections.abc import Callable
from typing import Self

from txbroker.config import BrokerConfig
from txbroker.remoting.server import RemotingServer
from txbroker.service.acl import AclGuard, load_acl_file
from txbroker.service.clients import ClientRegistry
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.namesrv import NameServer
from txbroker.service.processors.admin import AdminProcessor
from txbroker.service.processors.consumer import ConsumerProcessor
from txbroker.service.processors.pull import PullHoldService, PullProcessor
from txbroker.service.processors.send import SendProcessor
from txbroker.service.schedule import ScheduleService
from txbroker.service.topics import TopicManager
from txbroker.service.transaction import (
    TransactionalMessageService,
    transaction_handlers,
)
from txbroker.store.message_store import DiskUsage, MessageStore

log = logging.getLogger(__name__)

#: How often silent clients are expired and gauges refreshed.
HOUSEKEEPING_INTERVAL = 1.0


def advertised_host(config: BrokerConfig) -> str:
    """The host put in routes and offsetMsgIds: never a wildcard address."""
    if config.advertised_host:
        return config.advertised_host
    if config.listen_host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return config.listen_host


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Broker:
    """The broker.  ``clock`` and ``disk_usage`` are the world it sees, injected here like
    everything else: ``clock`` drives immunity and check timing, ``disk_usage`` (as
    :func:`shutil.disk_usage`: path -> (total, used, free)) is the store's disk-guard probe, so
    a test can fill the disk and free it again on a live broker."""

    def __init__(self, config: BrokerConfig, *, clock: Callable[[], float] = time.time,
                 disk_usage: DiskUsage = shutil.disk_usage) -> None:
        self.config = config
        self.clock = clock
        self.disk_usage = disk_usage
        self.host = advertised_host(config)
        self.broker_port = 0
        self.namesrv_port = -1
        self.metrics_port = -1
        self.topics = TopicManager(config)
        self.registry = ClientRegistry(clock=clock)
        self.holds = PullHoldService()
        self.metrics = BrokerMetrics()
        self.store: MessageStore | None = None
        #: The ACL gate of the broker port (None when ``acl_file`` is unset).
        self.acl: AclGuard | None = None
        self.tx: TransactionalMessageService | None = None
        self.schedule: ScheduleService | None = None
        self.server: RemotingServer | None = None
        self.namesrv_server: RemotingServer | None = None
        self._metrics_server: asyncio.AbstractServer | None = None
        self._housekeeping: asyncio.Task | None = None
        self._started = False

    @property
    def broker_addr(self) -> str:
        return f"{self.host}:{self.broker_port}"

    @property
    def namesrv_addr(self) -> str:
        """The name-server address; the broker port itself when the separate port is off."""
        return f"{self.host}:{self.namesrv_port if self.namesrv_port > 0 else self.broker_port}"

    async def start(self) -> None:
        cfg = self.config
        if cfg.acl_file is not None:
            # Before anything binds or opens: a bad ACL file stops the start with its reason.
            rules = load_acl_file(cfg.acl_file)
            self.acl = AclGuard(rules)
            log.info("access control on: %d account(s), %d globally white-listed pattern(s) "
                     "from %s", len(rules.accounts), len(rules.global_white), cfg.acl_file)
        socks: list[socket.socket] = []
        try:
            broker_sock = _bind(cfg.listen_host, cfg.broker_port)
            socks.append(broker_sock)
            ns_sock = None
            if cfg.namesrv_port >= 0:
                ns_sock = _bind(cfg.listen_host, cfg.namesrv_port)
                socks.append(ns_sock)
        except OSError:
            for s in socks:
                s.close()
            raise
        self.broker_port = broker_sock.getsockname()[1]
        self.namesrv_port = ns_sock.getsockname()[1] if ns_sock is not None else -1

        self.store = MessageStore(cfg, clock=self.clock, store_host=(self.host, self.broker_port),
                                  disk_usage=self.disk_usage)
        try:
            report = self.store.open()
        except BaseException:
            for s in socks:
                s.close()
            raise
        log.info("store opened: %s", report)
        # From here on, stop() undoes whatever part of start() has run.
        self._started = True
        try:
            await self._start_services(broker_sock, ns_sock)
        except BaseException:
            for s in socks:
                s.close()
            await self.stop()
            raise
        log.info("broker %s listening on %s (name server %s)", cfg.broker_name, self.broker_addr,
                 self.namesrv_addr)

    async def _start_services(self, broker_sock: socket.socket, ns_sock: socket.socket | None) -> None:
        cfg = self.config
        self.holds.bind(asyncio.get_running_loop())
        self.store.add_listener(self.holds.on_put)
        await self.store.start()
        self.tx = TransactionalMessageService(cfg, self.store, self.registry, self.metrics,
                                              clock=self.clock)
        self.tx.recover()
        await self.tx.start()
        self.schedule = ScheduleService(self.store, clock=self.clock)
        await self.schedule.start()

        handlers: dict[int, Callable] = {}
        namesrv = NameServer(cfg, self.topics, lambda: self.broker_addr)
        handlers.update(namesrv.handlers())
        handlers.update(SendProcessor(cfg, self.store, self.topics, self.registry, self.tx,
                                      self.schedule, self.metrics).handlers())
        handlers.update(PullProcessor(cfg, self.store, self.topics, self.registry,
                                      self.holds).handlers())
        handlers.update(ConsumerProcessor(cfg, self.store, self.topics, self.registry,
                                          self.schedule, clock=self.clock).handlers())
        self.admin = AdminProcessor(cfg, self.store, self.topics, self.registry, self.tx,
                                    self.metrics, runtime=self._runtime, clock=self.clock)
        handlers.update(self.admin.handlers())
        handlers.update(transaction_handlers(self.tx))

        self.server = RemotingServer(cfg, before_request=self.acl)
        for code, handler in handlers.items():
            self.server.register(int(code), handler)
        self.server.on_disconnect(self.registry.connection_closed)
        await self.server.start(cfg.listen_host, self.broker_port, sock=broker_sock)
        if ns_sock is not None:
            self.namesrv_server = RemotingServer(cfg)
            for code, handler in namesrv.handlers().items():
                self.namesrv_server.register(int(code), handler)
            await self.namesrv_server.start(cfg.listen_host, self.namesrv_port, sock=ns_sock)
        if cfg.metrics_port >= 0:
            self._metrics_server = await asyncio.start_server(
                self._serve_metrics, "127.0.0.1", cfg.metrics_port)
            self.metrics_port = self._metrics_server.sockets[0].getsockname()[1]
        self._housekeeping = asyncio.create_task(self._housekeep(), name="txbroker-housekeeping")

    def _runtime(self) -> dict[str, str]:
        conns = len(self.server.connections) if self.server is not None else 0
        return {"connections": str(conns), "heldPulls": str(self.holds.held())}

    def _update_gauges(self) -> None:
        if self.store is None:
            return
        conns = self.server.connections if self.server is not None else ()
        self.metrics.set_broker_gauges(connections=len(conns), store=self.store.stats(),
                                       held_pulls=self.holds.held(),
                                       in_flight=sum(c.inflight for c in conns))

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                self.registry.expire()
                self._update_gauges()
            except Exception:
                log.exception("housekeeping failed")

    async def _serve_metrics(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A minimal HTTP/1.0 responder for Prometheus scrapes (GET /metrics)."""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            if path.split(b"?")[0] in (b"/metrics", b"/"):
                self._update_gauges()
                body = self.metrics.render()
                head = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            else:
                body = b"not found\n"
                head = b"HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        grace = self.config.shutdown_grace
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._metrics_server is not None:
            self._metrics_server.close()
        self.holds.wake_all()
        servers = [s for s in (self.server, self.namesrv_server) if s is not None]
        await asyncio.gather(*(s.close(grace) for s in servers), return_exceptions=True)
        if self.schedule is not None:
            await self.schedule.close()
        if self.tx is not None:
            await self.tx.close()
        if self.store is not None:
            await self.store.close()
        log.info("broker %s stopped", self.config.broker_name)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
