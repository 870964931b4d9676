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

**Signed both ways.**  With ``cluster_secret`` set, every request goes in the cluster
envelope (:mod:`.cluster_auth`: named fields, a timestamp and a nonce under one HMAC) and
every answer must be signed over the nonce of the request it answers, so an answer recorded
for one heartbeat cannot renew the lease again: a master cut off from the controller stops
writing within its lease whatever a relay on the path answers.  An answer that does not
verify is an error naming the controller.  A role-change notice must come in an envelope of
its own, fresh and never seen before (the link keeps a replay memory), or it is ignored, so
nobody but the controller can tell this broker whom to follow, not even with a notice it
sent earlier.  With ``tls_peers`` the link is TLS (verified against ``tls_ca``, this broker's
certificate presented), so the notices are too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

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
from txbroker.remoting.envelope import ReplayGuard
from txbroker.remoting.headers import HeaderError
from txbroker.remoting.tls import link_failure
from txbroker.service.cluster_auth import check_answer, check_request, sign_request
from txbroker.service.repeating import Repeating

log = logging.getLogger(__name__)

#: One controller request's time-out.
REQUEST_TIMEOUT = 3.0
#: ALTER_SYNC_STATE_SET requests one report may send: each refusal for a stale set epoch
#: carries the current one, so the second attempt normally succeeds; the bound only stops a
#: set that keeps changing under the master from holding the report forever.
ALTER_ATTEMPTS = 3


