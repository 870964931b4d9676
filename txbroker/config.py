"""The broker's one configuration object.

Every layer receives this frozen dataclass explicitly from the composition root; nothing reads
settings from globals or the environment on its own (RocketMQ's "setting did not take effect"
reports come from exactly that).  Defaults mirror RocketMQ 4.x so that operators who know
RocketMQ find the same behaviour: check interval 60 s, transaction timeout 6 s, 15 checks,
72 h retention, 1 GiB commitlog segments, 16 MiB frames, 4 MiB messages.

Loading order (highest wins): ``txbroker serve`` options, ``TXBROKER_*`` environment variables,
an optional TOML file, these defaults.  :func:`load_config` implements that order; the CLI only
collects the three sources and hands them over.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

ENV_PREFIX = "TXBROKER_"
#: Variables read when a module is imported, before any configuration exists, so they are
#: not settings: ``TXBROKER_NO_EXTENSIONS`` (non-empty: the pure-Python codec even when the
#: compiled one was built).  :func:`check_environ` knows them.
IMPORT_VARIABLES = frozenset({"TXBROKER_NO_EXTENSIONS"})

FlushMode = Literal["async", "sync"]
#: How a master acknowledges a send (RocketMQ's brokerRole): after its own write, or once
#: ``min_in_sync_replicas`` slaves hold the bytes.  A slave is ``broker_id`` >= 1 and keeps
#: this setting for the day it is promoted.
BrokerRole = Literal["ASYNC_MASTER", "SYNC_MASTER"]
#: TLS on the remoting listeners (txbroker/remoting/tls.py) and client-certificate checking.
TlsMode = Literal["off", "permissive", "enforcing"]
TlsClientAuth = Literal["none", "optional", "required"]
#: Whether a node dials its peers (name servers, controller, HA master, a master's broker port)
#: with TLS: ``auto`` = when ``tls_mode`` is ``enforcing``.
TlsPeers = Literal["auto", "on", "off"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the rule."""


#: Controller mode: the share of the lease a master does not count on, for clock-rate drift
#: between its machine and the controller's (NTP slews clocks by at most 0.05 %; 5 % is
#: generous) ...
LEASE_DRIFT = 0.05
#: ... and a fixed allowance (seconds) for what happens between the write-path check and the
#: answer leaving the socket, and for the controller's clock reading its heartbeat early.
LEASE_SLACK = 0.1
#: Shortest controller lease accepted: the assumed lease must leave room to write.
MIN_CONTROLLER_LEASE = 0.5
#: Without a controller (RocketMQ 4.x defaults): HA heartbeat (``haSendHeartbeatInterval``),
#: idle time-out (``haHousekeepingInterval``) and the SYNC_MASTER wait.
CLASSIC_HA_HEARTBEAT = 5.0
CLASSIC_HA_IDLE_TIMEOUT = 20.0
CLASSIC_SLAVE_TIMEOUT = 3.0


