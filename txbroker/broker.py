"""The composition root: one :class:`Broker` builds the store, services and servers from one
:class:`~txbroker.config.BrokerConfig` and runs them.

Start-up order: every listener (broker, name-server and metrics ports) is bound first, then the
store takes the data directory's lock, and only then is anything in the directory read or
written (the store, the topic table, the transaction snapshot).  Ports come first because the
store stamps its host and port into every offsetMsgId (clients decode END_TRANSACTION offsets
from it) and with port 0 the port is only known once bound, and so that a port clash leaves no
trace on disk; the lock comes before any file so that a second broker pointed at a directory in
use refuses having touched nothing.  The broker port also answers name-server requests, so one port is a
complete installation; the separate name-server port (``namesrv_port``, -1 = off) exists for
clients configured with RocketMQ's usual two addresses.  In a cluster (``namesrv_addr`` set)
there is no embedded name server at all: the broker registers with the configured name servers
once its ports listen (:class:`~txbroker.cluster.registration.BrokerRegistrar`), again whenever
a topic changes, and unregisters first thing at stop.

The Kafka listener (``kafka_port``, -1 = off; docs/kafka.md) is bound with the other ports; its
transaction coordinator replays its system topics right after the store opens, before any
listener serves.

Shutdown order (``stop``), the mirror of start-up: in a cluster fence the store first (every
put from then on is refused, :meth:`~txbroker.cluster.roles.Roles.begin_stop`) and unregister; stop
accepting and answer held pulls and long-polling Kafka fetches, drain in-flight requests (both
protocols) within ``shutdown_grace`` while replication still runs (a SYNC_MASTER acknowledges
nothing its slaves lack), then stop the role (controller link, HA), the transaction service
(no check-back may start against a closing store) and the Kafka group and transaction
coordinators, then close the store (final flush, offsets, clean-shutdown marker).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Self

from txbroker.cluster.registration import BrokerRegistrar
from txbroker.cluster.roles import Roles, broker_credentials
from txbroker.config import (
    BrokerConfig,
    format_bytes,
    format_seconds,
    parse_address_list,
)
from txbroker.remoting.bodies import DataVersion
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.server import RemotingServer
from txbroker.remoting.tls import (
    PeerTLS,
    ServerTLS,
    dials_peers_with_tls,
    peer_tls,
    server_tls,
)
from txbroker.remoting.tls_listener import TLSListener, start_stream_server
from txbroker.service.acl import AclGuard
from txbroker.service.acl_rules import load_acl_file
from txbroker.service.clients import ClientRegistry
from txbroker.service.kafka.acl_api import acl_handlers
from txbroker.service.kafka.admin import KafkaAdmin
from txbroker.service.kafka.authorize import authorize_handlers
from txbroker.service.kafka.cluster_view import (
    KAFKA_ADDR_KEY,
    KAFKA_NODE_KEY,
    ClusterView,
    KafkaNode,
)
from txbroker.service.kafka.coordinator import TransactionCoordinator
from txbroker.service.kafka.data import KafkaData
from txbroker.service.kafka.group_api import complete_old_versions, group_handlers
from txbroker.service.kafka.group_log import GroupLog
from txbroker.service.kafka.groups import GroupCoordinator
from txbroker.service.kafka.listener import KafkaListener
from txbroker.service.kafka.markers import MarkerSender, marker_handler
from txbroker.service.kafka.metadata import KafkaMetadata
from txbroker.service.kafka.peer_envelope import verify_peers
from txbroker.service.kafka.routing import route_coordinators, route_partitions
from txbroker.service.kafka.staging import TxnStaging
from txbroker.service.kafka.txn_api import txn_handlers
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.namesrv import NameServer
from txbroker.service.pop import PopService
from txbroker.service.processors.admin import AdminProcessor
from txbroker.service.processors.consumer import ConsumerProcessor
from txbroker.service.processors.pull import PullHoldService, PullProcessor
from txbroker.service.processors.recall import recall_handlers
from txbroker.service.processors.send import SendProcessor
from txbroker.service.processors.transaction import transaction_handlers
from txbroker.service.schedule import ScheduleService
from txbroker.service.timer import TimerService
from txbroker.service.topics import TopicConfig, TopicManager
from txbroker.service.transaction.service import TransactionalMessageService
from txbroker.service.users import UserSource, UserStore
from txbroker.store.message_store import DiskUsage, MessageStore, RecoveryReport
from txbroker.store.record import DEFAULT_TOPIC

if TYPE_CHECKING:
    from txbroker.service.grpc.server import GrpcServer

log = logging.getLogger(__name__)

#: The metrics endpoint listens on loopback only, whatever ``listen_host`` is.
METRICS_HOST = "127.0.0.1"
#: How often silent clients are expired and gauges refreshed.
HOUSEKEEPING_INTERVAL = 1.0
#: A 5.x client silent this long, with no Telemetry stream open, is forgotten (they heartbeat
#: every 10 s).
GRPC_SESSION_IDLE = 120.0


def advertised_host(config: BrokerConfig) -> str:
    """The host put in routes and offsetMsgIds: never a wildcard address."""
    if config.advertised_host:
        return config.advertised_host
    if config.listen_host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return config.listen_host


class ListenError(OSError):
    """A listener could not be bound; the message names the address and which listener
    (``str()`` is that one line, without OSError's ``[Errno N]`` prefix; ``errno`` is kept)."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


def bind_listener(host: str, port: int, what: str) -> socket.socket:
    """A listening socket on ``host:port``; ``what`` ("broker port", ...) names it in errors."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        reason = (exc.strerror or str(exc)).lower()
        raise ListenError(f"cannot listen on {shown}:{port} ({what}): {reason}", exc.errno) from None
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
        #: The bound Kafka port (-1 when the Kafka listener is off).
        self.kafka_port = -1
        self.kafka: KafkaListener | None = None
        self.groups: GroupCoordinator | None = None
        self.kafka_txn: TransactionCoordinator | None = None
        #: The Kafka view of the whole cluster (None on a single broker or without Kafka).
        self.kafka_view: ClusterView | None = None
        self.kafka_admin: KafkaAdmin | None = None
        #: Other broker groups' transactions staged here (None on a single broker).
        self.kafka_staging: TxnStaging | None = None
        self._kafka_sock: socket.socket | None = None
        #: The RocketMQ 5.x gRPC endpoint (None when ``grpc_port`` is -1) and its bound port.
        #: Imported only when it is on: its protobuf names are the 5.x clients' too, and one
        #: process cannot load both (a test or an application embedding a broker beside a 5.x
        #: client keeps the endpoint off, or runs the broker as its own process).
        self.grpc: GrpcServer | None = None
        self.grpc_port = -1
        #: Built by :meth:`start` once the store holds the data directory's lock.
        self.topics: TopicManager | None = None
        self.registry = ClientRegistry(clock=clock)
        self.holds = PullHoldService()
        self.metrics = BrokerMetrics()
        self.store: MessageStore | None = None
        #: The ACL gate of the broker port (None when ``acl_file`` is unset).
        self.acl: AclGuard | None = None
        #: TLS of the broker port and the embedded name server's (None with ``tls_mode=off``).
        self.tls: ServerTLS | None = None
        #: How this broker dials its peers (``tls_peers``; None: plaintext), shared by every
        #: link and reloaded by the housekeeping when its files change.
        self.peer_tls: PeerTLS | None = None
        #: The user store: the users file, read again when it changes (None when
        #: ``users_file`` is unset); in etcd mode the cluster's store in etcd, polled
        #: (``cluster/user_keys.py``; with ``users_file``, ``acl_file`` or Kafka SASL set).
        self.users: UserSource | None = None
        self.tx: TransactionalMessageService | None = None
        self.schedule: ScheduleService | None = None
        self.timer: TimerService | None = None
        #: POP consumption (RocketMQ 5 receive/ack), served by a master only.
        self.pop: PopService | None = None
        self.server: RemotingServer | None = None
        self.namesrv_server: RemotingServer | None = None
        #: Registers with ``config.namesrv_addr`` (None without name servers: embedded mode).
        self.registrar: BrokerRegistrar | None = None
        #: Master or slave in its group (None without name servers: always its own master).
        self.roles: Roles | None = None
        self._ha_sock: socket.socket | None = None
        self._metrics_server: asyncio.AbstractServer | TLSListener | None = None
        self._housekeeping: asyncio.Task | None = None
        self._started = False

    @property
    def broker_addr(self) -> str:
        return f"{self.host}:{self.broker_port}"

    @property
    def namesrv_addr(self) -> str:
        """The name-server address; the broker port itself when the separate port is off; in
        a cluster the configured name servers (``h1:p1;h2:p2``)."""
        if self.config.namesrv_addr:
            return ";".join(parse_address_list(self.config.namesrv_addr))
        return f"{self.host}:{self.namesrv_port if self.namesrv_port > 0 else self.broker_port}"

    async def start(self) -> None:
        cfg = self.config
        acl = "off"
        if cfg.etcd_endpoints and (cfg.users_file is not None or cfg.acl_file is not None
                                   or cfg.kafka_sasl_mechanism_list()):
            from txbroker.cluster.user_keys import ClusterUsers

            # Read from etcd once the store is open (below); the users file, if any, is only
            # imported into etcd by the cluster's first broker (a bad one stops the start).
            self.users = ClusterUsers(cfg)
        elif cfg.users_file is not None:
            # Like the ACL file: a bad users file stops the start with its reason.
            self.users = UserStore(cfg.users_file)
        if cfg.acl_file is not None:
            # Before anything binds or opens: a bad ACL file stops the start with its reason.
            rules = load_acl_file(cfg.acl_file)
            self.acl = AclGuard(rules, self.users)
            acl = (f"on: {len(rules.accounts)} account(s), {len(rules.global_white)} globally "
                   f"white-listed pattern(s) from {cfg.acl_file}")
        # Likewise a certificate or key that cannot be loaded (TLSConfigError names the file).
        self.tls = server_tls(cfg)
        # And how peers are dialled (tls_peers): the CA they are verified against, our own.
        self.peer_tls = peer_tls(cfg)
        broker_sock, ns_sock, metrics_sock = self._bind_listeners()
        socks = [s for s in (broker_sock, ns_sock, metrics_sock, self._ha_sock, self._kafka_sock)
                 if s is not None]
        self.store = MessageStore(cfg, clock=self.clock, store_host=(self.host, self.broker_port),
                                  disk_usage=self.disk_usage)
        try:
            report = self.store.open()
        except BaseException:
            for s in socks:
                s.close()
            if self.grpc is not None:
                await self.grpc.stop(0)
            raise
        # From here on, stop() undoes whatever part of start() has run.
        self._started = True
        try:
            if self.users is not None:
                await self.users.start()  # etcd mode: the cluster's users, before any request
                acl += (f"; {self.users.where}: {len(self.users.current().users)} user(s)"
                        + ("" if self.acl else " (their access keys count once acl_file is set)"))
            self.topics = TopicManager(cfg)
            if self._kafka_sock is not None:
                # Kafka transaction state is replayed from its system topics before any
                # request can see it (in a cluster: when this broker becomes the master).
                self.kafka_txn = TransactionCoordinator(cfg, self.store, self.topics,
                                                        self.metrics, clock=self.clock)
                if not cfg.namesrv_addr:
                    self.kafka_txn.recover()
            await self._start_services(broker_sock, ns_sock, metrics_sock)
        except BaseException:
            # Servers first: a listener already serving is closed by its server, which takes
            # it off the event loop; closing its socket under it would leave the loop watching
            # a dead descriptor that the next socket reuses.
            await self.stop()
            for s in socks:
                s.close()
            raise
        log.info("%s", self.startup_summary(report, acl))

    def _bind_listeners(self) -> tuple[socket.socket, socket.socket | None, socket.socket | None]:
        """Bind every listener before anything else happens, or none (the error names the
        one that failed); records the bound ports (port 0 = ephemeral)."""
        cfg = self.config
        wanted = [(cfg.listen_host, cfg.broker_port, "broker port")]
        if cfg.namesrv_port >= 0 and not cfg.namesrv_addr:
            wanted.append((cfg.listen_host, cfg.namesrv_port, "name-server port"))
        if cfg.metrics_port >= 0:
            wanted.append((METRICS_HOST, cfg.metrics_port, "metrics port"))
        if cfg.kafka_port >= 0:
            wanted.append((cfg.listen_host, cfg.kafka_port, "Kafka port"))
        bound: dict[str, socket.socket] = {}
        try:
            for host, port, what in wanted:
                bound[what] = bind_listener(host, port, what)
        except OSError:
            for s in bound.values():
                s.close()
            raise
        broker_sock = bound["broker port"]
        if cfg.namesrv_addr:
            # The HA listener: RocketMQ's broker port + 1 unless given (ephemeral when the
            # broker port is); bound now so that a clash stops the start like any other.
            ha_port = cfg.ha_port if cfg.ha_port >= 0 else (
                broker_sock.getsockname()[1] + 1 if cfg.broker_port else 0)
            try:
                self._ha_sock = bind_listener(cfg.listen_host, ha_port, "HA port")
            except OSError:
                for s in bound.values():
                    s.close()
                raise
        ns_sock = bound.get("name-server port")
        metrics_sock = bound.get("metrics port")
        self._kafka_sock = bound.get("Kafka port")
        self.kafka_port = self._kafka_sock.getsockname()[1] if self._kafka_sock is not None else -1
        self.broker_port = broker_sock.getsockname()[1]
        if cfg.grpc_port >= 0:  # last: grpc binds in its own core, nothing to close after it
            from txbroker.service.grpc.server import BindError, GrpcServer

            grpc_server = GrpcServer(cfg, tls=self.tls)
            try:
                if cfg.grpc_port:  # a clash named like any other (gRPC's own text is a log line)
                    bind_listener(cfg.listen_host, cfg.grpc_port, "gRPC port").close()
                self.grpc_port = grpc_server.bind(cfg.listen_host, cfg.grpc_port)
            except ListenError:
                for s in (*bound.values(), self._ha_sock):
                    if s is not None:
                        s.close()
                raise
            except BindError as exc:
                for s in (*bound.values(), self._ha_sock):
                    if s is not None:
                        s.close()
                raise ListenError(str(exc), None) from None
            self.grpc = grpc_server
        self.namesrv_port = ns_sock.getsockname()[1] if ns_sock is not None else -1
        self.metrics_port = metrics_sock.getsockname()[1] if metrics_sock is not None else -1
        return broker_sock, ns_sock, metrics_sock

    def startup_summary(self, report: RecoveryReport, acl: str) -> str:
        """The start-up block: what an operator needs to know, one concern per line (the full
        configuration is logged at DEBUG and printed by ``txbroker serve --print-config``)."""
        cfg = self.config
        listen = f"{cfg.listen_host}:{self.broker_port}"
        if listen != self.broker_addr:
            listen += f" (advertised as {self.broker_addr})"
        if cfg.namesrv_addr:
            namesrv = f"registers with {self.namesrv_addr} (no embedded name server)"
        elif self.namesrv_port > 0:
            namesrv = f"{cfg.listen_host}:{self.namesrv_port} (the broker port answers too)"
        else:
            namesrv = "the broker port (separate name-server port off)"
        seg = format_bytes(cfg.segment_size)
        scheme = "https" if self.tls is not None else "http"
        tls = ("off" if cfg.tls_mode == "off" else
               f"{cfg.tls_mode}, certificate {cfg.tls_cert}, client certificates "
               f"{cfg.tls_client_auth}")
        if cfg.namesrv_addr and dials_peers_with_tls(cfg):
            tls += "; name servers, controller and master dialled with TLS"
        metrics = (f"{scheme}://{METRICS_HOST}:{self.metrics_port}/metrics" if self.metrics_port > 0
                   else "off")
        if cfg.flush_mode == "sync":
            flush = f"sync: acknowledged once on disk (flush timeout {format_seconds(cfg.sync_flush_timeout)})"
        else:
            flush = f"async: flushed every {format_seconds(cfg.flush_interval)}"
        kafka = f"{cfg.listen_host}:{self.kafka_port}" if self.kafka_port >= 0 else "off"
        grpc = (f"{cfg.listen_host}:{self.grpc_port} (RocketMQ 5.x clients)"
                if self.grpc_port >= 0 else "off")
        if self.kafka_port >= 0 and cfg.listen_host != self.host:
            kafka += f" (advertised as {self.host}:{self.kafka_port})"
        checks = (f"check every {format_seconds(cfg.transaction_check_interval)}, first check after "
                  f"{format_seconds(cfg.transaction_timeout)}, at most {cfg.transaction_check_max} checks")
        topics = (f"auto-create {'on' if cfg.auto_create_topic else 'off'}, "
                  f"{cfg.default_queue_nums} queues by default")
        retention = (f"{format_seconds(cfg.file_reserved_time)}; writes refused above "
                     f"{cfg.disk_max_used_ratio:.0%} disk use")
        two = format_bytes(2 * cfg.segment_size)
        first_use = (f"{seg} of disk from start (the next segment is kept ready), {two} from the "
                     f"first message on" if report.new
                     else f"each new segment takes {seg} of disk, one kept ready ahead")
        rows = [
            ("broker port", listen),
            ("name server", namesrv),
            ("metrics", metrics),
            ("kafka", kafka),
            ("grpc", grpc),
            ("data dir", os.path.abspath(cfg.data_dir)),
            ("store", report.describe()),
            ("commitlog", f"{seg} segment files, preallocated in full: {first_use}"),
            ("", ("(change with --segment-size / TXBROKER_SEGMENT_SIZE, e.g. 64MiB; sizing for "
                  "production: docs/reliability.md#disk-use)")),
            ("flush", flush),
            ("transactions", checks),
            ("topics", topics),
            ("retention", retention),
            ("access control", acl),
            ("tls", tls),
        ]
        lines = [f"broker {cfg.broker_name} (cluster {cfg.cluster_name}) started"]
        lines += [f"  {label:<17}{value}" for label, value in rows]
        return "\n".join(lines)

    async def _start_services(self, broker_sock: socket.socket, ns_sock: socket.socket | None,
                              metrics_sock: socket.socket | None) -> None:
        cfg = self.config
        self.holds.bind(asyncio.get_running_loop())
        self.store.add_listener(self.holds.on_put)
        await self.store.start()
        self.timer = TimerService(cfg, self.store, clock=self.clock)
        self.tx = TransactionalMessageService(cfg, self.store, self.registry, self.metrics,
                                              clock=self.clock, timer=self.timer)
        self.schedule = ScheduleService(self.store, clock=self.clock)
        self.pop = PopService(cfg, self.store, self.topics, self.registry, clock=self.clock)
        self.pop.bind(asyncio.get_running_loop())
        if not cfg.namesrv_addr:  # in a cluster the role decides (roles.py)
            self.recover_master_state()
            await self.resume_master_services()

        handlers: dict[int, Callable] = {}
        namesrv = NameServer(cfg, self.topics, lambda: self.broker_addr)
        if not cfg.namesrv_addr:
            handlers.update(namesrv.handlers())
        handlers.update(SendProcessor(cfg, self.store, self.topics, self.registry, self.tx,
                                      self.schedule, self.timer, self.metrics).handlers())
        handlers.update(recall_handlers(self.timer, self.topics))
        handlers.update(PullProcessor(cfg, self.store, self.topics, self.registry,
                                      self.holds).handlers())
        handlers.update(ConsumerProcessor(cfg, self.store, self.topics, self.registry,
                                          self.schedule, clock=self.clock).handlers())
        self.admin = AdminProcessor(cfg, self.store, self.topics, self.registry, self.tx,
                                    self.metrics, runtime=self._runtime,
                                    replication=self._replication, clock=self.clock)
        handlers.update(self.admin.handlers())
        handlers.update(transaction_handlers(self.tx, kafka=self.kafka_txn))

        self.server = RemotingServer(cfg, before_request=self.acl, tls=self.tls)
        for code, handler in handlers.items():
            self.server.register(int(code), handler)
        self.server.on_disconnect(self.registry.connection_closed)
        self.server.on_disconnect(self.holds.connection_closed)
        await self.server.start(cfg.listen_host, self.broker_port, sock=broker_sock)
        if ns_sock is not None:
            self.namesrv_server = RemotingServer(cfg, tls=self.tls, what="name-server port")
            for code, handler in namesrv.handlers().items():
                self.namesrv_server.register(int(code), handler)
            await self.namesrv_server.start(cfg.listen_host, self.namesrv_port, sock=ns_sock)
        if metrics_sock is not None:
            # HTTPS when the broker port speaks TLS: a request line never starts with 0x16.
            self._metrics_server = await start_stream_server(self._serve_metrics, sock=metrics_sock,
                                                             tls=self.tls, what="metrics port")
        if self._kafka_sock is not None:
            await self._start_kafka()
        if self.grpc is not None:
            await self._start_grpc()
        self._housekeeping = asyncio.create_task(self._housekeep(), name="txbroker-housekeeping")
        if cfg.namesrv_addr:
            assert self._ha_sock is not None
            sock, self._ha_sock = self._ha_sock, None
            self.roles = Roles(self, sock, bind=lambda h, p: bind_listener(h, p, "HA port"))
            await self.roles.start()
            roles = self.roles
            self.registrar = BrokerRegistrar(cfg, broker_addr=self.broker_addr,
                                             ha_addr=roles.ha_addr, identity=roles.name_server_id,
                                             topic_table=self._registered_topics,
                                             on_master=roles.learned_master,
                                             epoch=lambda: roles.epoch,
                                             tls=self._peer_context())
            self.topics.add_listener(self.registrar.trigger)
            await self.registrar.start()
            if self.kafka_view is not None:  # after the first registration: it lists us
                await self.kafka_view.start()

    async def _start_kafka(self) -> None:
        """The Kafka listener and its coordinators (docs/kafka.md)."""
        cfg = self.config
        assert self.kafka_txn is not None and self._kafka_sock is not None
        group_log = GroupLog(self.store, reserved_time=cfg.file_reserved_time, clock=self.clock)
        self.groups = GroupCoordinator(cfg, self.metrics, clock=self.clock, log=group_log,
                                       offsets=self.store.offsets,
                                       forget_offsets=self.store.forget_offsets_now)
        await self.groups.start()
        # A single broker loads its Kafka state now; in a cluster the role does, on becoming
        # the master (recover_master_state, resume_master_services).
        if not cfg.namesrv_addr:
            self.groups.load()
            await self.kafka_txn.start()
        kafka_data = KafkaData(cfg, self.store, self.topics, self.metrics, self.kafka_txn,
                               self.holds)
        if cfg.namesrv_addr:  # one Kafka node per broker group (docs/kafka.md)
            self.kafka_view = ClusterView(
                cfg, self.topics, node=KafkaNode(cfg.kafka_node_id, self.host, self.kafka_port),
                is_master=lambda: self.roles is not None and self.roles.is_master,
                credentials=broker_credentials(self), tls=self._peer_context())
            view = self.kafka_view
            # Transactions across broker groups: staged here, decided by markers.
            self.kafka_staging = TxnStaging(cfg, self.store, commit_remote=view.commit_offset,
                                            coordinates=lambda tid: view.coordinator(tid)[1],
                                            clock=self.clock)
            kafka_data.staging = self.kafka_staging
            self.kafka_txn.markers = MarkerSender(cfg, view, self.kafka_staging)
        handlers = KafkaMetadata(cfg, self.topics, host=self.host, port=self.kafka_port,
                                 view=self.kafka_view).handlers()
        handlers.update(kafka_data.handlers())
        handlers.update(group_handlers(self.groups, self.store, self.topics,
                                       self.kafka_txn.unstable_offsets))
        handlers.update(txn_handlers(self.kafka_txn))
        self.kafka_admin = KafkaAdmin(cfg, self.topics, self.store, self.kafka_txn, host=self.host,
                                      port=self.kafka_port, view=self.kafka_view)
        await self.kafka_admin.start()
        handlers.update(self.kafka_admin.handlers())
        handlers[ApiKey.WRITE_TXN_MARKERS] = marker_handler(
            cfg, self.kafka_staging, self.kafka_view.leads if self.kafka_view else lambda: False)
        if self.kafka_view is not None:
            handlers = route_partitions(handlers, self.kafka_view)
            handlers = route_coordinators(handlers, self.kafka_view, self.groups.validate_commit,
                                          self.kafka_staging)
        handlers = complete_old_versions(handlers)
        handlers.update(acl_handlers(self.users))
        if cfg.kafka_sasl_mechanism_list() and self.users is not None:  # docs/security.md
            handlers = authorize_handlers(handlers, self.users.authorizer)
        # Outermost: the envelope of requests from other brokers is checked once, first.
        handlers = verify_peers(handlers, cfg.cluster_secret, cfg.broker_name)
        self.kafka = KafkaListener(cfg, handlers, self.metrics, self.users, tls=self.tls)
        sock, self._kafka_sock = self._kafka_sock, None
        await self.kafka.start(sock)

    async def _start_grpc(self) -> None:
        """The RocketMQ 5.x gRPC endpoint (docs/grpc.md), on the same services."""
        from txbroker.service.grpc.auth import GrpcAuth
        from txbroker.service.grpc.consume import ConsumeHandlers
        from txbroker.service.grpc.recall import RecallHandlers
        from txbroker.service.grpc.route import endpoints
        from txbroker.service.grpc.send import SendHandlers
        from txbroker.service.grpc.server import MessagingServicer, client_id
        from txbroker.service.grpc.sessions import Sessions
        from txbroker.service.grpc.transactions import TransactionHandlers

        assert self.grpc is not None and self.timer is not None
        sessions = Sessions(self.registry)
        send = SendHandlers(self.config, self.store, self.topics, self.tx, sessions,
                            timer=self.timer)

        def here():
            return endpoints(self.host, self.grpc_port)

        cluster = None
        if self.config.namesrv_addr:
            from txbroker.service.grpc.cluster import ClusterRoutes

            cluster = ClusterRoutes(self.config.namesrv_addr, broker_name=self.config.broker_name,
                                    here=here, is_master=lambda: self.roles is not None
                                    and self.roles.is_master,
                                    credentials=broker_credentials(self),
                                    tls=self._peer_context())
        servicer = MessagingServicer(
            self.config, broker_name=self.config.broker_name, here=here, topics=self.topics,
            sessions=sessions, send=send, transactions=TransactionHandlers(self.tx),
            cluster=cluster, metrics=self.metrics,
            recall=RecallHandlers(self.timer, self.topics),
            auth=GrpcAuth(self.acl) if self.acl is not None else None)
        servicer.store_host = self.broker_addr
        if self.pop is not None:
            servicer.consume = ConsumeHandlers(
                self.config, self.pop, self.topics, sessions=sessions,
                broker_name=self.config.broker_name, here=servicer.here, to_pb=servicer.to_pb,
                client_id=client_id, cluster=cluster)
            # A PushConsumer's messages stay invisible while its client is connected.
            self.pop.owner_alive = lambda cid: sessions.get(cid) is not None
        await self.grpc.start(servicer)

    # --- what a role switches on and off (roles.py) -------------------------------------------
    def tx_active(self) -> bool:
        return self.tx is not None and self.tx.active

    def recover_master_state(self) -> None:
        """Becoming the master, still fenced: the transaction state from the (final) log."""
        assert self.tx is not None and self.timer is not None
        self.tx.recover()
        self.timer.recover()
        if self.pop is not None:
            self.pop.recover()
        if self.kafka_txn is not None and self.config.namesrv_addr:
            self.kafka_txn.recover()  # the replicated log is final: decisions, pid floor
        if self.kafka_staging is not None:
            self.kafka_staging.recover()  # what other groups' transactions staged here
        if self.groups is not None:
            self.groups.load()

    async def resume_master_services(self) -> None:
        """Becoming the master, fence lifted: checks (whose start rewrites the op records
        recovery found missing: a write), delayed and timer delivery."""
        assert self.tx is not None and self.schedule is not None and self.timer is not None
        await self.tx.start()
        await self.schedule.start()
        await self.timer.start()
        if self.pop is not None:
            await self.pop.start()
        if self.kafka_staging is not None:  # before the coordinator: its markers may come here
            await self.kafka_staging.start()
        if self.kafka_txn is not None and self.config.namesrv_addr:
            await self.kafka_txn.start()  # finishes decided commits: writes, after the fence

    async def suspend_master_services(self) -> None:
        """No longer the master: no check-back, no delayed or timer delivery, no state kept."""
        assert self.tx is not None and self.schedule is not None and self.timer is not None
        await self.tx.suspend()
        await self.schedule.close()
        await self.timer.close()
        if self.pop is not None:
            await self.pop.suspend()
        if self.kafka_txn is not None and self.config.namesrv_addr:
            await self.kafka_txn.suspend()
        if self.kafka_staging is not None:
            await self.kafka_staging.suspend()
        if self.groups is not None:
            await self.groups.suspend()

    def registration_changed(self) -> None:
        """A role change: the name servers learn the new id at once."""
        if self.registrar is not None:
            self.registrar.trigger()

    def _registered_topics(self) -> tuple[DataVersion, dict[str, TopicConfig]]:
        """What the name servers route: every topic, the template topic only while topics
        are auto-created (a client learns from its route that it may send to a new topic)."""
        table = {tc.name: tc for tc in self.topics.all()
                 if tc.name != DEFAULT_TOPIC or self.config.auto_create_topic}
        return self.topics.data_version, table

    def _replication(self) -> dict | None:
        """The status document's ``replication`` section (roles.py); None for one broker."""
        return self.roles.status() if self.roles is not None else None

    def _runtime(self) -> dict[str, str]:
        conns = len(self.server.connections) if self.server is not None else 0
        table = {"connections": str(conns), "heldPulls": str(self.holds.held())}
        if self.kafka_port >= 0:  # how the Kafka view of other brokers finds this one
            node = max(self.config.kafka_node_id, 0)
            table.update({KAFKA_ADDR_KEY: f"{self.host}:{self.kafka_port}",
                          KAFKA_NODE_KEY: str(node)})
        if self.grpc_port >= 0:  # how the other groups' gRPC routes find this broker
            from txbroker.service.grpc.cluster import GRPC_ADDR_KEY

            table[GRPC_ADDR_KEY] = f"{self.host}:{self.grpc_port}"
        return table

    def _update_gauges(self) -> None:
        if self.store is None:
            return
        conns = self.server.connections if self.server is not None else ()
        self.metrics.set_broker_gauges(connections=len(conns), store=self.store.stats(),
                                       held_pulls=self.holds.held(),
                                       in_flight=sum(c.inflight for c in conns))

    def _peer_context(self) -> ssl.SSLContext | None:
        return self.peer_tls.context if self.peer_tls is not None else None

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                self.registry.expire()
                if self.grpc is not None and self.grpc.servicer is not None:
                    sessions = self.grpc.servicer.sessions
                    sessions.expire(GRPC_SESSION_IDLE)
                    self.metrics.grpc_clients.set(len(sessions))
                self._update_gauges()
                if self.peer_tls is not None:
                    self.peer_tls.refresh()
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
        """Undo :meth:`start` in mirror order.  In a cluster the store is fenced first
        (STOPPING: every put from then on is refused, retriably), then clients are drained
        with replication still running (a SYNC_MASTER acknowledges only what its slaves
        hold), and only then does replication stop."""
        if not self._started:
            return
        self._started = False
        grace = self.config.shutdown_grace
        if self.roles is not None:  # first: no put is taken from here on
            self.roles.begin_stop()
        if self.registrar is not None:  # clients stop being routed here
            await self.registrar.stop()
        if self._ha_sock is not None:
            self._ha_sock.close()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._metrics_server is not None:
            self._metrics_server.close()
        self.holds.wake_all()  # held pulls and Kafka fetches answer now
        if self.pop is not None:
            self.pop.wake_all()  # held POP receives too
        if self._kafka_sock is not None:  # bound, never served
            self._kafka_sock.close()
        servers = [s for s in (self.server, self.namesrv_server, self.kafka) if s is not None]
        closing = [s.close(grace) for s in servers]
        if self.grpc is not None:
            closing.append(self.grpc.stop(grace))
        await asyncio.gather(*closing, return_exceptions=True)
        if self.kafka_view is not None:
            await self.kafka_view.close()
        if self.kafka_txn is not None and self.kafka_txn.markers is not None:
            self.kafka_txn.markers.close()
        if self.roles is not None:  # no client left: the election link, HA, following
            await self.roles.stop()
        if self.schedule is not None:
            await self.schedule.close()
        if self.timer is not None:
            await self.timer.close()
        if self.pop is not None:
            await self.pop.close()
        if self.tx is not None:
            await self.tx.close()
        # The Kafka coordinators write to the store: closed before it.
        if self.groups is not None:
            await self.groups.close()
        if self.kafka_admin is not None:
            await self.kafka_admin.close()
        if self.kafka_txn is not None:
            await self.kafka_txn.close()
        if self.kafka_staging is not None:  # started with the coordinator: stopped after it
            await self.kafka_staging.suspend()
        if self.store is not None:
            await self.store.close()
        if self.users is not None:
            await self.users.close()
        log.info("broker %s stopped", self.config.broker_name)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
