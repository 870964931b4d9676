"""A clustered broker's role in its group: master or slave now, and what each role runs.

Only a broker given name servers (``namesrv_addr``) has a role to play; a single broker is
always its own master and this module is not used.  Which role, and when it changes:

* **classic** (no ``controller_addr``): ``broker_id`` 0 is the master for life, 1 and up are
  slaves that follow the master's HA address (``ha_master_addr``, else the one the name
  servers hand back at registration).  Failover is by hand, as in RocketMQ 4.x.
* **controller mode**: the controller names the master and its epoch
  (:mod:`txbroker.cluster.controller_link`); this broker follows what it says, promoting or
  demoting itself, and a master takes a write only while its lease is known to hold.
* **etcd mode** (``etcd_endpoints``): the same, with the master the holder of the group's
  leader key in etcd (:mod:`txbroker.cluster.leadership`) and no controller process.

The role is one state of :mod:`txbroker.cluster.role_state` (STARTING, SLAVE, PROMOTING, MASTER,
DEMOTING, STOPPING, STOPPED), and the store asks one write gate (:meth:`Roles._gate`) before
every client write and again before acknowledging a put that waited: the state's fence, and
for a controller-mode master its lease.  What a role switches (docs/cluster.md, "Roles"):

=====================  =========================================  ==================================
                       master                                     slave
=====================  =========================================  ==================================
store                  takes writes while its lease holds         fenced: only replicated bytes
HA                     serves slaves; SYNC_MASTER waits for them  follows the master, truncating
                                                                  first to the last common point
transactions           state recovered from the log; checks run   none (rebuilt at promotion)
scheduled messages     delivered                                  not delivered
metadata               served to slaves                           copied from the master
name servers           registered as id 0                         its own id (not 0), or none
=====================  =========================================  ==================================

Promotion runs in this order so that nothing is written before the log is final: stop
following, cut the torn tail, start the new epoch (appended to the epoch file), recover the
transaction state from the log (pending halves, decisions, check counts: the replicated
records), lift the fence (MASTER: the gate then opens only with a valid lease), start checks
and scheduled deliveries (which rewrite op records recovery found missing: they need the fence
lifted), register as id 0.  Demotion is its mirror: fence first (DEMOTING), so no write slips
in while the rest stops; stopping too (STOPPING, see :meth:`Roles.begin_stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from txbroker.cluster.controller_link import (
    ControllerError,
    ControllerLink,
    MasterInfo,
    ReplicaState,
)
from txbroker.cluster.leadership import EtcdLeadership
from txbroker.cluster.role_state import Role, move
from txbroker.cluster.slave_sync import SlaveSync
from txbroker.cluster.topic_keys import GroupTopics
from txbroker.config import ConfigError
from txbroker.remoting.bodies import broker_label
from txbroker.remoting.signing import SessionCredentials
from txbroker.remoting.tls_listener import start_stream_server
from txbroker.store.ha_master import HAMaster
from txbroker.store.ha_slave import HASlave
from txbroker.store.results import Fence, PutStatus

if TYPE_CHECKING:
    import socket

    from txbroker.config import BrokerConfig
    from txbroker.remoting.tls import PeerTLS, ServerTLS
    from txbroker.service.processors.pull import PullHoldService
    from txbroker.service.topics import TopicManager
    from txbroker.store.message_store import MessageStore


class RoleHost(Protocol):
    """What a role needs of its broker (:class:`~txbroker.broker.Broker` is one)."""

    config: BrokerConfig
    host: str
    store: MessageStore | None
    topics: TopicManager | None
    holds: PullHoldService
    #: The broker's listeners' TLS (None: plaintext), which the HA port serves too.
    tls: ServerTLS | None
    #: How the broker dials its peers (None: plaintext).
    peer_tls: PeerTLS | None

    @property
    def broker_addr(self) -> str: ...
    def tx_active(self) -> bool: ...
    def recover_master_state(self) -> None: ...
    async def resume_master_services(self) -> None: ...
    async def suspend_master_services(self) -> None: ...
    def registration_changed(self) -> None: ...

log = logging.getLogger(__name__)

#: How often a controller-mode master reports its in-sync set and logs a lease change (a
#: fraction of the lease; the lease itself is checked on the write path).
LEASE_CHECKS_PER_LEASE = 8
#: ASYNC_MASTER: a slave this close to the end (bytes) counts as in sync.
IN_SYNC_GAP = 4 * 1024 * 1024
#: Classic epoch: without a controller the master's epoch never changes.
CLASSIC_EPOCH = 1
#: Seconds a starting broker waits for the first election it asked for (the controller's
#: request time-out) before it goes on as a fenced slave, registering once elected.
FIRST_ELECTION_WAIT = 3.0


def broker_credentials(broker: RoleHost) -> SessionCredentials | None:
    """The broker's own ACL account (``acl_access_key``, its secret key from ``acl_file``),
    which signs its requests to other brokers; None without one.  ConfigError when the file
    has no such account."""
    key = broker.config.acl_access_key
    guard = getattr(broker, "acl", None)
    if key is None or guard is None:
        return None
    account = guard.rules.accounts.get(key)
    if account is None:
        raise ConfigError(f"acl_access_key={key!r}: no such account in {broker.config.acl_file}")
    return SessionCredentials(key, account.secret_key)


class Roles:
    """Master or slave, for one clustered broker (a :class:`RoleHost`).  Event-loop only."""

    def __init__(self, broker: RoleHost, ha_sock: socket.socket,
                 bind: Callable[[str, int], socket.socket]) -> None:
        self.broker = broker
        self.config = broker.config
        self.timing = self.config.timing()
        #: The HA listener bound at start (the port stays this broker's HA address); a
        #: master serves it, a slave closes it, a promotion binds the same port again.
        self._ha_sock: socket.socket | None = ha_sock
        self._ha_host, self.ha_port = ha_sock.getsockname()[:2]
        self._bind = bind
        #: How this broker dials its master (HA, metadata sync) and the controller.
        self._peer_tls = broker.peer_tls.context if broker.peer_tls is not None else None
        #: The one state (:mod:`txbroker.cluster.role_state`); changed only through :meth:`_set`.
        self.role = Role.STARTING
        self.epoch = 0
        #: The master's client address and HA address, as last learned (slaves).
        self.master_addr = ""
        self.master_ha_addr = self.config.ha_master_addr
        #: The current master's stable broker id (controller mode; the name-server id a
        #: demoted broker 0 borrows, see :meth:`name_server_id`).
        self.master_id: int | None = None
        self.ha_master: HAMaster | None = None
        self.ha_slave: HASlave | None = None
        self.sync: SlaveSync | None = None
        #: The group's election: the controller's (controller mode) or etcd's (etcd mode).
        self.link: ControllerLink | EtcdLeadership | None = None
        self._watch_task: asyncio.Task | None = None
        self._report_task: asyncio.Task | None = None
        self._switching = asyncio.Lock()
        #: Stable ids of the replicas that hold everything this master acknowledged (itself
        #: included), as last reported to the controller.
        self.sync_state_set: set[int] = set()
        self._recheck_soon = False
        self._acknowledged_end = 0
        self._altering = asyncio.Lock()
        #: (master epoch, ids) an in-sync report added whose outcome is not known yet (in
        #: flight, or its answer lost): the controller's set may already hold them, so a put
        #: waits for them too until an answer says what the set is (:meth:`_electable`).
        self._asked: tuple[int, frozenset[int]] = (0, frozenset())
        #: Resolved (and replaced) whenever :meth:`_electable` may have changed.
        self._set_moved: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task] = set()
        #: Whether the master was taking writes when stopping began (its lease still counts).
        self._stopping_master = False
        #: The controller's epoch last refused because the log holds a newer one (logged once).
        self._refused_epoch = 0
        self._lease_held = True

    @property
    def elected(self) -> bool:
        """Controller or etcd mode: the group's master is elected, and writes only while its
        lease holds."""
        return self.config.elected

    @property
    def is_master(self) -> bool:
        """Whether this broker is its group's master now (whatever its lease)."""
        return self.role is Role.MASTER

    @property
    def ha_addr(self) -> str:
        return f"{self.broker.host}:{self.ha_port}"

    def name_server_id(self) -> int | None:
        """The id to register with the name servers now, or None: do not register.

        0 while master; a slave's own configured id (1 and up) whenever it is not master.  The
        broker configured as 0 cannot register as 0 while it is not master: it borrows the
        id of the broker that replaced it (which, as master, registers as 0 and so leaves its
        own id free), and while no other master is known — before the first election, or with
        the master cleared — it has no id of its own and does not register at all, since any
        id it took could be another replica's."""
        if self.is_master:
            return 0
        if self.config.broker_id:
            return self.config.broker_id
        if self.master_id is None or self.master_id == self.config.broker_id:
            return None
        return self.master_id

    @property
    def name(self) -> str:
        """How logs and ``txbroker status`` name this broker: ``<broker name>@<address>``,
        the same whatever its role or name-server id (docs/cluster.md, "Naming brokers")."""
        return broker_label(self.config.broker_name, self.broker.broker_addr)

    def status(self) -> dict[str, Any]:
        """This broker's part of the ``replication`` section of its status document: role,
        master epoch, configured id, the master it follows, the group's in-sync set and
        whether client writes are taken now (and if not, why)."""
        if self.is_master:
            in_sync = self.sync_state_set if self.elected else self._in_sync_now()
        else:
            named = self.link.master if self.link is not None else None
            in_sync = set(named.sync_state_set) if named is not None else set()
        master = self.broker.broker_addr if self.is_master else self.master_addr
        fence = self._gate()
        doc = {"role": "master" if self.is_master else "slave", "epoch": self.epoch,
               "brokerId": self.config.broker_id,
               "master": broker_label(self.config.broker_name, master) if master else "",
               "inSyncReplicas": sorted(in_sync),
               "writes": "accepted" if fence is None else f"refused: {fence.text}"}
        # Why a slave does not follow or copy metadata now (an operator's business).
        problems = [p for p in (self.ha_slave and self.ha_slave.problem,
                                self.sync and self.sync.problem) if p]
        if problems and not self.is_master:
            doc["replicationError"] = "; ".join(problems)
        return doc

    # --- the state and the write gate --------------------------------------------------------
    def _set(self, target: Role) -> bool:
        """Move to ``target`` (the table refuses an illegal move: a bug).  Once stopping, a
        switch still under way changes nothing more: False, and the caller returns."""
        if self.role in (Role.STOPPING, Role.STOPPED) and target not in (Role.STOPPING, Role.STOPPED):
            return False
        self.role = move(self.role, target)
        return True

    def _gate(self) -> Fence | None:
        """The store's write gate: None = take the write now, else why not.

        The state's fence first (only MASTER has none).  A controller-mode master — and a
        stopping one finishing what it took — also needs its lease known to hold: it counts
        itself master for ``assumed_lease`` = ``controller_lease * (1 - LEASE_DRIFT) -
        LEASE_SLACK`` after *sending* the last heartbeat the controller answered (monotonic
        clock), while the controller promotes another replica no sooner than
        ``max(its lease, the heartbeatTimeoutMills this broker sends = controller_lease)``
        after *receiving* the last heartbeat.  Receiving comes after sending, both clocks
        are monotonic, and the margin covers a difference in their rates plus the moment
        between this check and the answer leaving, so this master has stopped acknowledging
        before another can start (:class:`~txbroker.config.ClusterTiming`)."""
        fence = self.role.fence
        lease_counts = fence is None or (fence is Fence.STOPPING and self._stopping_master)
        if lease_counts and self.elected and not self._lease_holds():
            return Fence.LEASE_NOT_VALID
        return fence

    def _lease_holds(self) -> bool:
        """An elected master's lease holds now; never without a link (before start, after
        stop), since nothing renews it then."""
        if self.link is None:
            return False
        return self.link.lease_valid(self.timing.lease - self.timing.assumed_lease)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        store = self.broker.store
        assert store is not None
        broker_credentials(self.broker)  # a wrong account: said at start, not at the first sync
        store.set_write_gate(self._gate)  # STARTING: fenced until a role is known
        if not self.elected:
            if self.config.broker_id == 0:
                await self._to_master(CLASSIC_EPOCH)
            else:
                await self._to_slave(self.master_ha_addr, self.master_addr)
            return
        if self.config.etcd_endpoints:
            self.link = EtcdLeadership(self.config, broker_addr=self.broker.broker_addr,
                                       ha_addr=self.ha_addr, state=self._replica_state,
                                       on_master=self._apply,
                                       last_log_epoch=lambda: store.epochs.last_epoch)
            topics = self.broker.topics
            assert topics is not None
            self.link.topics = GroupTopics(self.link, topics)
            topics.publisher = self.link.topics.publish  # a change is the group's, in etcd
        else:
            self.link = ControllerLink(self.config, broker_addr=self.broker.broker_addr,
                                       ha_addr=self.ha_addr, state=self._replica_state,
                                       on_master=self._apply, tls=self._peer_tls)
        try:
            await self.link.register()  # _apply asks for the first election if it is ours
        except ControllerError as exc:
            # The heartbeat loop keeps asking; until a master is named this broker stays
            # fenced (STARTING) with nothing to follow.
            log.warning("%s: %s; waiting for it",
                        "etcd" if self.config.etcd_endpoints else "controller", exc)
        if self._background:
            # The first election asked for above: the broker registers with the name servers
            # once it knows its role, so its first registration (at start) already has it.
            await asyncio.wait(set(self._background), timeout=FIRST_ELECTION_WAIT)
        self.link.start()
        self._watch_task = asyncio.create_task(self._watch(), name="txbroker-master-watch")

    def begin_stop(self) -> None:
        """The first step of stopping: fence (STOPPING), so every put from now on is refused
        with a retriable SERVICE_NOT_AVAILABLE.  Puts already taken finish with replication
        still on (a SYNC_MASTER answers them once the slaves hold them, or refuses them), so
        nothing is acknowledged unreplicated while the broker drains its clients."""
        if self.role in (Role.STOPPING, Role.STOPPED):
            return
        self._stopping_master = self.role is Role.MASTER
        self._set(Role.STOPPING)
        log.info("broker %s is stopping: writes refused", self.name)

    async def stop(self) -> None:
        """After the clients are drained: stop the controller link, replication, the rest."""
        self.begin_stop()
        for task in (self._watch_task, self._report_task, *self._background):
            if task is not None:
                task.cancel()
        for task in (self._watch_task, self._report_task, *self._background):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.link is not None:  # the mirror of start(): no link, so no lease, after it
            await self.link.close()
            self.link = None
        if self.config.etcd_endpoints and self.broker.topics is not None:
            self.broker.topics.publisher = None
        async with self._switching:  # a switch under way ends at its next step
            await self._stop_following()
            await self._stop_serving()
            self._set(Role.STOPPED)

    def _replica_state(self) -> ReplicaState:
        store = self.broker.store
        assert store is not None
        confirm = self.ha_master.confirm_offset if self.is_master and self.ha_master else \
            store.max_physical_offset
        return ReplicaState(self.epoch, store.max_physical_offset, confirm)

    # --- role changes ------------------------------------------------------------------------
    async def _apply(self, info: MasterInfo) -> None:
        """Controller mode: follow what the controller says, and re-register at once when
        the id to register under changed (a role switch re-registers by itself; a new or
        cleared master changes the id the broker configured as 0 borrows)."""
        registered_as = self.name_server_id()
        await self._follow(info)
        if self.name_server_id() != registered_as:
            self.broker.registration_changed()

    async def _follow(self, info: MasterInfo) -> None:
        if self.role in (Role.STOPPING, Role.STOPPED):
            return
        self.master_id = info.master_id
        if info.master_id == self.config.broker_id:
            if not self.is_master or info.master_epoch > self.epoch:
                await self._to_master(info.master_epoch, set(info.sync_state_set))
            return
        if info.master_id is None:
            if info.master_epoch == 0 and self.config.broker_id == 0:
                # Never elected: the broker started as id 0 asks (whenever the controller
                # first answers it), not from inside this notification.
                self._spawn(self._ask_election())
            if self.is_master:
                await self._to_slave("", "")  # no master now: stop writing, wait
            return
        if self.is_master or info.master_ha_addr != self.master_ha_addr or info.master_epoch != self.epoch:
            self.epoch = info.master_epoch
            await self._to_slave(info.master_ha_addr, info.master_addr)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, holding it until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _ask_election(self) -> None:
        assert self.link is not None
        try:
            await self.link.elect()
        except (ControllerError, OSError, TimeoutError) as exc:
            log.warning("first election of group %s not started: %s (the next heartbeat "
                        "retries)", self.config.broker_name, exc)
            self.link.master = None  # so the next answer is applied again

    def _refuse_epoch(self, epoch: int, last: int) -> None:
        """Controller mode: named master under an epoch older than this log's last.  Taking
        writes would put a new epoch's records under an old number (a slave following the
        log could not tell them apart), so the broker stays a fenced slave, says so once, and
        applies the controller's next answer again."""
        if self._refused_epoch != epoch:
            self._refused_epoch = epoch
            log.error("broker %s not promoted: the controller names it master under epoch %d, "
                      "but its log already holds epoch %d; it stays a fenced slave (was the "
                      "controller's state reset?)", self.name, epoch, last)
        if self.role is Role.STARTING:
            self._set(Role.SLAVE)
        if self.link is not None:
            self.link.master = None  # so the next heartbeat's answer is applied again

    async def _to_master(self, epoch: int, sync_state_set: set[int] | None = None) -> None:
        async with self._switching:
            broker = self.broker
            store = broker.store
            assert store is not None
            last = store.epochs.last_epoch
            if self.elected and epoch < last:
                self._refuse_epoch(epoch, last)
                return
            if self.role is not Role.PROMOTING and not self._set(Role.PROMOTING):
                return
            await self._stop_following()
            store.cut_torn_tail()
            if self.ha_master is None:
                sock, self._ha_sock = self._ha_sock, None
                self.ha_master = HAMaster(store, sock=sock or self._bind(self._ha_host, self.ha_port),
                                         group=self.config.broker_name,
                                         secret=self.config.cluster_secret,
                                         heartbeat=self.timing.ha_heartbeat,
                                         idle_timeout=self.timing.ha_idle_timeout,
                                         start_server=partial(start_stream_server,
                                                              tls=broker.tls, what="HA port"))
                await self.ha_master.start()
            if epoch > store.epochs.last_epoch:
                self.ha_master.become(epoch)
            elif epoch < store.epochs.last_epoch:  # classic mode: the log ran under a controller
                log.error("promoted under epoch %d, but this log already holds epoch %d",
                          epoch, store.epochs.last_epoch)
            self.epoch = epoch
            self.sync_state_set = sync_state_set or {self.config.broker_id}
            if self.config.broker_role == "SYNC_MASTER":
                self.ha_master.on_confirm = self._confirm_moved
                store.set_replication(self._wait_replicated)
                store.visible_limit = self._visible_end()
            resume = not broker.tx_active()
            if resume:
                broker.recover_master_state()  # still fenced: the log is final
            if not self._set(Role.MASTER):
                return
            if resume:
                await broker.resume_master_services()
            log.warning("broker %s (id %d) is now the master, epoch %d; its log ends at "
                        "offset %d", self.name, self.config.broker_id, epoch,
                        store.max_physical_offset)
            broker.registration_changed()

    async def _to_slave(self, master_ha_addr: str, master_addr: str) -> None:
        async with self._switching:
            broker = self.broker
            store = broker.store
            assert store is not None
            was_master = self.role in (Role.MASTER, Role.PROMOTING)
            if self.role is Role.MASTER and not self._set(Role.DEMOTING):  # fence first
                return
            if self.role in (Role.STOPPING, Role.STOPPED):
                return
            await self._stop_serving()
            if was_master:
                await broker.suspend_master_services()
                log.warning("broker %s (id %d) is no longer the master (epoch %d)", self.name,
                            self.config.broker_id, self.epoch)
            await self._stop_following()
            if not self._set(Role.SLAVE):
                return
            self.master_ha_addr = master_ha_addr or self.master_ha_addr
            self.master_addr = master_addr or self.master_addr
            self.ha_slave = self._follower(store)
            self.ha_slave.start()
            if not self.config.etcd_endpoints:  # etcd mode: topics come from etcd
                self.sync = SlaveSync(broker.topics, self.config.metadata_sync_interval,
                                      lambda: self.master_addr or None,
                                      credentials=broker_credentials(broker), tls=self._peer_tls)
                self.sync.start()
            broker.registration_changed()

    def _follower(self, store: MessageStore) -> HASlave:
        """An HA follower of the master now named (its address is asked at every attempt)."""
        return HASlave(store, lambda: self.master_ha_addr or None, slave_id=self.config.broker_id,
                       secret=self.config.cluster_secret,
                       master_name=lambda: broker_label(self.config.broker_name, self.master_addr)
                       if self.master_addr else "the master",
                       heartbeat=self.timing.ha_heartbeat, idle_timeout=self.timing.ha_idle_timeout,
                       tls=self._peer_tls)

    async def _stop_serving(self) -> None:
        """No HA service: a slave's, or a stopping broker's (the start-up socket too)."""
        if self._ha_sock is not None:
            self._ha_sock.close()
            self._ha_sock = None
        store = self.broker.store
        if store is not None:
            store.set_replication(None)
            store.visible_limit = None
        if self.ha_master is not None:
            await self.ha_master.close()
            self.ha_master = None

    async def _stop_following(self) -> None:
        if self.ha_slave is not None:
            await self.ha_slave.close()
            self.ha_slave = None
        if self.sync is not None:
            await self.sync.close()
            self.sync = None

    def learned_master(self, master_addr: str, ha_addr: str) -> None:
        """Classic mode: the name servers' answer to a slave's registration names the master;
        a new HA address takes effect at once (the follower may be sleeping between tries)."""
        if self.elected or self.role is not Role.SLAVE:
            return
        if master_addr:
            self.master_addr = master_addr
        if ha_addr and not self.config.ha_master_addr and ha_addr != self.master_ha_addr:
            self.master_ha_addr = ha_addr
            if self.ha_slave is not None and not self.ha_slave.connected:
                self._spawn(self._restart_follower())

    async def _restart_follower(self) -> None:
        async with self._switching:
            if self.ha_slave is None or self.role is not Role.SLAVE:
                return
            store = self.broker.store
            assert store is not None
            await self.ha_slave.close()
            self.ha_slave = self._follower(store)
            self.ha_slave.start()

    # --- SYNC_MASTER and the in-sync set -----------------------------------------------------
    async def _wait_replicated(self, end_offset: int) -> PutStatus:
        """SYNC_MASTER: wait for the slaves before a put is answered.

        Classic mode: ``min_in_sync_replicas`` connected slaves hold it
        (:meth:`HAMaster.wait_replicated`).  Controller mode: every slave of the in-sync set
        the controller may hold (:meth:`_electable`) holds it, and there are at least
        ``min_in_sync_replicas`` of them, so any replica an election could pick, after any
        faults, holds every acknowledged put.  Members still lacking it when the wait ends are
        first taken out of the set (the controller accepts the smaller set before the answer
        leaves); if the controller cannot be told, the put is not acknowledged at all:
        OUTCOME_UNKNOWN (stored here, may or may not be delivered), which clients do not count
        as sent.  Too few members left: SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT, as in
        classic mode, with the set shrunk first all the same (clients count those as sent)."""
        ha = self.ha_master
        if ha is None:
            return PutStatus.SLAVE_NOT_AVAILABLE
        if self.link is None:
            status = await ha.wait_replicated(end_offset, self.timing.slave_timeout,
                                              self.config.min_in_sync_replicas)
        else:
            status = await self._wait_in_sync(ha, end_offset)
            lacking = self._lacking(end_offset)
            if lacking:
                await self._report_sync_state_set(self._electable() - lacking)
                if self._lacking(end_offset):  # the set still promises a replica lacking it
                    self._confirm_moved()
                    return PutStatus.OUTCOME_UNKNOWN
            if self._enough():
                status = PutStatus.OK
            elif status is PutStatus.OK:
                status = PutStatus.FLUSH_SLAVE_TIMEOUT
        self._acknowledged_end = max(self._acknowledged_end, end_offset)
        self._confirm_moved()  # with no slave to ack, the answer itself moves it
        return status

    async def _wait_in_sync(self, ha: HAMaster, end_offset: int) -> PutStatus:
        """Controller mode: wait, at most ``slave_timeout``, until the put may be answered
        once the members lacking it (those not connected) are out of the set.  OK: it may;
        SLAVE_NOT_AVAILABLE: fewer than ``min_in_sync_replicas`` connected slaves are near
        enough to wait for; FLUSH_SLAVE_TIMEOUT: the time ran out.  A set too small to
        answer waits for the set to grow (the watch adds slaves that caught up)."""
        loop = asyncio.get_running_loop()
        needed = self.config.min_in_sync_replicas
        deadline = loop.time() + self.timing.slave_timeout
        while True:
            if self.ha_master is not ha:  # no longer serving slaves (demoted, stopping)
                return PutStatus.SLAVE_NOT_AVAILABLE
            lacking = self._lacking(end_offset)
            connected = {s.slave_id for s in ha.slaves() if s.connected}
            waiting = lacking & connected
            others = self._electable() - {self.config.broker_id}
            if not waiting and len(others - lacking) >= needed:
                return PutStatus.OK
            if ha.available(end_offset) < needed:
                return PutStatus.SLAVE_NOT_AVAILABLE
            left = deadline - loop.time()
            if left <= 0:
                return PutStatus.FLUSH_SLAVE_TIMEOUT
            moved = self._set_change()
            if not waiting:
                await asyncio.wait({moved}, timeout=left)
                continue
            acked = loop.create_task(ha.wait_acked(end_offset, waiting, left))
            try:
                await asyncio.wait({acked, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not acked.done():
                    acked.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await acked

    def _electable(self) -> set[int]:
        """Controller mode: every replica the controller's in-sync set may hold now: the set
        last accepted, plus the ids a report whose outcome is not known yet added."""
        epoch, asked = self._asked
        return self.sync_state_set | asked if epoch == self.epoch else set(self.sync_state_set)

    def _lacking(self, end_offset: int) -> set[int]:
        """Slaves of :meth:`_electable` that have not acked ``end_offset`` (connected or not)."""
        ha = self.ha_master
        acks = {s.slave_id: s.ack_offset for s in ha.slaves()} if ha is not None else {}
        others = self._electable() - {self.config.broker_id}
        return {m for m in others if acks.get(m, 0) < end_offset}

    def _enough(self) -> bool:
        """Whether the in-sync set has ``min_in_sync_replicas`` slaves besides this master."""
        return len(self._electable() - {self.config.broker_id}) >= self.config.min_in_sync_replicas

    def _set_change(self) -> asyncio.Future[None]:
        """A future resolved at the next change of :meth:`_electable`."""
        if self._set_moved is None or self._set_moved.done():
            self._set_moved = asyncio.get_running_loop().create_future()
        return self._set_moved

    def _set_changed(self) -> None:
        if self._set_moved is not None and not self._set_moved.done():
            self._set_moved.set_result(None)

    def _holders(self, end_offset: int) -> set[int]:
        """This master and the connected slaves holding everything up to ``end_offset``."""
        ha = self.ha_master
        held = {self.config.broker_id}
        if ha is not None:
            held.update(s.slave_id for s in ha.slaves() if s.connected and s.ack_offset >= end_offset)
        return held

    def _in_sync_now(self) -> set[int]:
        """Who may be elected should this master die now: SYNC_MASTER, the slaves holding
        every acknowledged put; ASYNC_MASTER, those within ``IN_SYNC_GAP`` of the end."""
        store = self.broker.store
        assert store is not None
        if self.config.broker_role == "SYNC_MASTER":
            return self._holders(self._acknowledged_end)
        return self._holders(max(0, store.max_physical_offset - IN_SYNC_GAP))

    async def _report_sync_state_set(self, members: set[int]) -> None:
        """Ask the controller to make the in-sync set ``members`` (this master included).

        ``members`` may have been chosen before another report changed the set, so it is
        checked again here, under the lock: a replica not in the set now is added only if it
        holds everything acknowledged (a put acknowledged since it was chosen may be missing
        there).  Ids added wait in ``_asked`` until the controller's answer, so a put answered
        meanwhile waits for them as well."""
        async with self._altering:
            if self.link is None or not self.is_master:
                return
            me = self.config.broker_id
            electable = self._electable()
            holding = self._holders(self._acknowledged_end)
            members = {m for m in members if m in electable or m in holding} | {me}
            epoch, asked = self._asked
            unsure = epoch == self.epoch and bool(asked)
            if members == self.sync_state_set and not unsure:
                return
            added = members - self.sync_state_set
            self._asked = (self.epoch, (asked if unsure else frozenset()) | added)
            if added:
                self._set_changed()
            try:
                # The set epoch is the link's, learned from every controller answer: a report
                # whose answer was lost is recognised as applied by the next one.
                view = await self.link.alter_sync_state_set(members, self.epoch)
            except (ControllerError, OSError, TimeoutError) as exc:
                log.warning("in-sync replicas (ids %s) of group %s not reported: %s",
                            sorted(members), self.config.broker_name, exc)
                return
            log.info("in-sync replicas of group %s, epoch %d: ids %s", self.config.broker_name,
                     self.epoch, sorted(view.sync_state_set))
            self.sync_state_set = set(view.sync_state_set)
            self._asked = (self.epoch, frozenset())
            self._set_changed()

    def _visible_end(self) -> int:
        """SYNC_MASTER: how far consumers may read.  In controller mode, what every other
        member of the in-sync set the controller may hold has acknowledged, connected or not:
        any of them may be elected, so a slave that disconnected still bounds what is shown
        until the set is shrunk.  Classic mode (no election): what the connected slaves hold."""
        ha, store = self.ha_master, self.broker.store
        assert ha is not None and store is not None
        if not self.elected:
            return ha.confirm_offset
        acks = {s.slave_id: s.ack_offset for s in ha.slaves()}
        others = self._electable() - {self.config.broker_id}
        return min([store.max_physical_offset, *(acks.get(m, 0) for m in others)])

    def _confirm_moved(self) -> None:
        """SYNC_MASTER: consumers see what the in-sync replicas hold; held pulls look again
        (once per loop turn, however many acknowledgements arrived)."""
        ha, store = self.ha_master, self.broker.store
        if ha is None or store is None or store.visible_limit is None:
            return
        confirm = self._visible_end()
        if confirm > store.visible_limit and not self._recheck_soon:
            self._recheck_soon = True
            asyncio.get_running_loop().call_soon(self._recheck)
        store.visible_limit = confirm

    def _recheck(self) -> None:
        self._recheck_soon = False
        self.broker.holds.recheck()

    # --- the watch ---------------------------------------------------------------------------
    async def _watch(self) -> None:
        """Controller mode, while master: keep the in-sync set reported (a task of its own,
        so a controller that does not answer delays nothing else) and log when the lease
        stops or starts holding.  The lease is enforced by the write gate, not here; an
        error in one round is logged and the next round runs."""
        period = self.config.controller_lease / LEASE_CHECKS_PER_LEASE
        while True:
            await asyncio.sleep(period)
            try:
                self._watch_once()
            except Exception:
                log.exception("broker %s: master watch round failed", self.name)

    def _watch_once(self) -> None:
        if self.role is not Role.MASTER:
            self._lease_held = True
            return
        if (self._report_task is None or self._report_task.done()) and not self._altering.locked():
            self._report_task = asyncio.get_running_loop().create_task(
                self._report_in_sync(), name="txbroker-in-sync-report")
        held = self._lease_holds()
        if held != self._lease_held:
            self._lease_held = held
            if held:
                log.warning("broker %s: master lease renewed; writes accepted again", self.name)
            else:
                log.warning("broker %s: master lease expired (the controller or etcd has not "
                            "answered); writes refused", self.name)

    async def _report_in_sync(self) -> None:
        try:
            await self._report_sync_state_set(self._in_sync_now())
            self._confirm_moved()  # a shrunk set may show consumers more
        except Exception:
            log.exception("broker %s: in-sync set not reported", self.name)