@dataclass(frozen=True)
class ClusterTiming:
    """The time limits a clustered broker runs by (:meth:`BrokerConfig.timing`), seconds.

    ``assumed_lease`` is how long after *sending* an answered heartbeat a controller-mode
    master counts itself master: ``lease * (1 - LEASE_DRIFT) - LEASE_SLACK``.  The controller
    promotes another replica no sooner than ``max(its lease, the heartbeatTimeoutMills the
    broker sent = controller_lease)`` after *receiving* the last heartbeat, which is after it
    was sent; both sides measure with monotonic clocks, so only their rates may differ, and
    the margin covers that and the moment between the check and the answer leaving."""

    lease: float
    assumed_lease: float
    controller_heartbeat: float
    ha_heartbeat: float
    ha_idle_timeout: float
    slave_timeout: float


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the broker can be told.  Durations are seconds, sizes are bytes."""

    # --- network -------------------------------------------------------------------------
    #: Interface to listen on.  Loopback by default: exposing a broker is an explicit choice.
    listen_host: str = "127.0.0.1"
    #: Broker port (RocketMQ default 10911); 0 binds an ephemeral port (tests).
    broker_port: int = 10911
    #: Embedded name-server port (RocketMQ default 9876); 0 = ephemeral, -1 = disabled (the
    #: broker port answers name-server requests too, so one port is a complete installation).
    namesrv_port: int = 9876
    #: Address announced in routes and offsetMsgIds; empty = the bound host and port.
    advertised_host: str = ""
    #: Prometheus text-format endpoint; 0 = ephemeral, -1 = disabled.
    metrics_port: int = -1
    max_connections: int = 4096
    #: Requests handled at once per connection before the server stops reading from it.
    max_inflight_per_connection: int = 1024
    max_frame_size: int = 16 * 1024 * 1024

    # --- identity ------------------------------------------------------------------------
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"

    # --- store ---------------------------------------------------------------------------
    data_dir: str = "./txbroker-data"
    #: Commitlog segment size (RocketMQ mappedFileSizeCommitLog).
    segment_size: int = 1024 * 1024 * 1024
    #: Entries per consume-queue file (RocketMQ: 300000 x 20 bytes).
    consume_queue_entries: int = 300_000
    flush_mode: FlushMode = "async"
    #: Async mode: how often dirty pages are flushed.
    flush_interval: float = 0.5
    #: Sync mode: a put whose flush has not completed within this gets FLUSH_DISK_TIMEOUT.
    sync_flush_timeout: float = 5.0
    #: How often consumer offsets are persisted (they are also persisted at shutdown).
    offset_persist_interval: float = 5.0
    max_message_size: int = 4 * 1024 * 1024
    #: Segments older than this are deleted (never the active one).
    file_reserved_time: float = 72 * 3600.0
    #: Writes are refused while the data disk is fuller than this ratio.
    disk_max_used_ratio: float = 0.90

    # --- topics --------------------------------------------------------------------------
    default_queue_nums: int = 4
    auto_create_topic: bool = True

    # --- transactions --------------------------------------------------------------------
    transaction_check_interval: float = 60.0
    #: Minimum age of a half message before its first check (immunity).
    transaction_timeout: float = 6.0
    transaction_check_max: int = 15
    #: Check-backs in flight at once across the broker.
    check_concurrency: int = 16
    #: Decided transactions remembered for ``txbroker txn show`` and repeated decisions by id
    #: (source, operator, time); oldest forgotten first.  ~400-500 bytes each: 100,000 ≈ 40-50 MB.
    transaction_history_size: int = 100_000

    # --- timer messages (docs/grpc.md, "Timer messages") --------------------------------------
    #: Furthest a timer message may be scheduled ahead (RocketMQ's ``timerMaxDelaySec``, 3 days);
    #: a send beyond it is refused.
    timer_max_delay: float = 259_200.0
    #: Timers waiting on this broker at most; a timer send past it is refused.  The index
    #: costs 8 bytes per pending timer, ~170 bytes per second that has one (3 days: ~45 MB at
    #: most) and a bit per timer stored in the last ``timer_roll_window``.
    timer_max_pending: int = 2_000_000
    #: A timer still waiting this long after it was stored is written again at the log's head
    #: (RocketMQ's "roll"), so recovery reads at most this window of timers and retention
    #: never deletes a pending one (half of ``file_reserved_time`` when that is shorter).
    timer_roll_window: float = 3_600.0

    # --- long polling / consumers --------------------------------------------------------
    #: Upper bound on how long a suspended pull is held, whatever the client asks.
    max_pull_suspend: float = 30.0
    max_reconsume_times: int = 16

    # --- POP consumption (docs/grpc.md, "POP consumption") --------------------------------
    #: Most messages one POP receive returns (the proxy's limit: 32).
    pop_max_batch: int = 32
    #: The invisible time a POP receive may ask for (ms); a change of invisibility may ask for
    #: anything from 0 (visible again now) to the same maximum.
    pop_min_invisible_ms: int = 1000
    pop_max_invisible_ms: int = 12 * 3600 * 1000
    #: Upper bound on how long a POP receive with nothing to return is held (long polling).
    pop_max_poll: float = 30.0
    #: POP receives held at once across the broker; one more is refused as too many requests.
    pop_max_waiters: int = 1024
    #: Messages one POP group may hold in flight (popped, not yet acknowledged) on this broker.
    pop_max_inflight: int = 10_000
    #: Consumer groups whose POP receives are FIFO, separated by commas (RocketMQ's
    #: subscription group ``consumeMessageOrderly``): 5.x clients learn it from the settings.
    pop_fifo_groups: str = ""

    # --- cluster (docs/cluster.md) -------------------------------------------------------------
    #: Name servers this broker registers with (``h1:9876;h2:9876``, RocketMQ's list).  Empty =
    #: the embedded name server: one process is a whole installation (the quick start).
    namesrv_addr: str = ""
    #: 0 = the master of ``broker_name``; >= 1 = a slave replicating that master's commitlog.
    broker_id: int = 0
    broker_role: BrokerRole = "ASYNC_MASTER"
    #: The HA (replication) listener, opened in a cluster only; -1 = broker port + 1 (RocketMQ's
    #: rule; ephemeral when the broker port is), 0 = ephemeral.
    ha_port: int = -1
    #: A slave's master HA address (host:port); empty = learned from the name servers (or the
    #: controller in controller mode).
    ha_master_addr: str = ""
    #: SYNC_MASTER: slaves that must hold a send's bytes before it is acknowledged.  Under a
    #: controller every slave of the in-sync set must hold them too, and the set must keep at
    #: least this many (docs/cluster.md, "SYNC_MASTER statuses").
    min_in_sync_replicas: int = 1
    #: SYNC_MASTER: a send not replicated within this is answered FLUSH_SLAVE_TIMEOUT (stored);
    #: 0 = half of ``controller_lease`` in controller mode (a put is answered inside one
    #: lease), 3 s otherwise (see :meth:`BrokerConfig.timing`).
    slave_timeout: float = 0.0
    #: How often the broker registers with every name server (RocketMQ: 30 s, clamped 10-60 s).
    register_interval: float = 30.0
    #: How often a slave copies topic configs from its master (classic and controller mode;
    #: consumer offsets are replicated records of the commitlog, never copied).
    metadata_sync_interval: float = 10.0
    #: Controller(s) deciding which replica is master (``h:p;h:p``); empty = roles fixed by
    #: ``broker_id`` (RocketMQ's classic master/slave, failover by hand).
    controller_addr: str = ""
    #: Controller mode: how often the broker heartbeats the controller; a master that has not
    #: renewed its lease within ``controller_lease`` stops accepting writes (fencing).
    controller_heartbeat_interval: float = 0.5
    controller_lease: float = 3.0
    #: etcd members holding the cluster's own state (``h:p;h:p``, docs/cluster.md "Consensus
    #: on etcd"); empty = not etcd mode.  The group's master is the holder of its leader key,
    #: bound to an etcd lease; no controller runs.  Exclusive with ``controller_addr``.
    etcd_endpoints: str = ""
    #: Where the cluster's keys live in etcd: ``<prefix>/<cluster name>/<broker name>/...``.
    etcd_prefix: str = "/txbroker"
    #: etcd mode: the broker's etcd lease TTL, whole seconds (etcd's unit).  A master that has
    #: not renewed it within ``etcd_lease`` (counted from the renewal's sending) stops writing,
    #: and a slave can be elected once etcd lets it expire.
    etcd_lease: int = 3
    #: etcd's own authentication (``etcdctl user add``); unset = none.  The password is a
    #: secret: never logged or shown.  TLS to etcd follows ``tls_peers`` (``tls_ca``, and
    #: ``tls_cert``/``tls_key`` as the client certificate).
    etcd_user: str | None = None
    etcd_password: str | None = field(default=None, repr=False)
    #: Replication liveness: an idle HA connection carries a heartbeat every
    #: ``ha_heartbeat_interval`` and is dropped after ``ha_idle_timeout`` without one.  0 =
    #: derived: in controller mode from the lease (idle timeout = the lease, heartbeat = a
    #: quarter of the idle timeout), so a master notices a silent slave within one lease;
    #: otherwise RocketMQ's 5 s and 20 s (see :meth:`BrokerConfig.timing`).
    ha_heartbeat_interval: float = 0.0
    ha_idle_timeout: float = 0.0

    # --- RocketMQ 5.x gRPC endpoint (docs/grpc.md) --------------------------------------------
    #: gRPC listener (``apache.rocketmq.v2.MessagingService``) on ``listen_host``; -1 = off (the
    #: default), 0 = ephemeral.  RocketMQ's proxy listens on 8081.
    grpc_port: int = -1
    #: Largest body a gRPC producer may send, told to clients in their settings
    #: (``publishing.max_body_size``); at most ``max_message_size``.  0 = ``max_message_size``.
    grpc_max_body_size: int = 0

    # --- Kafka listener (docs/kafka.md) ---------------------------------------------------------
    #: Kafka-protocol listener on ``listen_host``; -1 = off (the default), 0 = ephemeral.
    kafka_port: int = -1
    #: Largest ``transaction.timeout.ms`` a Kafka producer may ask for (Kafka's
    #: ``transaction.max.timeout.ms``, 15 min); longer is INVALID_TRANSACTION_TIMEOUT.
    kafka_transaction_max_timeout: float = 900.0
    #: How often open Kafka transactions are checked against their timeout (aborted past it).
    kafka_transaction_scan_interval: float = 1.0
    #: Bytes of record batches one open Kafka transaction may stage (they wait in memory and in
    #: ``RMQ_SYS_KAFKA_TXN_DATA`` until the commit); a batch beyond is RECORD_LIST_TOO_LARGE.
    #: A producer id has one open transaction at a time, so this is also what one producer
    #: may stage.
    kafka_transaction_max_bytes: int = 64 * 1024 * 1024
    #: Bytes all open Kafka transactions together may stage (bounds the memory they take);
    #: a batch beyond is KAFKA_STORAGE_ERROR, retriable, as a full disk is.
    kafka_transactions_max_bytes: int = 512 * 1024 * 1024
    #: The Kafka coordinator snapshots its state (ids, producer ids, idempotent producers'
    #: sequences) at least this often when it changed, after ``kafka_snapshot_records`` state
    #: records, and at a clean stop; recovery reads the latest snapshot and the log after it.
    kafka_snapshot_interval: float = 60.0
    kafka_snapshot_records: int = 10000
    #: A transactional id with no transaction for this long is forgotten (Kafka's
    #: ``transactional.id.expiration.ms``, 7 days); its next InitProducerId starts afresh.
    kafka_transactional_id_expiration: float = 7 * 24 * 3600.0
    #: A new consumer group waits this long for more members before its first assignment
    #: (Kafka's ``group.initial.rebalance.delay.ms``).
    kafka_group_initial_rebalance_delay: float = 3.0
    #: Bounds on a Kafka consumer's session timeout (``group.min/max.session.timeout.ms``).
    kafka_group_min_session_timeout: float = 6.0
    kafka_group_max_session_timeout: float = 1800.0
    #: The Kafka node id of this broker's group (docs/kafka.md, "Kafka on a cluster"): the
    #: same on every replica of a group, different between groups, so that a node keeps its
    #: id through a failover.  -1 = not set (a single broker is node 0; a cluster broker
    #: with a Kafka port must set it).
    kafka_node_id: int = -1
    #: How often a cluster broker refreshes its Kafka view of the cluster (groups, masters,
    #: topic tables) from the name servers and the masters.
    kafka_cluster_refresh_interval: float = 1.0
    #: Requests of one Kafka connection read and not yet answered, the one being handled
    #: included (they are handled one at a time, in order).  At this count, or once the
    #: waiting ones hold ``kafka_max_queued_bytes``, the connection is not read until answers
    #: go out: a pipelining client is slowed down, not disconnected.
    kafka_max_inflight_per_connection: int = 16
    kafka_max_queued_bytes: int = 8 * 1024 * 1024
    #: Largest Fetch answer, whatever ``max_bytes`` and ``partition_max_bytes`` a client asks
    #: for (Kafka's broker setting ``fetch.max.bytes``, 55 MiB): each Fetch is built in memory,
    #: several copies deep, so a client asking for 2 GiB must not get it.  The first partition
    #: with records still gets its first batch whole when that alone is larger (KIP-74): a
    #: consumer is never stuck behind a large record.
    kafka_fetch_max_bytes: int = 57671680
    #: Committed offsets of a Kafka group with no members are deleted this long after it
    #: became empty (a group without members ever: this long after each commit), and the group
    #: with them (Kafka's ``offsets.retention.minutes``, 7 days).
    kafka_offsets_retention: float = 7 * 24 * 3600.0
    #: How often expired Kafka offsets and groups are looked for
    #: (``offsets.retention.check.interval.ms``, 10 min).
    kafka_offsets_retention_check_interval: float = 600.0
    #: SASL mechanisms Kafka clients must authenticate with before any other request
    #: (docs/security.md, "Kafka SASL"), comma-separated among PLAIN, SCRAM-SHA-256 and
    #: SCRAM-SHA-512; empty = no authentication on the Kafka port.
    kafka_sasl_mechanisms: str = ""
    #: PLAIN sends the password itself: it is offered on TLS connections (``tls_mode``), and
    #: on plaintext ones only when this is set (Kafka clients print the same warning).
    kafka_sasl_plain_over_plaintext: bool = False
    #: Largest frame read from a Kafka connection that has not authenticated yet (Kafka's
    #: ``sasl.server.max.receive.size``): an unauthenticated peer cannot make the broker buffer
    #: ``max_frame_size``.
    kafka_sasl_max_receive_size: int = 524288

    # --- shutdown ------------------------------------------------------------------------
    shutdown_grace: float = 5.0

    # --- worker processes (docs/workers.md) ---------------------------------------------
    #: Broker processes run by ``txbroker serve`` on this machine, one broker group each
    #: behind one name server (``auto`` = the CPU count); 1 = one broker in this process.
    workers: int = 1

    # --- access control ------------------------------------------------------------------
    #: A RocketMQ 4.x ``plain_acl.yml``; when set, every broker-port request and every call
    #: on the gRPC port must pass it (RocketMQ's ``aclEnable=true``).  Unset = no access
    #: control, as in RocketMQ.
    acl_file: str | None = None
    #: This broker's own account in ``acl_file`` (its secret key is read from there): the
    #: requests it sends to another broker's port (a slave's metadata sync) are signed with
    #: it, as RocketMQ 5 signs broker-to-broker calls with ``innerClientAuthenticationCredentials``.
    acl_access_key: str | None = None
    #: The user store (docs/security.md "Users"): users with SCRAM credentials, access keys
    #: and roles, edited with ``txbroker user`` and read again when it changes.  Unset = none.
    #: In etcd mode the cluster's store in etcd serves instead, and this file is only imported
    #: into it by the first broker to find it empty.
    users_file: str | None = None
    #: Shared by every broker and controller of the cluster: HA peers and controller requests
    #: prove they know it (docs/cluster.md "Authentication").  Unset = peers are trusted, as
    #: in RocketMQ.  Never logged, printed or shown in the status document.
    cluster_secret: str | None = field(default=None, repr=False)

    # --- TLS (docs/security.md "TLS") ---------------------------------------------------
    #: The broker port (and the embedded name server's) speaks TLS: ``off`` (plaintext, as
    #: the quick start), ``permissive`` (plaintext and TLS on one port, told apart by the
    #: first byte, for a migration) or ``enforcing`` (plaintext connections are closed).
    tls_mode: TlsMode = "off"
    #: PEM server certificate (chain) and its key; re-read when the files change.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: PEM CA that client certificates are verified against (with ``tls_client_auth``).
    tls_ca: str | None = None
    #: Client certificates: ``none``, ``optional`` (verified when sent) or ``required`` (mTLS).
    tls_client_auth: TlsClientAuth = "none"
    #: This node dials its peers with TLS (``auto``: when ``tls_mode`` is ``enforcing``),
    #: verifying them against ``tls_ca`` and their host name or IP address, and presenting
    #: ``tls_cert``/``tls_key`` as its client certificate (mTLS between nodes).
    tls_peers: TlsPeers = "auto"

    def __post_init__(self) -> None:
        _validate(self)

    def kafka_sasl_mechanism_list(self) -> tuple[str, ...]:
        """``kafka_sasl_mechanisms`` as a tuple (empty: no authentication)."""
        return tuple(m.strip().upper() for m in self.kafka_sasl_mechanisms.split(",") if m.strip())

    @property
    def elected(self) -> bool:
        """Whether a group's master is elected (controller or etcd mode), rather than fixed by
        ``broker_id``: a master then writes only while its lease holds."""
        return bool(self.controller_addr or self.etcd_endpoints)

    def peer_tls_on(self) -> bool:
        """Whether this node dials its peers (etcd too) with TLS (``tls_peers``)."""
        return self.tls_peers == "on" or (self.tls_peers == "auto" and self.tls_mode == "enforcing")

    def timing(self) -> ClusterTiming:
        """The cluster's time limits in force, the derived ones (0 = derived) worked out.
        In etcd mode the lease is ``etcd_lease``, renewed every sixth of it."""
        controlled = self.elected
        if self.etcd_endpoints:
            lease, heartbeat = float(self.etcd_lease), self.etcd_lease / 6
        else:
            lease, heartbeat = self.controller_lease, self.controller_heartbeat_interval
        idle = self.ha_idle_timeout or (lease if controlled else CLASSIC_HA_IDLE_TIMEOUT)
        beat = self.ha_heartbeat_interval or (idle / 4 if controlled else CLASSIC_HA_HEARTBEAT)
        slave = self.slave_timeout or (lease / 2 if controlled else CLASSIC_SLAVE_TIMEOUT)
        return ClusterTiming(lease=lease, assumed_lease=lease * (1 - LEASE_DRIFT) - LEASE_SLACK,
                             controller_heartbeat=heartbeat,
                             ha_heartbeat=beat, ha_idle_timeout=idle, slave_timeout=slave)

    def replace(self, **changes: Any) -> BrokerConfig:
        """A copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    def as_dict(self) -> dict[str, Any]:
        """Every setting, a secret replaced by :data:`HIDDEN` (this is what gets logged)."""
        out = dataclasses.asdict(self)
        for name in SECRET_SETTINGS:
            if out[name] is not None:
                out[name] = HIDDEN
        return out


