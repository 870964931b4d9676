"""``txbroker serve``: run a broker in the foreground until SIGINT/SIGTERM.

Every :class:`~txbroker.config.BrokerConfig` field has an option of the same name
(``broker_port`` → ``--broker-port``); values are handed to :func:`~txbroker.config.load_config`
as text so that options, ``TXBROKER_*`` variables and the ``--config`` TOML file share one
validation and one error format.  An invalid value prints one ``error:`` line and exits 2.
``--help`` shows each option's unit (the metavar: BYTES, SECONDS, PORT, ...) and real default.

Start-up logs one block at INFO (addresses, data dir, what recovery did, key settings); every
setting is logged at DEBUG, and ``--print-config`` prints them as TOML and exits before binding
or touching anything.  Once every port listens, exactly one line
``txbroker ready broker=HOST:PORT namesrv=HOST:PORT`` (plus `` kafka=HOST:PORT`` when the Kafka
listener is on, then `` grpc=HOST:PORT`` when the gRPC endpoint is) goes to stdout (tests and scripts wait for it; with ``--namesrv-addr`` the broker registers with those name servers instead of
embedding one, and ``namesrv=`` shows that list); logs go to stderr.  A port clash or a data directory held by another broker is one
``error:`` line naming the address or the directory (and the holder's pid), exit 1.
With ``--workers N`` (N > 1) this process supervises N broker processes behind the embedded
name server instead (txbroker/workers.py, docs/workers.md); its ready line adds
`` workers=ADDR;ADDR...``.
Listening beyond loopback with a port in plaintext or without authentication, one
``warning:`` line naming those ports goes to stderr before the ready line
(:mod:`txbroker.service.exposure`); on loopback (the quick start) nothing is added.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import typing
from dataclasses import MISSING, Field, fields
from typing import NamedTuple

import click

from txbroker.cli.common import check_setting_variables, warn_exposure
from txbroker.config import (
    BrokerConfig,
    ConfigError,
    config_to_toml,
    format_bytes,
    format_seconds,
    load_config,
)
from txbroker.service.exposure import Listener

log = logging.getLogger("txbroker.serve")


class _Opt(NamedTuple):
    """How one BrokerConfig field reads in ``--help``: its value's kind (the metavar: the unit,
    for sizes and durations) and what it does; ``default`` replaces the raw default where that
    would say nothing (an empty string, None)."""

    metavar: str
    help: str
    default: str | None = None


#: One entry per BrokerConfig field (checked at import: a new field without help fails loudly).
_OPTIONS: dict[str, _Opt] = {
    "listen_host": _Opt("HOST", "interface to listen on (0.0.0.0 = every IPv4 interface)"),
    "broker_port": _Opt("PORT", "broker port (0 = ephemeral)"),
    "namesrv_port": _Opt("PORT", "embedded name-server port (0 = ephemeral, -1 = off; the broker "
                                 "port answers name-server requests too)"),
    "advertised_host": _Opt("HOST", "host announced in routes and message ids",
                            "the listen host; 127.0.0.1 when that is a wildcard"),
    "metrics_port": _Opt("PORT", "Prometheus /metrics port on 127.0.0.1 (0 = ephemeral, -1 = off)"),
    "max_connections": _Opt("COUNT", "client connections accepted at once"),
    "max_inflight_per_connection": _Opt("COUNT", "requests handled at once per connection before "
                                                 "the broker stops reading from it"),
    "max_frame_size": _Opt("BYTES", "largest request frame accepted"),
    "broker_name": _Opt("NAME", "broker name announced in routes"),
    "cluster_name": _Opt("NAME", "cluster name announced in routes"),
    "data_dir": _Opt("PATH", "directory for the commitlog, consume queues, offsets and topics; "
                             "one broker per directory (it holds DIR/lock)"),
    "segment_size": _Opt("BYTES", "commitlog segment file size; each segment is preallocated on "
                                  "disk in full when created (the first by the first message); "
                                  "takes a unit too: 64MiB, 1GiB"),
    "consume_queue_entries": _Opt("COUNT", "entries per consume-queue file (20 bytes each)"),
    "flush_mode": _Opt("MODE", "async: flush every --flush-interval; sync: acknowledge a send "
                               "only once it is on disk (group commit)"),
    "flush_interval": _Opt("SECONDS", "async mode: how often written data is flushed to disk"),
    "sync_flush_timeout": _Opt("SECONDS", "sync mode: a send not on disk within this is answered "
                                          "FLUSH_DISK_TIMEOUT (it is still stored)"),
    "offset_persist_interval": _Opt("SECONDS", "how often consumer offsets are written to disk"),
    "max_message_size": _Opt("BYTES", "largest message body accepted"),
    "file_reserved_time": _Opt("SECONDS", "commitlog segments older than this are deleted (never "
                                          "the one being written)"),
    "disk_max_used_ratio": _Opt("RATIO", "sends are refused while the data disk is fuller than "
                                         "this fraction (0 < RATIO <= 1)"),
    "default_queue_nums": _Opt("COUNT", "queues of a topic created automatically"),
    "auto_create_topic": _Opt("", "create a topic on its first send"),
    "transaction_check_interval": _Opt("SECONDS", "time between transaction check passes"),
    "transaction_timeout": _Opt("SECONDS", "age of a half message before its first check-back"),
    "transaction_check_max": _Opt("COUNT", "check-backs before a half message is set aside to "
                                           "TRANS_CHECK_MAX_TIME_TOPIC"),
    "check_concurrency": _Opt("COUNT", "check-backs in flight at once"),
    "transaction_history_size": _Opt("COUNT", "decided transactions remembered for 'txn show' and "
                                              "repeated decisions (0 = none; ~0.5 KB each)"),
    "timer_max_delay": _Opt("SECONDS", "furthest ahead a timer message may be scheduled "
                                       "(RocketMQ's timerMaxDelaySec)"),
    "timer_max_pending": _Opt("COUNT", "timer messages waiting at most; a timer send past it is "
                                       "refused (8 bytes each in memory, plus ~170 per second "
                                       "that has one)"),
    "timer_roll_window": _Opt("SECONDS", "a timer still waiting this long after it was stored is "
                                         "written again, bounding recovery"),
    "max_pull_suspend": _Opt("SECONDS", "longest a long-polling pull is held, whatever the "
                                        "client asks"),
    "max_reconsume_times": _Opt("COUNT", "redeliveries before a message goes to the group's "
                                         "dead-letter topic"),
    "pop_max_batch": _Opt("COUNT", "most messages one POP receive returns"),
    "pop_min_invisible_ms": _Opt("MS", "shortest invisible time a POP receive may ask for"),
    "pop_max_invisible_ms": _Opt("MS", "longest invisible time a POP receive may ask for"),
    "pop_max_poll": _Opt("SECONDS", "longest a POP receive with nothing to return is held"),
    "pop_max_waiters": _Opt("COUNT", "POP receives held at once (more: too many requests)"),
    "pop_max_inflight": _Opt("COUNT", "messages one POP group may hold unacknowledged"),
    "pop_fifo_groups": _Opt("GROUPS", "consumer groups whose POP receives are FIFO, 'g1,g2'",
                            "none"),
    "shutdown_grace": _Opt("SECONDS", "at stop, how long in-flight requests may finish"),
    "workers": _Opt("COUNT", "broker processes on this machine, one broker group each behind the "
                             "name server, worker i on every port + 10*i and in DATA_DIR/worker-i "
                             "('auto' = one per CPU; docs/workers.md)"),
    "namesrv_addr": _Opt("ADDRS", "name servers to register with, 'h1:9876;h2:9876'; empty = the "
                                  "embedded name server (one process is the whole installation)",
                          "empty: embedded name server"),
    "broker_id": _Opt("ID", "0 = master of --broker-name, 1 or more = a slave replicating it"),
    "broker_role": _Opt("ROLE", "how a master acknowledges sends: after its own write "
                                "(ASYNC_MASTER) or once --min-in-sync-replicas slaves have them "
                                "(SYNC_MASTER)"),
    "ha_port": _Opt("PORT", "replication listener, opened in a cluster (0 = ephemeral)",
                    "-1: broker port + 1"),
    "ha_master_addr": _Opt("HOST:PORT", "a slave's master HA address", "empty: learned from the "
                                        "name servers or the controller"),
    "min_in_sync_replicas": _Opt("COUNT", "SYNC_MASTER: slaves that must hold a send before it "
                                          "is acknowledged (under a controller, every slave of "
                                          "the in-sync set too, and at least this many)"),
    "slave_timeout": _Opt("SECONDS", "SYNC_MASTER: a send not replicated within this is answered "
                                     "FLUSH_SLAVE_TIMEOUT (it is still stored); must be shorter "
                                     "than the etcd or controller lease",
                          "0: half the lease with elected masters (etcd or controller mode), else 3 s"),
    "register_interval": _Opt("SECONDS", "how often the broker registers with every name server"),
    "metadata_sync_interval": _Opt("SECONDS", "how often a slave copies topics from its master "
                                              "(classic and controller mode)"),
    "controller_addr": _Opt("ADDRS", "controllers that elect this group's master, 'h:p;h:p'; "
                                     "empty = roles fixed by --broker-id", "empty: no controller"),
    "controller_heartbeat_interval": _Opt("SECONDS", "controller mode: heartbeat period"),
    "controller_lease": _Opt("SECONDS", "controller mode: a master that has not renewed its lease "
                                        "within this stops accepting writes; the controller "
                                        "promotes a slave after it"),
    "etcd_endpoints": _Opt("ADDRS", "etcd members holding the cluster's state, 'h:p;h:p': the "
                                    "group's master is the holder of its leader key (no "
                                    "controller); docs/cluster.md", "empty: not etcd mode"),
    "etcd_prefix": _Opt("KEY", "etcd mode: the cluster's keys live under "
                               "PREFIX/<cluster>/<broker name>/"),
    "etcd_lease": _Opt("SECONDS", "etcd mode: the broker's etcd lease (whole seconds, at least "
                                  "2); a master that has not renewed it within this stops "
                                  "writing, and a slave is elected once etcd drops it"),
    "etcd_user": _Opt("USER", "etcd authentication: the etcd user", "unset: none"),
    "etcd_password": _Opt("SECRET", "etcd authentication: its password (prefer "
                                    "TXBROKER_ETCD_PASSWORD or --config)", "unset"),
    "ha_heartbeat_interval": _Opt("SECONDS", "replication: an idle HA connection carries a "
                                             "heartbeat this often (less than half the HA idle "
                                             "time-out)",
                                  "0: a quarter of the HA idle time-out with elected masters, else 5 s"),
    "ha_idle_timeout": _Opt("SECONDS", "replication: an HA connection silent this long is dropped "
                                       "(at most the etcd or controller lease)",
                            "0: the lease with elected masters (etcd or controller mode), else 20 s"),
    "grpc_port": _Opt("PORT", "RocketMQ 5.x gRPC endpoint (5.x clients without a proxy; "
                             "0 = ephemeral, -1 = off)"),
    "grpc_max_body_size": _Opt("BYTES", "largest body a gRPC producer may send (told to 5.x "
                                        "clients in their settings)", "0: max_message_size"),
    "kafka_port": _Opt("PORT", "Kafka-protocol listener (Kafka clients, same topics and store; "
                               "0 = ephemeral, -1 = off)"),
    "kafka_transaction_max_timeout": _Opt("SECONDS", "longest transaction.timeout.ms a Kafka "
                                                     "producer may ask for"),
    "kafka_transaction_scan_interval": _Opt("SECONDS", "how often open Kafka transactions are "
                                                       "checked for their timeout"),
    "kafka_transaction_max_bytes": _Opt("BYTES", "record bytes one open Kafka transaction may "
                                                 "stage before its commit"),
    "kafka_transactions_max_bytes": _Opt("BYTES", "record bytes all open Kafka transactions "
                                                  "together may stage"),
    "kafka_snapshot_interval": _Opt("SECONDS", "how often the Kafka coordinator snapshots its "
                                               "state when it changed (recovery reads the latest)"),
    "kafka_snapshot_records": _Opt("COUNT", "Kafka coordinator state records between snapshots "
                                            "(at least as many as there are transactional ids)"),
    "kafka_transactional_id_expiration": _Opt("SECONDS", "a Kafka transactional id idle this "
                                                         "long is forgotten (7 days)"),
    "kafka_group_initial_rebalance_delay": _Opt("SECONDS", "a new Kafka consumer group waits this "
                                                           "long for more members first"),
    "kafka_group_min_session_timeout": _Opt("SECONDS", "shortest Kafka consumer session timeout "
                                                       "accepted"),
    "kafka_group_max_session_timeout": _Opt("SECONDS", "longest Kafka consumer session timeout "
                                                       "accepted"),
    "kafka_node_id": _Opt("ID", "Kafka node id of this broker group: the same on each replica, "
                                "different per group; needed with --kafka-port in a cluster",
                          "-1: node 0 on a single broker"),
    "kafka_cluster_refresh_interval": _Opt("SECONDS", "cluster: how often the Kafka view of the "
                                                      "groups, masters and topics is refreshed"),
    "kafka_max_inflight_per_connection": _Opt("COUNT", "Kafka requests read and not yet "
                                                       "answered per connection before the broker "
                                                       "stops reading from it"),
    "kafka_max_queued_bytes": _Opt("BYTES", "bytes of Kafka requests waiting their turn per "
                                            "connection before the broker stops reading from it"),
    "kafka_fetch_max_bytes": _Opt("BYTES", "largest Kafka Fetch answer, whatever the client "
                                           "asks for (a first batch larger than it is still "
                                           "sent whole)"),
    "kafka_offsets_retention": _Opt("SECONDS", "offsets of a Kafka group without members are "
                                               "deleted this long after it became empty, and "
                                               "the group with them"),
    "kafka_offsets_retention_check_interval": _Opt("SECONDS", "how often expired Kafka offsets "
                                                              "and groups are looked for"),
    "kafka_sasl_mechanisms": _Opt("LIST", "SASL mechanisms Kafka clients must authenticate "
                                          "with, comma-separated: PLAIN, SCRAM-SHA-256, "
                                          "SCRAM-SHA-512", "empty: no authentication"),
    "kafka_sasl_plain_over_plaintext": _Opt("", "offer PLAIN (the password in the clear) on "
                                                "plaintext Kafka connections too (TLS ones "
                                                "always offer it)"),
    "kafka_sasl_max_receive_size": _Opt("BYTES", "largest frame read from a Kafka connection "
                                                 "before it authenticated"),
    "acl_file": _Opt("PATH", "RocketMQ plain_acl.yml; setting it turns access control on",
                     "unset: access control off"),
    "acl_access_key": _Opt("KEY", "this broker's account in --acl-file: it signs the requests "
                                  "this broker sends to other brokers (a slave's metadata sync)",
                           "unset: unsigned"),
    "users_file": _Opt("PATH", "the user store written by 'txbroker user' (passwords as SCRAM "
                               "credentials, access keys, roles), read again when it changes",
                       "unset: no user store"),
    "cluster_secret": _Opt("SECRET", "shared by every broker, controller and name server of the "
                                     "cluster: replication, registration and controller requests "
                                     "must prove it (prefer "
                                     "TXBROKER_CLUSTER_SECRET or --config: a command line is "
                                     "visible to every user of the machine)",
                           "unset: peers are trusted"),
    "tls_mode": _Opt("MODE", "TLS on the broker, Kafka, name-server, HA and metrics ports: "
                             "permissive also accepts plaintext on the same port, enforcing "
                             "closes plaintext connections"),
    "tls_cert": _Opt("PATH", "PEM server certificate (chain); re-read when the file changes",
                     "unset"),
    "tls_key": _Opt("PATH", "PEM key of --tls-cert; re-read when the file changes", "unset"),
    "tls_ca": _Opt("PATH", "PEM CA that client certificates (and, with --tls-peers, the "
                           "peers this broker dials) are verified against",
                   "unset"),
    "tls_client_auth": _Opt("MODE", "client certificates: none, optional (verified when sent) "
                                    "or required (mTLS; needs --tls-ca)"),
    "tls_peers": _Opt("WHEN", "dial the name servers, the controller, the group's master and "
                              "other brokers' Kafka ports with TLS, verified against --tls-ca, "
                              "presenting --tls-cert "
                              "(auto: when --tls-mode is enforcing)"),
}
_missing = {f.name for f in fields(BrokerConfig)} ^ set(_OPTIONS)
if _missing:
    raise RuntimeError(f"serve options and BrokerConfig fields differ: {sorted(_missing)}")


class _Choices(click.Choice):
    """A choice shown in ``--help`` and offered to shell completion, but checked by
    load_config like every other value, so a wrong one gets the same one-line error whether it
    came from an option, a TXBROKER_* variable or the TOML file."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        return value


