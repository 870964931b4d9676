"""A clustered broker's role in its group: master or slave now, and what each role runs.

Only a broker given name servers (``namesrv_addr``) has a role to play; a single broker is
always its own master and this module is not used.  Which role, and when it changes:

* **classic** (no ``controller_addr``): ``broker_id`` 0 is the master for life, 1 and up are
  slaves that follow the master's HA address (``ha_master_addr``, else the one the name
  servers hand back at registration).  Failover is by hand, as in RocketMQ 4.x.
* **controller mode**: the controller names the master and its epoch
  (:mod:`txbroker.service.controller_link`); this broker follows what it says, promoting or
  demoting itself, and a master whose lease runs out fences itself.

What a role switches (docs/cluster.md, "Roles"):

=====================  =========================================  ==================================
                       master                                     slave
=====================  =========================================  ==================================
store                  takes writes (unless the lease ran out)    fenced: only replicated bytes
HA                     serves slaves; SYNC_MASTER waits for them  follows the master, truncating
                                                                  first to the last common point
transactions           state recovered from the log; checks run   none (rebuilt at promotion)
scheduled messages     delivered                                  not delivered
metadata               served to slaves                           copied from the master
name servers           registered as id 0                         registered as a slave id
=====================  =========================================  ==================================

Promotion runs in this order so that nothing is written before the log is final: stop
following, cut the torn tail, start the new epoch (appended to the epoch file), recover the
transaction state from the log (pending halves, decisions, check counts: the replicated
records), start checks and scheduled deliveries, lift the fence, register as id 0.  Demotion
is its mirror: fence first, so no write slips in while the rest stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from txbroker.service.controller_link import ControllerError, ControllerLink, MasterInfo, ReplicaState
from txbroker.service.slave_sync import SlaveSync
from txbroker.store.ha_master import HAMaster
from txbroker.store.ha_slave import HASlave
from txbroker.store.results import PutStatus

if TYPE_CHECKING:
    import socket

    from txbroker.broker import Broker

log = logging.getLogger(__name__)

#: How often a controller-mode master checks its lease (a fraction of the lease).
LEASE_CHECKS_PER_LEASE = 8
#: Classic epoch: without a controller the master's epoch never changes.
CLASSIC_EPOCH = 1


class Roles:
    """Master or slave, for one clustered :class:`~txbroker.broker.Broker`.  Event-loop only."""

    def __init__(self, broker: Broker, ha_sock: socket.socket,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker
        self.config = broker.config
        self._ha_sock = ha_sock
        self.clock = clock
        self.is_master = False
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
        self.link: ControllerLink | None = None
        self._lease_task: asyncio.Task | None = None
        self._switching = asyncio.Lock()
        #: (seconds the last promotion took, at monotonic time); tests and status read it.
        self.last_promotion: tuple[float, float] | None = None

    @property
    def controller_mode(self) -> bool:
        return bool(self.config.controller_addr)

    @property
    def ha_addr(self) -> str:
        return f"{self.broker.host}:{self._ha_sock.getsockname()[1]}"

    def name_server_id(self) -> int:
        """The id to register with: 0 while master; a slave's own id, or — for the broker
        configured as 0 and now a slave — the id of the broker that replaced it, which as
        master registers as 0 and so leaves its own id free."""
        if self.is_master:
            return 0
        if self.config.broker_id:
            return self.config.broker_id
        return self.master_id if self.master_id else 1

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        store = self.broker.store
        assert store is not None
        self.ha_master = HAMaster(store, sock=self._ha_sock)
        await self.ha_master.start()
        store.fence(f"broker {self.config.broker_name}/{self.config.broker_id} is starting")
        if not self.controller_mode:
            if self.config.broker_id == 0:
                await self._to_master(CLASSIC_EPOCH)
            else:
                await self._to_slave(self.master_ha_addr, self.master_addr)
            return
        self.link = ControllerLink(self.config, broker_addr=self.broker.broker_addr,
                                   ha_addr=self.ha_addr, state=self._replica_state,
                                   on_master=self._apply)
        try:
            info = await self.link.register()
            if info.master_id is None and self.config.broker_id == 0 and info.master_epoch == 0:
                await self.link.elect()
        except ControllerError as exc:
            # The heartbeat loop keeps asking; until a master is named this broker is a
            # fenced slave with nothing to follow.
            log.warning("controller: %s; waiting for it", exc)
        self.link.start()
        self._lease_task = asyncio.create_task(self._watch_lease(), name="txbroker-lease")

    async def stop(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
        if self.link is not None:
            await self.link.close()
        await self._stop_following()
        if self.ha_master is not None:
            await self.ha_master.close()
        store = self.broker.store
        if store is not None:
            store.set_replication(None)

    def _replica_state(self) -> ReplicaState:
        store = self.broker.store
        assert store is not None
        confirm = self.ha_master.confirm_offset if self.is_master and self.ha_master else \
            store.max_physical_offset
        return ReplicaState(self.epoch, store.max_physical_offset, confirm)

    # --- role changes ------------------------------------------------------------------------
    async def _apply(self, info: MasterInfo) -> None:
        """Controller mode: follow what the controller says."""
        self.master_id = info.master_id
        if info.master_id == self.config.broker_id:
            if not self.is_master or info.master_epoch > self.epoch:
                await self._to_master(info.master_epoch)
            return
        if info.master_id is None:
            if self.is_master:
                await self._to_slave("", "")  # no master now: stop writing, wait
            return
        if self.is_master or info.master_ha_addr != self.master_ha_addr or info.master_epoch != self.epoch:
            self.epoch = info.master_epoch
            await self._to_slave(info.master_ha_addr, info.master_addr)

    async def _to_master(self, epoch: int) -> None:
        async with self._switching:
            started = time.perf_counter()
            broker = self.broker
            store = broker.store
            assert store is not None and self.ha_master is not None
            await self._stop_following()
            store.cut_torn_tail()
            self.ha_master.become(epoch)
            self.epoch = epoch
            if self.config.broker_role == "SYNC_MASTER":
                store.set_replication(self._wait_replicated)
            await broker.resume_master_services()
            self.is_master = True
            store.fence("")
            self.last_promotion = (time.perf_counter() - started, self.clock())
            log.warning("broker %s/%d is now the master (epoch %d, log ends at %d)",
                        self.config.broker_name, self.config.broker_id, epoch,
                        store.max_physical_offset)
            broker.registration_changed()

    async def _to_slave(self, master_ha_addr: str, master_addr: str) -> None:
        async with self._switching:
            broker = self.broker
            store = broker.store
            assert store is not None and self.ha_master is not None
            store.fence(f"broker {self.config.broker_name}/{self.config.broker_id} is a slave")
            was_master = self.is_master
            self.is_master = False
            if was_master:
                await broker.suspend_master_services()
                await self.ha_master.drop_slaves()
                store.set_replication(None)
                log.warning("broker %s/%d is no longer the master", self.config.broker_name,
                            self.config.broker_id)
            await self._stop_following()
            self.master_ha_addr = master_ha_addr or self.master_ha_addr
            self.master_addr = master_addr or self.master_addr
            self.ha_slave = HASlave(store, lambda: self.master_ha_addr or None,
                                    broker_id=self.config.broker_id)
            self.ha_slave.start()
            self.sync = SlaveSync(broker.topics, store.offsets, self.config.metadata_sync_interval,
                                  lambda: self.master_addr or None)
            self.sync.start()
            broker.registration_changed()

    async def _stop_following(self) -> None:
        if self.ha_slave is not None:
            await self.ha_slave.close()
            self.ha_slave = None
        if self.sync is not None:
            await self.sync.close()
            self.sync = None

    def learned_master(self, master_addr: str, ha_addr: str) -> None:
        """Classic mode: the name servers' answer to a slave's registration names the master."""
        if not self.controller_mode and not self.is_master:
            if master_addr:
                self.master_addr = master_addr
            if ha_addr and not self.config.ha_master_addr:
                self.master_ha_addr = ha_addr

    # --- SYNC_MASTER and the lease -----------------------------------------------------------
    async def _wait_replicated(self, end_offset: int) -> PutStatus:
        assert self.ha_master is not None
        status = await self.ha_master.wait_replicated(end_offset, self.config.slave_timeout,
                                                      self.config.min_in_sync_replicas)
        self.broker.holds.recheck()
        return status

    async def _watch_lease(self) -> None:
        """A master whose lease ran out stops writing until the controller answers again."""
        assert self.link is not None
        period = self.config.controller_lease / LEASE_CHECKS_PER_LEASE
        store = self.broker.store
        assert store is not None
        reason = (f"broker {self.config.broker_name}/{self.config.broker_id}: master lease "
                  "expired (the controller has not answered)")
        while True:
            await asyncio.sleep(period)
            if not self.is_master:
                continue
            if self.link.lease_valid():
                if store.fenced == reason:
                    store.fence("")
            elif store.fenced != reason:
                log.warning("%s; writes refused", reason)
                store.fence(reason)
