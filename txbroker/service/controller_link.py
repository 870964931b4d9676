"""The broker's side of controller mode: register, heartbeat, ask for an election, report the
in-sync replica set, and learn who the master of the group is.

A broker in controller mode does not decide its own role.  It registers with the controller
(CONTROLLER_REGISTER_BROKER), heartbeats every ``controller_heartbeat_interval``
(BROKER_HEARTBEAT, whose answer carries the group's current master and epoch) and is told of a
change at once by NOTIFY_BROKER_ROLE_CHANGED on the same connection; the next heartbeat
answer repeats it, so a lost notification costs one interval.  Request and answer fields are
in docs/cluster.md ("Controller and failover").

**The lease.**  A master may accept writes only while its lease holds: until
``controller_lease`` after the *sending* time of its last heartbeat the controller answered.
The controller promotes another replica only after it has *received* no heartbeat for its own
lease, which is never earlier, so the old master has stopped writing before the new one
starts (:meth:`ControllerLink.lease_valid`; the clocks of one machine, or clocks kept within
the lease's margin of each other).  Several controller addresses may be given; the link uses
the first that answers and moves on when it fails.

**Signed both ways.**  With ``cluster_secret`` set, every request carries the cluster signature
and every answer and role-change notice must carry it too (:mod:`.cluster_auth`): an answer
without it is an error naming the controller, and a notice without it is ignored, so nobody but
the controller can tell this broker whom to follow.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from txbroker.config import BrokerConfig, parse_address_list
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import (
    AlterSyncStateSetRequestHeader,
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
    MasterInfoHeader,
    RegisterBrokerToControllerRequestHeader,
    decode_sync_state_set,
    encode_sync_state_set,
)
from txbroker.remoting.headers import HeaderError
from txbroker.service.cluster_auth import check, sign
from txbroker.service.repeating import Repeating

log = logging.getLogger(__name__)

#: One controller request's time-out.
REQUEST_TIMEOUT = 3.0


class ControllerError(Exception):
    """The controller refused a request or none could be reached; the message says which."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class MasterInfo:
    """Who the controller says is the group's master (``master_id`` None: nobody now)."""

    master_id: int | None
    master_addr: str
    master_ha_addr: str
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_command(cls, cmd: RemotingCommand) -> MasterInfo:
        try:
            h = MasterInfoHeader.from_ext(cmd.ext_fields)
            members, _ = decode_sync_state_set(cmd.body) if cmd.body else (frozenset(), 0)
        except HeaderError as exc:
            raise ControllerError(f"controller answer is malformed: {exc.remark}") from None
        return cls(h.master_broker_id, h.master_address or "", h.master_ha_address or "",
                   h.master_epoch, h.sync_state_set_epoch, members)


@dataclass
class ReplicaState:
    """What the broker reports in every heartbeat."""

    epoch: int = 0
    max_offset: int = 0
    confirm_offset: int = 0