#: Settings whose value is never logged or printed.
SECRET_SETTINGS = ("cluster_secret", "etcd_password")
HIDDEN = "(set, not shown)"
#: The shortest cluster secret accepted (a short one is guessed offline from one exchange).
MIN_SECRET_LENGTH = 8
#: With TLS on, a connection whose first byte is 0x16 (a TLS handshake record) is taken for
#: TLS; a RocketMQ or Kafka frame starts with its int32 size, whose first byte is 0x16 only
#: from this size up, so ``max_frame_size`` stays below it (docs/security.md "TLS").
TLS_FRAME_SIZE_LIMIT = 0x16 << 24


def _validate(c: BrokerConfig) -> None:
    def need(ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"{name}={getattr(c, name)!r}: {rule}")

    for name in ("broker_port",):
        need(0 <= getattr(c, name) <= 65535, name, "must be a port number 0..65535")
    for name in ("namesrv_port", "metrics_port", "ha_port", "kafka_port", "grpc_port"):
        need(-1 <= getattr(c, name) <= 65535, name, "must be -1 (off) or a port number 0..65535")
    _check_ports_apart(c)
    need(c.tls_mode == "off" or c.max_frame_size < TLS_FRAME_SIZE_LIMIT, "max_frame_size",
         f"must be below {TLS_FRAME_SIZE_LIMIT} bytes with TLS on: a frame that large starts "
         "with 0x16, the first byte of a TLS handshake")
    need(c.flush_mode in ("async", "sync"), "flush_mode", "must be 'async' or 'sync'")
    need(c.segment_size >= 64 * 1024, "segment_size", "must be at least 64 KiB")
    need(c.consume_queue_entries >= 16, "consume_queue_entries", "must be at least 16")
    need(1024 <= c.max_message_size <= c.segment_size - 1024, "max_message_size",
         "must be at least 1 KiB and fit in a segment")
    need(c.max_frame_size >= 1024, "max_frame_size", "must be at least 1 KiB")
    need(0 <= c.grpc_max_body_size <= c.max_message_size, "grpc_max_body_size",
         "must be 0 (max_message_size) or at most max_message_size")
    need(c.grpc_port < 0 or c.workers == 1, "grpc_port",
         "the gRPC endpoint runs in a single broker process: not with workers > 1")
    need(0.0 < c.disk_max_used_ratio <= 1.0, "disk_max_used_ratio", "must be in (0, 1]")
    for name in ("flush_interval", "sync_flush_timeout", "offset_persist_interval",
                 "transaction_check_interval", "file_reserved_time", "max_pull_suspend",
                 "shutdown_grace", "register_interval", "metadata_sync_interval",
                 "controller_heartbeat_interval", "controller_lease",
                 "kafka_transaction_max_timeout", "kafka_transaction_scan_interval",
                 "kafka_group_min_session_timeout", "kafka_transactional_id_expiration",
                 "kafka_snapshot_interval", "kafka_cluster_refresh_interval",
                 "kafka_offsets_retention", "kafka_offsets_retention_check_interval",
                 "pop_max_poll"):
        need(getattr(c, name) > 0, name, "must be > 0")
    need(c.kafka_transaction_max_bytes >= c.max_message_size, "kafka_transaction_max_bytes",
         "must be >= max_message_size (one batch must fit)")
    need(c.kafka_transactions_max_bytes >= c.kafka_transaction_max_bytes,
         "kafka_transactions_max_bytes", "must be >= kafka_transaction_max_bytes")
    _check_kafka_cluster(c)
    need(c.kafka_group_initial_rebalance_delay >= 0, "kafka_group_initial_rebalance_delay",
         "must be >= 0")
    need(c.kafka_group_max_session_timeout >= c.kafka_group_min_session_timeout,
         "kafka_group_max_session_timeout", "must be >= kafka_group_min_session_timeout")
    need(c.transaction_timeout >= 0, "transaction_timeout", "must be >= 0")
    for name in ("transaction_check_max", "check_concurrency", "default_queue_nums",
                 "kafka_snapshot_records", "workers",
                 "max_connections", "max_inflight_per_connection",
                 "kafka_max_inflight_per_connection", "kafka_max_queued_bytes",
                 "kafka_fetch_max_bytes", "pop_max_batch", "pop_min_invisible_ms", "pop_max_waiters",
                 "pop_max_inflight"):
        need(getattr(c, name) >= 1, name, "must be >= 1")
    need(c.broker_role in ("ASYNC_MASTER", "SYNC_MASTER"), "broker_role",
         "must be ASYNC_MASTER or SYNC_MASTER (a slave is --broker-id 1 or more)")
    need(c.broker_id >= 0, "broker_id", "must be >= 0 (0 = master, 1 or more = slave)")
    need(c.min_in_sync_replicas >= 1, "min_in_sync_replicas", "must be >= 1")
    for name in ("slave_timeout", "ha_heartbeat_interval", "ha_idle_timeout"):
        need(getattr(c, name) >= 0, name, "must be >= 0 (0 = derived)")
    _check_timing(c)
    for name in ("namesrv_addr", "ha_master_addr", "controller_addr"):
        try:
            parse_address_list(getattr(c, name))
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc} (several separated by ';', or empty)") from None
    _check_etcd(c)
    need(not c.advertised_host or _host_ok(c.advertised_host), "advertised_host",
         "must be a host name or an IPv4 address (what clients dial; empty = the bound host)")
    need(c.max_reconsume_times >= 0, "max_reconsume_times", "must be >= 0")
    need(c.pop_max_invisible_ms >= c.pop_min_invisible_ms, "pop_max_invisible_ms",
         "must be >= pop_min_invisible_ms")
    need(c.transaction_history_size >= 0, "transaction_history_size", "must be >= 0")
    need(c.timer_max_delay > 0, "timer_max_delay", "must be > 0")
    need(c.timer_max_pending >= 1, "timer_max_pending", "must be >= 1")
    need(c.timer_roll_window > 0, "timer_roll_window", "must be > 0")
    need(bool(c.broker_name) and bool(c.cluster_name), "broker_name", "names must not be empty")
    need(bool(c.data_dir), "data_dir", "must not be empty")
    need(c.acl_file is None or bool(c.acl_file.strip()), "acl_file",
         "must be the path of a plain_acl.yml file (leave it unset to turn access control off)")
    need(c.users_file is None or bool(c.users_file.strip()), "users_file",
         "must name a file (or be unset)")
    need(c.acl_access_key is None or (bool(c.acl_access_key.strip()) and c.acl_file is not None),
         "acl_access_key", "names an account of acl_file, so acl_file must be set too")
    _check_kafka_sasl(c)
    if c.cluster_secret is not None and len(c.cluster_secret) < MIN_SECRET_LENGTH:
        # Never echo the value itself.
        raise ConfigError(f"cluster_secret: must be at least {MIN_SECRET_LENGTH} characters")
    check_tls(c)
    if c.tls_peers not in ("auto", "on", "off"):
        raise ConfigError(f"tls_peers={c.tls_peers!r}: must be auto, on or off")