class ControllerError(Exception):
    """The controller refused a request or none could be reached; the message says which.

    ``info`` is the group's view when the refusal carried it (master fields and set body)."""

    def __init__(self, message: str, code: int = -1, info: MasterInfo | None = None,
                 remark: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.info = info
        #: The controller's own words (a refusal's remark).
        self.remark = remark


class IdentityTaken(OSError):
    """The controller refused this broker's name and id: another live process holds them.

    Like a port in use, it stops a starting broker (one error line, exit 1); a running broker
    that meets it stops renewing its lease, so it stays fenced, and logs it once."""


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

    @property
    def order(self) -> tuple[int, int]:
        """Newer views sort higher: the master epoch moves at every change of master, the set
        epoch at every change of the set (elections included), so an answer overtaken by a
        later one is recognised whichever way it travelled."""
        return self.master_epoch, self.sync_state_set_epoch


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
                 clock: Callable[[], float] = time.monotonic,
                 request_timeout: float = REQUEST_TIMEOUT,
                 tls: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.request_timeout = request_timeout
        self.addrs = parse_address_list(config.controller_addr)
        #: TLS to the controller (the broker's ``PeerTLS`` context; None: plaintext).
        self._tls = tls
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
        #: An ALTER_SYNC_STATE_SET went unanswered since ``master`` was learned: the
        #: controller's set may be the one asked for, or still the one before.
        self._set_unsure = False
        #: Sending time (``clock``) of the last heartbeat the controller answered.
        self.renewed_at = float("-inf")
        #: Nonces of the role-change notices accepted lately (a notice is followed once).
        self._notices = ReplayGuard()

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
        try:
            resp = await self._call(RequestCode.CONTROLLER_REGISTER_BROKER, ext)
        except ControllerError as exc:
            raise self._taken(exc) from None
        info = MasterInfo.from_command(resp)
        await self._learn(info)
        return info

    def _taken(self, exc: ControllerError) -> Exception:
        """BROKER_ID_INVALID as :class:`IdentityTaken`, naming the identity and its holder."""
        if exc.code != ResponseCode.CONTROLLER_BROKER_ID_INVALID:
            return exc
        return IdentityTaken(f"controller refuses {self.config.broker_name} id "
                             f"{self.config.broker_id} at {self.broker_addr}: {exc.remark}")

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

    async def alter_sync_state_set(self, members: set[int] | frozenset[int],
                                   master_epoch: int) -> MasterInfo:
        """CONTROLLER_ALTER_SYNC_STATE_SET (the master only): make the group's in-sync set
        ``members``; returns the controller's view once its set is ``members``.

        The set epoch sent is the one this link last learned, from any answer.  A refusal for
        a stale set epoch carries the current set and epoch: when the set already is
        ``members`` (an earlier request was applied but its answer lost) that is success, else
        the request goes again with the learned epoch (at most :data:`ALTER_ATTEMPTS`).  Any
        other refusal raises :class:`ControllerError`, the view it carried learned first.
        """
        wanted = frozenset(members)
        for _ in range(ALTER_ATTEMPTS):
            known = self.master
            if known is not None and not self._set_unsure and known.master_epoch == master_epoch \
                    and known.master_id == self.config.broker_id and known.sync_state_set == wanted:
                return known
            set_epoch = known.sync_state_set_epoch if known is not None else 0
            ext = AlterSyncStateSetRequestHeader(
                broker_name=self.config.broker_name, master_broker_id=self.config.broker_id,
                master_epoch=master_epoch, invoke_time=int(time.time() * 1000)).to_ext()
            try:
                resp = await self._call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, ext,
                                        encode_sync_state_set(wanted, set_epoch))
            except ControllerError as exc:
                if exc.info is None and exc.code == -1:
                    # No answer: the controller may have applied it.  Until an answer says
                    # what its set is, the set learned before is no proof of anything.
                    self._set_unsure = True
                if exc.code != ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH or exc.info is None:
                    raise
                continue  # the refusal's view is learned: look again
            try:
                got, got_epoch = decode_sync_state_set(resp.body)
            except HeaderError as exc:
                raise ControllerError(f"controller answer is malformed: {exc.remark}") from None
            # Accepted: the controller checked that this broker is master under master_epoch.
            base = known if known is not None and known.master_epoch == master_epoch else \
                MasterInfo(self.config.broker_id, self.broker_addr, self.ha_addr, master_epoch, 0)
            await self._learn(replace(base, sync_state_set=got, sync_state_set_epoch=got_epoch))
        known = self.master
        if known is not None and not self._set_unsure and known.master_epoch == master_epoch \
                and known.sync_state_set == wanted:
            return known
        raise ControllerError(f"in-sync set {sorted(wanted)} not accepted after {ALTER_ATTEMPTS} "
                              f"attempts: the controller's set keeps changing",
                              ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, known)

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
                raise self._taken(exc) from None
            # The controller does not know this broker (its state was reset): join again.
            return await self.register()
        info = MasterInfo.from_command(resp)
        if resp.code == ResponseCode.SUCCESS:
            self.renewed_at = max(self.renewed_at, sent)
        await self._learn(info)
        return info

    async def _learn(self, info: MasterInfo) -> None:
        """Keep the controller's latest view and hand a changed master (or epoch) to the
        broker, one change at a time.  A view older than the one kept (an answer or a
        notification overtaken by a later one) changes nothing; a newer one that changes only
        the set is kept without troubling the broker."""
        async with self._applying:
            last = self.master
            if last is not None and info.order < last.order:
                return
            self.master = info
            self._set_unsure = False
            if last is not None and (info.master_id, info.master_epoch, info.master_addr) == \
                    (last.master_id, last.master_epoch, last.master_addr):
                return
            await self._on_master(info)

    async def _notified(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """NOTIFY_BROKER_ROLE_CHANGED from the controller."""
        why = check_request(cmd, self.config.cluster_secret, self._notices)
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
        """The one place controller requests leave.  A refusal that names the group's master
        is learned before it is raised (the refused broker's view was stale).

        Calls run concurrently on one shared client; a call that fails closes the client *it*
        used and forgets it only if it is still the shared one, so two calls failing together
        neither close a newer client nor skip an address twice."""
        last: str | None = None
        for _ in range(len(self.addrs)):
            addr = self._addr()
            client = self._client
            if client is None:
                client = self._client = RemotingClient(addr, connect_timeout=self.request_timeout,
                                                       ssl=self._tls)
                client.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._notified)
            request = RemotingCommand.request(code, ext, body)
            # A new envelope (timestamp, nonce) for every attempt: the answer is bound to it.
            nonce = None if self.config.cluster_secret is None else \
                sign_request(request, self.config.cluster_secret)
            try:
                resp = await client.invoke(request, self.request_timeout)
            except (OSError, TimeoutError) as exc:
                last = f"{addr}: {link_failure(exc)}"
                if self._client is client:
                    self._client = None
                    self._index += 1
                await client.close()
                continue
            if resp.code not in ok:
                info = None
                why = check_answer(resp, self.config.cluster_secret, nonce)
                if why is not None:
                    # Not learned from, but still a refusal: a gate's answer to a request it
                    # could not verify is unsigned, and its remark says what to fix.
                    raise ControllerError(f"controller {client.addr} refused request {code}: "
                                          f"{resp.code} {resp.remark or ''} (answer not trusted: "
                                          f"{why})", resp.code)
                if "masterEpoch" in resp.ext_fields:
                    with contextlib.suppress(ControllerError):
                        info = MasterInfo.from_command(resp)
                if info is not None:
                    await self._learn(info)
                raise ControllerError(f"controller {client.addr} refused request {code}: {resp.code} "
                                      f"{resp.remark or ''}".rstrip(), resp.code, info,
                                      resp.remark or "")
            why = check_answer(resp, self.config.cluster_secret, nonce)
            if why is not None:
                raise ControllerError(f"controller {client.addr} answered request {code}, but not "
                                      f"trusted: {why}")
            return resp
        raise ControllerError(f"no controller answers ({'; '.join(self.addrs)}): "
                              f"{last or 'no address'}")