def _default_text(f: Field, opt: _Opt) -> str:
    """The field's real default as an operator reads it (sizes also in KiB/MiB/GiB)."""
    if opt.default is not None:
        return opt.default
    value = f.default if f.default is not MISSING else None
    if isinstance(value, bool):
        return "on" if value else "off"
    if opt.metavar == "BYTES":
        human = format_bytes(value)
        return str(value) if human.endswith("bytes") else f"{value} ({human})"
    if opt.metavar == "SECONDS":
        human = format_seconds(value)
        return f"{value:g}" if human.endswith(" s") else f"{value:g} ({human})"
    if opt.metavar == "PORT" and value == -1:
        return "-1 (off)"
    return str(value)


def _config_options(fn):
    """One option per BrokerConfig field.  Values stay text (None = not given) so that
    load_config applies one precedence and one validation to options, environment and TOML."""
    hints = typing.get_type_hints(BrokerConfig)
    for f in reversed(fields(BrokerConfig)):
        opt = _OPTIONS[f.name]
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{opt.help}  [default: {_default_text(f, opt)}]"
        hint = hints[f.name]
        if hint is bool:
            fn = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)(fn)
        elif typing.get_origin(hint) is typing.Literal:  # --help lists them: [async|sync]
            fn = click.option(flag, f.name, type=_Choices(typing.get_args(hint)), default=None,
                              help=help_text)(fn)
        else:
            fn = click.option(flag, f.name, type=str, default=None, metavar=opt.metavar,
                              help=help_text)(fn)
    return fn