def check_tls(c: Any) -> None:
    """The ``tls_*`` settings of a listener (a broker's, a controller's, a name server's)
    agree with each other."""
    if c.tls_mode not in ("off", "permissive", "enforcing"):
        raise ConfigError(f"tls_mode={c.tls_mode!r}: must be off, permissive or enforcing")
    if c.tls_client_auth not in ("none", "optional", "required"):
        raise ConfigError(f"tls_client_auth={c.tls_client_auth!r}: must be none, optional or "
                          f"required")
    if c.tls_mode != "off" and not (c.tls_cert and c.tls_key):
        raise ConfigError(f"tls_mode={c.tls_mode}: needs tls_cert and tls_key (PEM files)")
    if c.tls_client_auth != "none" and not c.tls_ca:
        raise ConfigError(f"tls_client_auth={c.tls_client_auth}: needs tls_ca, the CA file "
                          f"client certificates are verified against")


@dataclass(frozen=True)
class TlsSettings:
    """A listener's TLS settings on their own, for a process with no other configuration (the
    standalone name server); the fields are the broker's ``tls_*``."""

    tls_mode: TlsMode = "off"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_client_auth: TlsClientAuth = "none"

    def __post_init__(self) -> None:
        check_tls(self)


KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _check_kafka_sasl(c: BrokerConfig) -> None:
    """Kafka SASL needs known mechanisms and somewhere to find the users."""
    mechs = c.kafka_sasl_mechanism_list()
    unknown = [m for m in mechs if m not in KAFKA_SASL_MECHANISMS]
    if unknown:
        raise ConfigError(f"kafka_sasl_mechanisms={c.kafka_sasl_mechanisms!r}: unknown "
                          f"{', '.join(unknown)} (comma-separated among "
                          f"{', '.join(KAFKA_SASL_MECHANISMS)}, or empty for none)")
    if "PLAIN" in mechs and not c.kafka_sasl_plain_over_plaintext and c.tls_mode == "off":
        raise ConfigError(f"kafka_sasl_mechanisms={c.kafka_sasl_mechanisms!r}: PLAIN sends the "
                          "password in the clear and the Kafka port has no TLS (tls_mode=off); "
                          "turn TLS on (PLAIN is then offered on TLS connections), set "
                          "kafka_sasl_plain_over_plaintext to offer it on plaintext ones anyway, "
                          "or use SCRAM")
    if mechs and not c.users_file and not c.etcd_endpoints:  # etcd mode: the cluster's store
        raise ConfigError(f"kafka_sasl_mechanisms={c.kafka_sasl_mechanisms!r}: needs "
                          "users_file (the user store that 'txbroker user add' writes)")
    if c.kafka_sasl_max_receive_size < 1024:
        raise ConfigError(f"kafka_sasl_max_receive_size={c.kafka_sasl_max_receive_size}: "
                          "must be >= 1024")
    if mechs and c.kafka_port >= 0 and (c.namesrv_addr or c.workers > 1) \
            and c.cluster_secret is None:
        raise ConfigError(f"kafka_sasl_mechanisms={c.kafka_sasl_mechanisms!r} on a cluster broker "
                          "(namesrv_addr or workers set, and a Kafka port): needs "
                          "cluster_secret, the password brokers log in to each other's Kafka "
                          "ports with (forwarded admin requests, transaction markers)")