class ControllerLink:
    """One broker's connection to the controller; event-loop only.

    ``state()`` gives the figures heartbeats carry; ``on_master(info)`` runs (serialised, one
    at a time) whenever the controller's answer names another master or epoch than the last.
    """

    def __init__(self, config: BrokerConfig, *, broker_addr: str, ha_addr: str,
                 state: Callable[[], ReplicaState],
                 on_master: Callable[[MasterInfo], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.addrs = parse_address_list(config.controller_addr)
        self.broker_addr = broker_addr
        self.ha_addr = ha_addr
        self._state = state
        self._on_master = on_master
        self._clock = clock
        self._index = 0
        self._client: RemotingClient | None = None
        self._heartbeats = Repeating(self.heartbeat, config.controller_heartbeat_interval,
                                     what="controller heartbeat",
                                     errors=(ControllerError, OSError, TimeoutError))
        self._applying = asyncio.Lock()
        #: The last master the controller named (None before the first answer).
        self.master: MasterInfo | None = None
        #: Sending time (``clock``) of the last heartbeat the controller answered.
        self.renewed_at = float("-inf")

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._heartbeats.start()

    async def close(self) -> None:
        await self._heartbeats.close()
        if self._client is not None:
            await self._client.close()
            self._client = None

    def lease_valid(self, margin: float = 0.0) -> bool:
        """Whether a master may still accept writes for at least ``margin`` seconds (see the
        module docstring)."""
        return self._clock() + margin - self.renewed_at < self.config.controller_lease

    # --- requests ----------------------------------------------------------------------------
    async def register(self) -> MasterInfo:
        """CONTROLLER_REGISTER_BROKER: join the group; the answer names its master."""
        cfg = self.config
        ext = RegisterBrokerToControllerRequestHeader(
            cluster_name=cfg.cluster_name, broker_name=cfg.broker_name, broker_id=cfg.broker_id,
            broker_address=self.broker_addr, ha_server_addr=self.ha_addr,
            invoke_time=int(time.time() * 1000)).to_ext()
        info = MasterInfo.from_command(await self._call(RequestCode.CONTROLLER_REGISTER_BROKER, ext))
        await self._learn(info)
        return info

    async def elect(self) -> MasterInfo:
        """CONTROLLER_ELECT_MASTER for this group (the first election: the asker wins)."""
        cfg = self.config
        ext = ElectMasterRequestHeader(cluster_name=cfg.cluster_name, broker_name=cfg.broker_name,
                                       broker_id=cfg.broker_id, designate_elect=False,
                                       invoke_time=int(time.time() * 1000)).to_ext()
        resp = await self._call(RequestCode.CONTROLLER_ELECT_MASTER, ext,
                                ok=(ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST))
        info = MasterInfo.from_command(resp)
        await self._learn(info)
        return info

    async def alter_sync_state_set(self, members: set[int], master_epoch: int,
                                   sync_state_set_epoch: int) -> int:
        """CONTROLLER_ALTER_SYNC_STATE_SET (the master only); returns the new set epoch."""
        ext = AlterSyncStateSetRequestHeader(
            broker_name=self.config.broker_name, master_broker_id=self.config.broker_id,
            master_epoch=master_epoch, invoke_time=int(time.time() * 1000)).to_ext()
        body = encode_sync_state_set(members, sync_state_set_epoch)
        resp = await self._call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, ext, body)
        try:
            return int(resp.ext_fields.get("newSyncStateSetEpoch") or 0)
        except ValueError:
            raise ControllerError("controller answered a bad newSyncStateSetEpoch") from None

    async def heartbeat(self) -> MasterInfo:
        """One BROKER_HEARTBEAT; renews the lease when answered."""
        sent = self._clock()
        st = self._state()
        cfg = self.config
        ext = BrokerHeartbeatRequestHeader(
            cluster_name=cfg.cluster_name, broker_addr=self.broker_addr,
            broker_name=cfg.broker_name, broker_id=cfg.broker_id, epoch=st.epoch,
            max_offset=st.max_offset, confirm_offset=st.confirm_offset,
            heartbeat_timeout_mills=int(cfg.controller_lease * 1000)).to_ext()
        try:
            resp = await self._call(RequestCode.BROKER_HEARTBEAT, ext,
                                    ok=(ResponseCode.SUCCESS, ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH))
        except ControllerError as exc:
            if exc.code != ResponseCode.CONTROLLER_INVALID_REPLICAS:
                raise
            # The controller does not know this broker (its state was reset): join again.
            return await self.register()
        info = MasterInfo.from_command(resp)
        if resp.code == ResponseCode.SUCCESS:
            self.renewed_at = max(self.renewed_at, sent)
        await self._learn(info)
        return info

    async def _learn(self, info: MasterInfo) -> None:
        """Hand a changed master (or epoch) to the broker, one change at a time."""
        async with self._applying:
            last = self.master
            if last is not None and (info.master_id, info.master_epoch) == (last.master_id, last.master_epoch) \
                    and info.master_addr == last.master_addr:
                self.master = info  # the set may have changed; nothing to apply
                return
            if last is not None and info.master_epoch < last.master_epoch:
                return  # an answer overtaken by a newer one
            self.master = info
            await self._on_master(info)

    async def _notified(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """NOTIFY_BROKER_ROLE_CHANGED from the controller."""
        why = check(cmd, self.config.cluster_secret)
        if why is not None:
            log.warning("ignored a role-change notice from controller %s: %s", self._addr(), why)
            return None
        try:
            info = MasterInfo.from_command(cmd)
        except ControllerError as exc:
            log.warning("ignored a role-change notice: %s", exc)
            return None
        await self._learn(info)  # client handlers run on tasks of their own
        return cmd.response(ResponseCode.SUCCESS) if not cmd.flag & 2 else None

    def _addr(self) -> str:
        return self.addrs[self._index % len(self.addrs)]

    async def _call(self, code: int, ext: dict[str, str], body: bytes = b"",
                    ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        last: BaseException | None = None
        for _ in range(len(self.addrs)):
            addr = self._addr()
            if self._client is None:
                self._client = RemotingClient(addr, connect_timeout=REQUEST_TIMEOUT)
                self._client.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._notified)
            request = RemotingCommand.request(code, ext, body)
            if self.config.cluster_secret is not None:
                sign(request, self.config.cluster_secret)
            try:
                resp = await self._client.invoke(request, REQUEST_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                last = exc
                client, self._client = self._client, None
                await client.close()
                self._index += 1
                continue
            if resp.code not in ok:
                raise ControllerError(f"controller {addr} refused request {code}: {resp.code} "
                                      f"{resp.remark or ''}".rstrip(), resp.code)
            why = check(resp, self.config.cluster_secret)
            if why is not None:
                raise ControllerError(f"controller {addr} answered request {code}, but not "
                                      f"trusted: {why}")
            return resp
        raise ControllerError(f"no controller answers ({'; '.join(self.addrs)}): "
                              f"{last or 'no address'}")