@click.command("serve")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="TOML file with settings (top level or a [broker] table); "
              "options and TXBROKER_* variables override it  [default: no file]")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="stderr log level; DEBUG also logs every setting")
@click.option("--print-config", is_flag=True, default=False,
              help="print the effective settings as TOML (usable with --config) and exit, "
              "binding nothing and touching no file")
@_config_options
def serve(config_file: str | None, log_level: str, print_config: bool, **options: object) -> None:
    """Run a txbroker broker (with its embedded name server) until SIGINT/SIGTERM.

    Settings: options > TXBROKER_<SETTING> environment variables (e.g.
    TXBROKER_SEGMENT_SIZE) > --config file > defaults.  Sizes are bytes, durations seconds.
    A TXBROKER_* variable that nothing reads (a typo) is an error.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_setting_variables()
    try:
        config = load_config(options, os.environ, config_file)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if print_config:
        click.echo(config_to_toml(config), nl=False)
        return
    for key, value in config.as_dict().items():
        log.debug("config %s = %r", key, value)
    from txbroker._compiled import in_use
    log.debug("hot path: %s", in_use())  # compiled, or pure Python (not built / switched off)
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        code = runner.run(_run(config) if config.workers == 1 else _run_workers(config, log_level))
    sys.exit(code)


async def _run(config: BrokerConfig) -> int:
    from txbroker.broker import Broker, ListenError
    from txbroker.store.commitlog import SegmentSizeError
    from txbroker.store.lock import DataDirInUseError

    broker = Broker(config)
    try:
        await broker.start()
    except ConfigError as exc:  # an invalid ACL file: a setting's fault, like a bad option
        click.echo(f"error: {exc}", err=True)
        return 2
    except DataDirInUseError as exc:
        click.echo(f"error: {exc}; stop it or use another --data-dir", err=True)
        return 1
    except SegmentSizeError as exc:
        click.echo(f"error: data dir {config.data_dir} holds {format_bytes(exc.found)} commitlog "
                   f"segments, --segment-size is {format_bytes(exc.configured)}: a data dir keeps "
                   f"the segment size it was created with; start with --segment-size "
                   f"{exc.found} or use another --data-dir", err=True)
        return 1
    except ListenError as exc:  # names the address and the listener
        click.echo(f"error: {exc}", err=True)
        return 1
    except OSError as exc:
        click.echo(f"error: cannot start broker: {exc}", err=True)
        await broker.stop()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    warn_exposure(config.listen_host, broker_listeners(broker))
    ready = f"txbroker ready broker={broker.broker_addr} namesrv={broker.namesrv_addr}"
    if broker.kafka_port >= 0:
        ready += f" kafka={broker.host}:{broker.kafka_port}"
    if broker.grpc_port >= 0:
        ready += f" grpc={broker.host}:{broker.grpc_port}"
    click.echo(ready)
    sys.stdout.flush()
    await stop.wait()
    log.info("shutting down (grace %.1fs)", config.shutdown_grace)
    await broker.stop()
    return 0


async def _run_workers(config: BrokerConfig, log_level: str) -> int:
    """``--workers N`` (N > 1): the name server and N broker processes (txbroker/workers.py),
    one ready line for them all (`` workers=ADDR;ADDR`` added), stopped together."""
    from txbroker.broker import ListenError
    from txbroker.store.lock import DataDirInUseError
    from txbroker.workers import Supervisor, WorkerStartError

    try:
        supervisor = Supervisor(config, log_level=log_level.upper())
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    try:
        await supervisor.start()
    except DataDirInUseError as exc:
        click.echo(f"error: {exc}; stop it or use another --data-dir", err=True)
        return 1
    except ListenError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except WorkerStartError as exc:
        if exc.returncode in (1, 2):  # the worker printed its own error line: one is enough
            log.error("%s; the other workers were stopped", exc)
            return exc.returncode
        click.echo(f"error: {exc}", err=True)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if supervisor.namesrv is not None:  # each worker warns about its own ports
        warn_exposure(config.listen_host, [Listener(supervisor.namesrv.port, "name server",
                                                    config.tls_mode == "enforcing",
                                                    config.cluster_secret is not None)])
    click.echo(supervisor.ready_line())
    sys.stdout.flush()
    await stop.wait()
    log.info("shutting down %d workers (grace %.1fs)", len(supervisor.workers),
             config.shutdown_grace)
    await supervisor.stop()
    return 0


def broker_listeners(broker: typing.Any) -> list[Listener]:
    """A started broker's ports beyond loopback, as the exposure warning sees them: TLS is
    ``tls_mode`` on the broker, Kafka, embedded name server and HA ports (permissive still takes
    plaintext); authentication is the ACL on the broker port, SASL on the Kafka port, the
    cluster secret on the HA port.  The metrics port listens on loopback only."""
    cfg = broker.config
    tls = cfg.tls_mode == "enforcing"
    out = [Listener(broker.broker_port, "remoting", tls, cfg.acl_file is not None)]
    if broker.namesrv_port > 0:
        out.append(Listener(broker.namesrv_port, "name server", tls, None))
    if broker.kafka_port >= 0:
        out.append(Listener(broker.kafka_port, "kafka", tls,
                            bool(cfg.kafka_sasl_mechanism_list())))
    if broker.grpc_port >= 0:
        out.append(Listener(broker.grpc_port, "gRPC", tls, cfg.acl_file is not None))
    if broker.roles is not None:
        out.append(Listener(broker.roles.ha_port, "HA", tls, cfg.cluster_secret is not None))
    return out