def _check_kafka_cluster(c: BrokerConfig) -> None:
    """A Kafka listener on a cluster broker needs the group's node id (docs/kafka.md, "Kafka
    on a cluster"): without it the node would change id at a failover."""
    if c.kafka_node_id < -1:
        raise ConfigError(f"kafka_node_id={c.kafka_node_id}: must be -1 (not set) or a node id >= 0")
    if c.kafka_port >= 0 and c.namesrv_addr and c.kafka_node_id < 0:
        raise ConfigError(f"kafka_port={c.kafka_port} on a cluster broker (namesrv_addr set) needs "
                          f"kafka_node_id: the Kafka node id of broker group {c.broker_name!r}, the "
                          f"same on each of its replicas and different in each group")


def _check_etcd(c: BrokerConfig) -> None:
    """etcd mode's settings (docs/cluster.md, "Consensus on etcd")."""
    if not c.etcd_endpoints:
        return
    from txbroker.cluster.etcd import parse_endpoints
    try:
        parse_endpoints(c.etcd_endpoints)
    except ValueError as exc:
        raise ConfigError(f"etcd_endpoints: {exc} (several separated by ';' or ',')") from None
    if c.controller_addr:
        raise ConfigError("etcd_endpoints and controller_addr are both set: a group's master is "
                          "elected either on etcd or by a controller, not both")
    if not c.namesrv_addr:
        raise ConfigError("etcd_endpoints is set without namesrv_addr: etcd mode is for a "
                          "cluster broker (a single broker is always its own master)")
    if not isinstance(c.etcd_lease, int) or c.etcd_lease < 2:
        raise ConfigError(f"etcd_lease={c.etcd_lease!r}: must be a whole number of seconds, at "
                          "least 2 (etcd's shortest lease with its default timing)")
    if not c.etcd_prefix.startswith("/") or len(c.etcd_prefix) > 128:
        raise ConfigError(f"etcd_prefix={c.etcd_prefix!r}: must start with '/' and be at most "
                          "128 characters")
    if (c.etcd_user is None) != (c.etcd_password is None):
        raise ConfigError("etcd_user and etcd_password: set both (etcd authentication) or "
                          "neither")


