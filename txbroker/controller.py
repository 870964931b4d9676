"""The controller process: keeps every broker group's master, master epoch and in-sync replica
set and promotes a slave when the master's lease runs out (RocketMQ 5.x controller mode
without Raft; docs/cluster.md "Controller and failover").

A composition root like ``broker.py``: it binds ``host:port`` first (a port clash leaves no
trace on disk), takes the data directory's lock, loads the persisted state, then serves the
controller requests on a :class:`RemotingServer` and runs the lease scan.

One controller runs at a time.  Its state (``<data_dir>/controller.json``) is written
atomically (temp file, fsync, rename, directory fsync) after every change and before the
answer or the notification that reveals the change leaves, so a restart on the same directory
resumes with the same epochs and never hands out an epoch twice.  The write is small and rare
(registrations, elections, set changes; heartbeats change nothing durable) and runs on the
loop on purpose: no request can interleave between a change and its write, and a failed write
rolls the change back before anyone hears of it.  While the controller is down, brokers keep
their roles and keep serving; only failover stops.

After any change of a group's master (by request or by the scan) NOTIFY_BROKER_ROLE_CHANGED
goes one-way to every member of the group connected to this controller, on the connection the
member itself opened (as CHECK_TRANSACTION_STATE goes to a producer).

With ``cluster_secret`` set, the brokers' requests must come in the cluster envelope: signed
over their named fields and body, fresh and never seen before (anything else is refused
NO_PERMISSION before a handler sees it); the answers are signed over the nonce of the request
they answer, and the notices are sent in an envelope of their own
(:mod:`txbroker.service.cluster_auth`).  With ``tls_mode`` set the port speaks TLS like the
broker's (:mod:`txbroker.remoting.tls_listener`), so the notices do too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import orjson

from txbroker.broker import bind_listener
from txbroker.cluster.replicas import (
    ControllerError,
    FencedMasterEpoch,
    GroupView,
    ReplicasInfo,
)
from txbroker.config import (
    MIN_SECRET_LENGTH,
    BrokerConfig,
    TlsClientAuth,
    TlsMode,
    check_tls,
)
from txbroker.remoting.bodies import broker_label
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    BrokerHeartbeatRequestHeader,
    BrokerHeartbeatResponseHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    MasterInfoHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    decode_sync_state_set,
    encode_sync_state_set,
)
from txbroker.remoting.errors import Refusal
from txbroker.remoting.server import Connection, RemotingServer
from txbroker.remoting.tls import server_tls
from txbroker.service.cluster_auth import ClusterGuard, sign_request
from txbroker.store.lock import DataDirLock

log = logging.getLogger("txbroker.controller")

STATE_FILE = "controller.json"
#: What brokers send: signed when a cluster secret is set (GET_REPLICA_INFO only reads).
BROKER_CODES = frozenset({RequestCode.CONTROLLER_REGISTER_BROKER, RequestCode.BROKER_HEARTBEAT,
                          RequestCode.CONTROLLER_ELECT_MASTER,
                          RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET})


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    listen_host: str = "127.0.0.1"
    port: int = 9878
    data_dir: str = "./txbroker-controller"
    #: A replica is alive while its last heartbeat is younger than this (seconds).
    lease: float = 3.0
    #: How often masters' leases are checked; None = a quarter of the lease.
    scan_interval: float | None = None
    #: At stop, how long in-flight requests may finish.
    shutdown_grace: float = 1.0
    #: The brokers' ``cluster_secret`` (None: any peer's request is obeyed).  Never logged.
    cluster_secret: str | None = field(default=None, repr=False)
    #: TLS on the controller port: the broker's ``tls_*`` settings, with the same meaning
    #: (docs/security.md "TLS").  Role-change notices travel on the brokers' own connections,
    #: so they are TLS whenever those are.
    tls_mode: TlsMode = "off"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_client_auth: TlsClientAuth = "none"

    def __post_init__(self) -> None:
        check_tls(self)
        if self.cluster_secret is not None and len(self.cluster_secret) < MIN_SECRET_LENGTH:
            raise ValueError(f"cluster_secret must be at least {MIN_SECRET_LENGTH} characters")
        if self.lease <= 0:
            raise ValueError(f"lease must be positive, got {self.lease}")
        if self.scan_interval is not None and self.scan_interval <= 0:
            raise ValueError(f"scan_interval must be positive, got {self.scan_interval}")


class ControllerStateError(Exception):
    """The state file cannot be read or written; the message names the file."""


class ControllerProcess:
    """One controller: ``await start()``, ``addr``, ``state``, ``await stop()``."""

    def __init__(self, config: ControllerConfig, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.data_dir = Path(os.path.abspath(config.data_dir))
        self.state_path = self.data_dir / STATE_FILE
        self.state = ReplicasInfo(lease=config.lease, clock=clock)
        self.port = 0
        self.server: RemotingServer | None = None
        self._lock = DataDirLock(self.data_dir)
        self._saved: dict[str, Any] = self.state.to_json()
        #: broker name -> (master id, master epoch) last told to the group's members.
        self._announced: dict[str, tuple[int | None, int]] = {}
        #: broker name -> broker id -> the connection that member last spoke on.
        self._members: dict[str, dict[int, Connection]] = {}
        self._scan_task: asyncio.Task | None = None
        #: Refuses brokers' requests not in the cluster envelope (when a secret is set: signed,
        #: fresh, never seen before); ``guard.signed`` signs the answers over their nonce.
        self.guard = ClusterGuard(config.cluster_secret, BROKER_CODES)
        #: The port's TLS (None: plaintext); a certificate or key that cannot be loaded is a
        #: TLSConfigError here, before anything binds.
        self.tls = server_tls(config)

    @property
    def addr(self) -> str:
        return f"{self.config.listen_host}:{self.port}"

    @property
    def scan_interval(self) -> float:
        return self.config.scan_interval or self.config.lease / 4

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        sock = bind_listener(cfg.listen_host, cfg.port, "controller port")
        try:
            self._lock.acquire()
            try:
                self._load()
            except BaseException:
                self._lock.release()
                raise
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.server = RemotingServer(BrokerConfig(listen_host=cfg.listen_host),
                                     before_request=self.guard, tls=self.tls,
                                     what="controller port")
        for code, handler in {
            RequestCode.CONTROLLER_REGISTER_BROKER: self._register,
            RequestCode.BROKER_HEARTBEAT: self._heartbeat,
            RequestCode.CONTROLLER_ELECT_MASTER: self._elect,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self._alter_sync_state_set,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self._get_replica_info,
        }.items():
            self.server.register(code, self.guard.signed(handler))
        self.server.on_disconnect(self._disconnected)
        await self.server.start(cfg.listen_host, self.port, sock=sock)
        self._scan_task = asyncio.create_task(self._scan_loop(), name="txbroker-controller-scan")
        log.info("controller listening on %s, lease %.3g s, state %s (%d group(s))",
                 self.addr, cfg.lease, self.state_path, len(self.state.groups()))

    async def stop(self) -> None:
        if self._scan_task is not None:
            self._scan_task.cancel()
            try:
                await self._scan_task
            except asyncio.CancelledError:
                pass
            self._scan_task = None
        if self.server is not None:
            await self.server.close(self.config.shutdown_grace)
            self.server = None
        self._lock.release()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- persistence ---------------------------------------------------------------------
    def _load(self) -> None:
        try:
            raw = self.state_path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ControllerStateError(f"cannot read controller state {self.state_path}: "
                                       f"{exc.strerror or exc}") from None
        try:
            self.state.restore(orjson.loads(raw))
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise ControllerStateError(f"controller state {self.state_path} is unreadable: "
                                       f"{exc}") from None
        self._saved = self.state.to_json()
        for name in self.state.groups():
            view = self.state.replica_info(name)
            self._announced[name] = (view.master_broker_id, view.master_epoch)

    def _write(self, doc: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_path)
            fd = os.open(self.data_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _commit(self) -> None:
        """Persist what changed, then announce master changes; a failed write undoes the
        change and refuses the request (SYSTEM_ERROR) before anyone has heard of it."""
        doc = self.state.to_json()
        if doc != self._saved:
            try:
                self._write(doc)
            except OSError as exc:
                self.state.restore(self._saved)
                log.error("cannot write controller state %s: %s", self.state_path, exc)
                raise Refusal(ResponseCode.SYSTEM_ERROR,
                              f"controller state {self.state_path} not written: "
                              f"{exc.strerror or exc}") from None
            self._saved = doc
        for name in self.state.groups():
            view = self.state.replica_info(name)
            now = (view.master_broker_id, view.master_epoch)
            if self._announced.get(name, (None, 0)) != now:
                self._announced[name] = now
                master = "none" if view.master_broker_id is None else \
                    self._label(name, view.master_broker_id)
                log.info("group %s: master %s, epoch %d, in sync: %s", name, master,
                         view.master_epoch,
                         ", ".join(self._label(name, i) for i in sorted(view.sync_state_set)))
                self._notify(view)

    def _label(self, broker_name: str, broker_id: int) -> str:
        """A replica as brokers and ``txbroker status`` name it (``name@address``), with the
        configured id the controller keys it by."""
        addr = self.state.replicas(broker_name).get(broker_id, ("", ""))[0]
        return f"{broker_label(broker_name, addr)} (id {broker_id})" if addr else \
            f"{broker_name} id {broker_id}"

    def _notify(self, view: GroupView) -> None:
        header = _master_header(NotifyBrokerRoleChangedRequestHeader, view)
        body = encode_sync_state_set(view.sync_state_set, view.sync_state_set_epoch)
        for conn in list(self._members.get(view.broker_name, {}).values()):
            if not conn.closed:
                cmd = RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                              header.to_ext(), body, oneway=True)
                if self.config.cluster_secret is not None:
                    sign_request(cmd, self.config.cluster_secret)
                conn.send_oneway(cmd)

    # --- membership ----------------------------------------------------------------------
    def _member(self, conn: Connection, broker_name: str, broker_id: int) -> None:
        self._members.setdefault(broker_name, {})[broker_id] = conn

    def _disconnected(self, conn: Connection) -> None:
        for members in self._members.values():
            for broker_id in [i for i, c in members.items() if c is conn]:
                del members[broker_id]

    # --- the lease scan ------------------------------------------------------------------
    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval)
            try:
                self.scan_once()
            except Refusal:
                pass  # the write failed and was logged; the next scan tries again
            except Exception:
                log.exception("controller scan failed")

    def scan_once(self) -> list[GroupView]:
        """One lease check: elect where a master's lease ran out, persist, notify."""
        changed = self.state.scan()
        if changed:
            self._commit()
        return changed

    # --- handlers ------------------------------------------------------------------------
    async def _register(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = RegisterBrokerToControllerRequestHeader.from_ext(cmd.ext_fields)
        view = self.state.register(h.cluster_name, h.broker_name, h.broker_id,
                                   h.broker_address, h.ha_server_addr)
        self._member(conn, h.broker_name, h.broker_id)
        self._commit()
        return _answer(cmd, RegisterBrokerToControllerResponseHeader, view)

    async def _heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = BrokerHeartbeatRequestHeader.from_ext(cmd.ext_fields)
        timeout = None if h.heartbeat_timeout_mills is None else h.heartbeat_timeout_mills / 1000
        try:
            view = self.state.heartbeat(h.broker_name, h.broker_id, epoch=h.epoch,
                                        max_offset=h.max_offset, confirm_offset=h.confirm_offset,
                                        timeout=timeout, priority=h.election_priority,
                                        address=h.broker_addr)
        except FencedMasterEpoch as exc:  # registered and alive, under an old epoch
            self._member(conn, h.broker_name, h.broker_id)
            return _refuse(cmd, BrokerHeartbeatResponseHeader, exc)
        except ControllerError as exc:
            return _refuse(cmd, BrokerHeartbeatResponseHeader, exc)
        self._member(conn, h.broker_name, h.broker_id)
        return _answer(cmd, BrokerHeartbeatResponseHeader, view)

    async def _elect(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ElectMasterRequestHeader.from_ext(cmd.ext_fields)
        try:
            view = self.state.elect(h.broker_name, h.broker_id, designate=h.designate_elect)
        except ControllerError as exc:
            return _refuse(cmd, ElectMasterResponseHeader, exc)
        self._commit()
        return _answer(cmd, ElectMasterResponseHeader, view)

    async def _alter_sync_state_set(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = AlterSyncStateSetRequestHeader.from_ext(cmd.ext_fields)
        members, epoch = decode_sync_state_set(cmd.body)
        try:
            new_epoch = self.state.alter_sync_state_set(h.broker_name, h.master_broker_id,
                                                        h.master_epoch, members, epoch)
        except ControllerError as exc:
            return _refuse(cmd, MasterInfoHeader, exc)
        self._commit()
        view = self.state.replica_info(h.broker_name)
        return cmd.response(ext=AlterSyncStateSetResponseHeader(
            new_sync_state_set_epoch=new_epoch).to_ext(),
            body=encode_sync_state_set(view.sync_state_set, view.sync_state_set_epoch))

    async def _get_replica_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetReplicaInfoRequestHeader.from_ext(cmd.ext_fields)
        view = self.state.replica_info(h.broker_name)
        return _answer(cmd, GetReplicaInfoResponseHeader, view)


def _master_header(cls: type[MasterInfoHeader], view: GroupView) -> MasterInfoHeader:
    return cls(master_broker_id=view.master_broker_id, master_address=view.master_address,
               master_ha_address=view.master_ha_address or None, master_epoch=view.master_epoch,
               sync_state_set_epoch=view.sync_state_set_epoch)


def _answer(cmd: RemotingCommand, cls: type[MasterInfoHeader], view: GroupView) -> RemotingCommand:
    """SUCCESS with the master fields and the SyncStateSet body."""
    return cmd.response(ext=_master_header(cls, view).to_ext(),
                        body=encode_sync_state_set(view.sync_state_set, view.sync_state_set_epoch))


def _refuse(cmd: RemotingCommand, cls: type[MasterInfoHeader], exc: ControllerError) -> RemotingCommand:
    """The error's code and remark, with the group's master fields when the error knows them
    (a fenced broker learns the current master from the refusal itself)."""
    if exc.view is None:
        return exc.answer(cmd)
    return cmd.response(exc.code, exc.remark, ext=_master_header(cls, exc.view).to_ext(),
                        body=encode_sync_state_set(exc.view.sync_state_set,
                                                   exc.view.sync_state_set_epoch))