def _check_timing(c: BrokerConfig) -> None:
    """The cluster's time limits against each other (docs/cluster.md, "Time limits"): one
    line naming both settings and the values in force (a derived one says so)."""
    t = c.timing()
    lease = "etcd_lease" if c.etcd_endpoints else "controller_lease"
    shown = {"controller_heartbeat_interval": t.controller_heartbeat, lease: t.lease,
             "ha_heartbeat_interval": t.ha_heartbeat, "ha_idle_timeout": t.ha_idle_timeout,
             "slave_timeout": t.slave_timeout}

    def value(name: str) -> str:
        derived = " (derived)" if getattr(c, name) == 0 else ""
        return f"{name}={shown[name]:g}{derived}"

    def pair(ok: bool, a: str, b: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"{value(a)} and {value(b)}: {rule}")

    if not c.etcd_endpoints:  # etcd mode renews at a sixth of the lease, always
        pair(t.controller_heartbeat < t.lease / 2, "controller_heartbeat_interval", lease,
             "the heartbeat interval must be less than half the lease (one lost heartbeat must "
             "not cost the master its lease)")
    pair(t.ha_heartbeat < t.ha_idle_timeout / 2, "ha_heartbeat_interval", "ha_idle_timeout",
         "the HA heartbeat must be less than half the HA idle time-out")
    if not c.elected:
        return
    if t.lease < MIN_CONTROLLER_LEASE:
        raise ConfigError(f"controller_lease={t.lease:g}: must be at least "
                          f"{MIN_CONTROLLER_LEASE:g} s in controller mode (a master counts on "
                          f"{1 - LEASE_DRIFT:.0%} of it less {LEASE_SLACK:g} s)")
    pair(t.ha_idle_timeout <= t.lease, "ha_idle_timeout", lease,
         "with elected masters the HA idle time-out must not exceed the lease (a master must "
         "notice a silent slave within one lease)")
    pair(t.slave_timeout < t.lease, "slave_timeout", lease,
         "with elected masters the slave time-out must be shorter than the lease (a "
         "SYNC_MASTER send must be answered inside one lease)")


#: Listen hosts whose listeners share the port space of the metrics endpoint's 127.0.0.1.
_METRICS_SHARING_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "", "::")


def _check_ports_apart(c: BrokerConfig) -> None:
    """Two listeners of one broker on one fixed port: refused here, naming both settings,
    rather than as "address already in use" from the second bind, which reads as if another
    process held the port (``--broker-port 9876`` clashes with the default name-server port).
    Port 0 (ephemeral) and -1 (off) never clash."""
    ports = [("broker_port", c.broker_port)]
    if not c.namesrv_addr:  # the embedded name server listens only without name servers
        ports.append(("namesrv_port", c.namesrv_port))
    else:  # in a cluster the HA listener opens: its port, or RocketMQ's broker port + 1
        if c.ha_port == -1 and c.broker_port == 65535:
            raise ConfigError("ha_port=-1 means broker_port + 1, but broker_port is 65535: "
                              "set ha_port")
        ports.append(("ha_port", c.ha_port) if c.ha_port != -1 else
                     ("ha_port (-1: broker_port + 1)", c.broker_port + 1 if c.broker_port else 0))
    ports.append(("kafka_port", c.kafka_port))
    ports.append(("grpc_port", c.grpc_port))
    if c.listen_host in _METRICS_SHARING_HOSTS:
        ports.append(("metrics_port", c.metrics_port))
    seen: dict[int, str] = {}
    for name, port in ports:
        if port <= 0:
            continue
        if port in seen:
            raise ConfigError(f"{seen[port]} and {name} are both {port}: every listener of a "
                              f"broker needs its own port")
        seen[port] = name


def split_address(text: str, what: str = "address") -> tuple[str, int]:
    """``"host:port"`` -> (host, port); the ValueError names ``what`` and says what is wrong:
    not ``host:port`` at all, or a port outside 1..65535 (a different mistake, said apart)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{what} {text!r}: expected host:port")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{what} {text!r}: port {int(port)} is out of range 1..65535")
    return host, int(port)


def parse_address_list(text: str, what: str = "address") -> list[str]:
    """``"h1:p1;h2:p2"`` (RocketMQ's separator; commas accepted) -> the addresses; the
    ValueError (:func:`split_address`) names the first bad one.  The one parser of address
    lists: broker settings and the SDK's name-server list alike."""
    out = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        split_address(part, what)
        out.append(part)
    return out


#: A DNS host name (RFC 1123 labels) or a dotted IPv4 address.
_HOST_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def _host_ok(host: str) -> bool:
    """A host RocketMQ clients can dial as ``host:port`` (they split at the last ``:``, so
    an IPv6 literal, a wildcard or a name with spaces is refused here, not by every client)."""
    return bool(_HOST_RE.match(host)) and host != "0.0.0.0"


def format_bytes(n: int) -> str:
    """A size as an operator reads it: ``1 GiB``, ``256 KiB``; bytes when not a round unit."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def format_seconds(s: float) -> str:
    """A duration: ``72 h`` when whole hours, else seconds (``0.5 s``, ``60 s``)."""
    if s >= 3600 and s % 3600 == 0:
        return f"{s / 3600:g} h"
    return f"{s:g} s"


#: Settings that are sizes in bytes: they also take a binary unit (``64MiB``, ``1 GiB``).
SIZE_FIELDS = frozenset({"max_frame_size", "segment_size", "max_message_size",
                         "kafka_max_queued_bytes", "kafka_fetch_max_bytes",
                         "grpc_max_body_size"})
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
               "g": 1 << 30, "gib": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(name: str, raw: Any) -> int:
    """A byte count written as a number or with a binary unit: ``67108864``, ``64MiB``,
    ``64 MiB``, ``64M`` (K, M and G are powers of 1024, as RocketMQ's sizes are)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    match = _SIZE_RE.match(str(raw))
    unit = match and _SIZE_UNITS.get(match.group(2).lower())
    if not match or unit is None:
        raise ConfigError(f"{name}={raw!r}: must be a size in bytes, e.g. 67108864 or 64MiB "
                          f"(units KiB, MiB, GiB)")
    return int(match.group(1)) * unit


def _coerce(name: str, kind: type, raw: Any) -> Any:
    """Turn a string (environment, CLI) or TOML value into the field's type.  ``name`` is the
    field or its ``TXBROKER_*`` variable: either way a size field takes a unit."""
    if kind is int and name.removeprefix(ENV_PREFIX).lower() in SIZE_FIELDS:
        return parse_size(name, raw)
    if name.removeprefix(ENV_PREFIX).lower() == "workers" and str(raw).strip().lower() == "auto":
        return os.cpu_count() or 1
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={raw!r}: must be a boolean (true/false)")
    try:
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if kind is float:
            return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r}: must be a{'n integer' if kind is int else ' number'}") from None
    return str(raw)


def _field_types() -> dict[str, type]:
    kinds: dict[str, type] = {}
    for f in fields(BrokerConfig):
        t = str(f.type)
        kinds[f.name] = bool if t == "bool" else int if t == "int" else float if t == "float" else str
    return kinds


def load_config(
    options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    toml_path: str | os.PathLike[str] | None = None,
) -> BrokerConfig:
    """Merge TOML file < ``TXBROKER_*`` environment < explicit options, then validate.

    ``options`` holds only what the user actually set (``None`` values are ignored), so an
    unset CLI option never hides an environment variable.  Unknown keys are errors: a typo in a
    setting must not be silently ignored.
    """
    kinds = _field_types()
    merged: dict[str, Any] = {}
    if toml_path:
        try:
            with open(toml_path, "rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"config file {toml_path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {toml_path}: {exc}") from None
        section = doc.get("broker", doc)
        for key, value in section.items():
            if key not in kinds:
                raise ConfigError(f"config file {toml_path}: unknown setting {key!r}")
            merged[key] = _coerce(key, kinds[key], value)
    env = os.environ if environ is None else environ
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name in kinds:
            merged[name] = _coerce(key, kinds[name], value)
    for key, value in (options or {}).items():
        if value is None:
            continue
        if key not in kinds:
            raise ConfigError(f"unknown setting {key!r}")
        merged[key] = _coerce(key, kinds[key], value)
    try:
        return BrokerConfig(**merged)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def check_environ(environ: Mapping[str, str], also_known: Collection[str] = ()) -> None:
    """Refuse a ``TXBROKER_*`` variable that is neither a setting nor one of ``also_known``
    (the client commands' variables, e.g. ``TXBROKER_NAMESRV``, often exported in the same
    shell): :func:`load_config` reads only the names it knows, so a misspelt one
    (``TXBROKER_SEGMNT_SIZE``) would otherwise be ignored without a word.  The error names
    the closest known variable."""
    settings = {f.name for f in fields(BrokerConfig)}
    # Compared without the shared prefix, which would make every name look alike.
    known = sorted({name.upper() for name in settings}
                   | {v[len(ENV_PREFIX):] for v in also_known if v.startswith(ENV_PREFIX)})
    for key in sorted(environ):
        if not key.startswith(ENV_PREFIX) or key[len(ENV_PREFIX):].lower() in settings \
                or key in also_known or key in IMPORT_VARIABLES:
            continue
        close = difflib.get_close_matches(key[len(ENV_PREFIX):].upper(), known, n=1)
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        raise ConfigError(f"unknown variable {key}: no setting or option reads it{hint}")


def config_to_toml(config: BrokerConfig) -> str:
    """The settings as a ``[broker]`` TOML table that :func:`load_config` reads back unchanged
    (``txbroker serve --print-config``); an unset setting is a comment (TOML has no null)."""
    lines = ["[broker]"]
    for name, value in config.as_dict().items():
        if name in SECRET_SETTINGS and value is not None:
            lines.append(f"# {name} is set (not printed)")
        elif value is None:
            lines.append(f"# {name} is unset")
        elif isinstance(value, bool):
            lines.append(f"{name} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{name} = {value!r}")
        else:
            lines.append(f"{name} = {json.dumps(value)}")  # a JSON string is a TOML basic string
    return "\n".join(lines) + "\n"
