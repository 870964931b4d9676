"""A broker group's leadership on etcd: who is master, at which epoch, with which in-sync set.

This is the broker's side of etcd mode (``etcd_endpoints``), offering :class:`~txbroker.cluster.roles.Roles`
what the controller link offers in controller mode: the group's view (:class:`MasterInfo`),
a lease the write gate asks, the first election, and reports of the in-sync set.  There is no
controller process: every broker of the group reads and writes the group's keys in etcd, and
etcd's raft makes each change one decision.  Keys, under ``<etcd_prefix>/<cluster>/<group>/``
(docs/cluster.md, "Consensus on etcd"):

=================  =========================================  ===============================
key                value (JSON)                               bound to
=================  =========================================  ===============================
``leader``         brokerId, address, haAddress, epoch        the master's etcd lease
``epoch``          epoch: the group's last master epoch       nothing (survives every lease)
``isr``            members, epoch (set epoch), masterEpoch    nothing
``replicas/<id>``  address, haAddress, epoch, maxOffset       that replica's etcd lease
=================  =========================================  ===============================

**Leadership.**  The master is whoever holds ``leader``.  An election is one etcd
transaction: ``leader`` absent, ``epoch`` and ``isr`` unchanged since they were read (so the
candidate is still in the set the read showed), then ``leader`` put under the candidate's
lease, ``epoch`` moved to one more than both the key and the candidate's own log hold, and
``isr`` reset to the new master.  The epoch is the fencing token: it goes into the epoch
file, every HA transfer header and the name servers' registrations, each of which refuses an
older one.

**The lease.**  Each broker holds one etcd lease (``etcd_lease`` seconds), renewed every
sixth of it, binding its ``replicas/<id>`` key and, for the master, ``leader``.  etcd deletes
them no sooner than the TTL after it *received* the last renewal, but a TTL is only a
minimum: etcd does not count while it has no leader and a new etcd leader extends every
lease.  So the master never reads etcd's silence as "still mine": it counts itself master
for ``assumed_lease`` after *sending* its last answered renewal of the lease ``leader`` is
bound to (monotonic clock; :meth:`EtcdLeadership.lease_valid`), and no one else can hold
``leader`` before that lease is gone.  A new lease (the old one ran out while etcd was away)
counts for nothing until an election binds ``leader`` to it.

**Failover.**  Every broker reads the group every renewal interval.  With no ``leader``, the
in-sync members race; the one ahead (its published epoch and log end, then the lowest id)
goes first, the others one interval later, so the replica holding the most usually wins.
The first election of a group (no ``epoch`` yet) belongs to the broker configured as id 0,
as in controller mode.  A clean stop revokes the broker's lease: its ``leader`` goes at once
and a slave takes over within an interval.

Event-loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import orjson

from txbroker.cluster.controller_link import (
    ControllerError,
    IdentityTaken,
    MasterInfo,
    ReplicaState,
)
from txbroker.cluster.etcd import (
    GREATER,
    KV,
    Etcd,
    EtcdError,
    EtcdTLS,
    compare_create,
    compare_mod,
    delete,
    parse_endpoints,
    put,
)
from txbroker.config import BrokerConfig
from txbroker.service.repeating import Repeating


class TopicSync(Protocol):
    """What leadership asks of the group's topic table in etcd
    (:class:`txbroker.cluster.topic_keys.GroupTopics`)."""

    async def pull(self) -> None: ...
    async def take_over(self, lead: int) -> None: ...

log = logging.getLogger(__name__)

#: The epoch a classic master (fixed by ``broker_id``, no election) writes under.
CLASSIC_EPOCH = 1
#: Renewals (and group reads) per lease: one lost renewal leaves most of the lease.
RENEWALS_PER_LEASE = 6
#: One etcd call's time-out, as a share of the lease.
CALL_TIMEOUTS_PER_LEASE = 4
#: Intervals a candidate that is not the best waits, after first seeing no master, before it
#: runs for election anyway (the best one may have died too).
DEFER_INTERVALS = 2


@dataclass(frozen=True)
class GroupKeys:
    """The keys of one broker group."""

    base: bytes

    @classmethod
    def of(cls, config: BrokerConfig) -> GroupKeys:
        return cls.named(config.etcd_prefix, config.cluster_name, config.broker_name)

    @classmethod
    def named(cls, prefix: str, cluster: str, group: str) -> GroupKeys:
        """The keys of ``group`` of ``cluster`` under ``prefix`` (the one place the layout
        ``<prefix>/<cluster>/<group>/`` is spelt)."""
        return cls(f"{prefix.rstrip('/')}/{cluster}/{group}/".encode())

    @property
    def leader(self) -> bytes:
        return self.base + b"leader"

    @property
    def epoch(self) -> bytes:
        return self.base + b"epoch"

    @property
    def isr(self) -> bytes:
        return self.base + b"isr"

    @property
    def switchover(self) -> bytes:
        return self.base + b"switchover"

    def replica(self, broker_id: int) -> bytes:
        return self.base + b"replicas/%d" % broker_id


@dataclass(frozen=True)
class GroupState:
    """The group's keys as one linearizable read found them."""

    leader: KV | None
    epoch: KV | None
    isr: KV | None
    replicas: dict[int, KV]
    revision: int
    #: An operator's switch-over request (``txbroker switchover``), bound to a lease of its
    #: own so a request nobody can carry out goes away.
    switchover: KV | None = None

    @classmethod
    def of(cls, keys: GroupKeys, kvs: list[KV], revision: int) -> GroupState:
        by_key = {kv.key: kv for kv in kvs}
        replicas = {}
        for kv in kvs:
            tail = kv.key[len(keys.base):]
            if tail.startswith(b"replicas/") and tail[9:].isdigit():
                replicas[int(tail[9:])] = kv
        return cls(by_key.get(keys.leader), by_key.get(keys.epoch), by_key.get(keys.isr),
                   replicas, revision, by_key.get(keys.switchover))

    @property
    def switchover_to(self) -> int | None:
        """The broker id a switch-over asks for, None without one."""
        doc = _doc(self.switchover)
        return int(doc["to"]) if "to" in doc else None

    @property
    def leader_doc(self) -> dict:
        return _doc(self.leader)

    @property
    def last_epoch(self) -> int:
        return int(_doc(self.epoch).get("epoch", 0))

    @property
    def isr_members(self) -> frozenset[int]:
        return frozenset(int(m) for m in _doc(self.isr).get("members", ()))

    @property
    def isr_epoch(self) -> int:
        return int(_doc(self.isr).get("epoch", 0))

    def info(self) -> MasterInfo:
        """The view Roles follows: the master (None while ``leader`` is absent) and epochs."""
        lead = self.leader_doc
        if not lead:
            return MasterInfo(None, "", "", self.last_epoch, self.isr_epoch, self.isr_members)
        return MasterInfo(int(lead["brokerId"]), str(lead.get("address", "")),
                          str(lead.get("haAddress", "")), int(lead["epoch"]), self.isr_epoch,
                          self.isr_members)


def _doc(kv: KV | None) -> dict:
    if kv is None or not kv.value:
        return {}
    try:
        doc = orjson.loads(kv.value)
    except orjson.JSONDecodeError:
        raise ControllerError(f"etcd key {kv.key!r} does not hold JSON") from None
    if not isinstance(doc, dict):
        raise ControllerError(f"etcd key {kv.key!r} does not hold a JSON object")
    return doc


@contextlib.contextmanager
def _as_refusal() -> Iterator[None]:
    """etcd's failures as the :class:`ControllerError` the broker's roles handle for either
    kind of election (logged, retried at the next round)."""
    try:
        yield
    except EtcdError as exc:
        raise ControllerError(str(exc)) from None


def etcd_client(config: BrokerConfig, timeout: float,
                clock: Callable[[], float] = time.monotonic) -> Etcd:
    """The broker's etcd client: TLS with the peer TLS files when the broker dials its peers
    with TLS, etcd's own authentication when ``etcd_user`` is set."""
    tls = None
    if config.peer_tls_on():
        tls = EtcdTLS.from_files(config.tls_ca, config.tls_cert, config.tls_key)
    return Etcd(parse_endpoints(config.etcd_endpoints), timeout=timeout, tls=tls,
                user=config.etcd_user, password=config.etcd_password, clock=clock)


class EtcdLeadership:
    """One broker's part in its group's leadership on etcd; event-loop only.

    ``state()`` gives the broker's epoch and log end (published for elections);
    ``on_master(info)`` runs, one at a time, whenever the group's master or epoch changes.
    """

    def __init__(self, config: BrokerConfig, *, broker_addr: str, ha_addr: str,
                 state: Callable[[], ReplicaState],
                 on_master: Callable[[MasterInfo], Awaitable[None]],
                 last_log_epoch: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.broker_addr = broker_addr
        self.ha_addr = ha_addr
        self.keys = GroupKeys.of(config)
        self.ttl = int(config.etcd_lease)
        self.interval = self.ttl / RENEWALS_PER_LEASE
        # A member that does not answer within a quarter of the lease is left for the next:
        # a renewal is then at most an interval and a time-out late, well inside the lease.
        self.etcd = etcd_client(config, timeout=self.ttl / CALL_TIMEOUTS_PER_LEASE, clock=clock)
        self._state = state
        self._on_master = on_master
        self._last_log_epoch = last_log_epoch
        self._clock = clock
        self._ticks = Repeating(self.tick, self.interval, what="etcd lease renewal",
                                errors=(ControllerError, EtcdError))
        self._applying = asyncio.Lock()
        #: This broker's etcd lease (0: none yet, or lost).
        self.lease = 0
        #: Sending time (``clock``) of the grant or last answered renewal of ``lease``.
        self.renewed_at = float("-inf")
        #: The lease the ``leader`` key naming this broker is bound to (0: not master).
        self._leader_lease = 0
        #: The last view (None before the first read).
        self.master: MasterInfo | None = None
        self.group: GroupState | None = None
        #: When (``clock``) this broker first saw the group without a master, for deferring.
        self._leaderless_since: float | None = None
        #: The group's topic table in etcd (set by the broker's roles; None in unit tests of
        #: leadership alone), and the ``leader`` create revision it was taken over for.
        self.topics: TopicSync | None = None
        self._taken_over = 0
        #: The "import the controller's state" error was logged (once).
        self._import_said = False

    # --- lifecycle ---------------------------------------------------------------------------
    async def register(self) -> MasterInfo:
        """Take a lease, claim ``replicas/<id>`` (refused if another live process holds
        it), clear a ``leader`` left by this broker's previous process, learn the group."""
        with _as_refusal():
            await self._new_lease()
            return await self.refresh()

    def start(self) -> None:
        self._ticks.start()

    async def close(self) -> None:
        """Stop renewing and revoke the lease: this broker's keys go now, ``leader`` too,
        so a slave takes over at its next read instead of after a TTL."""
        await self._ticks.close()
        lease, self.lease, self._leader_lease = self.lease, 0, 0
        if lease:
            try:
                await self.etcd.revoke(lease)
            except EtcdError as exc:
                log.warning("etcd lease of %s not revoked (its keys expire with it): %s",
                            self.config.broker_name, exc)
        await self.etcd.close()

    def lease_valid(self, margin: float = 0.0) -> bool:
        """Whether this broker may take writes as master for ``margin`` more seconds: the
        lease ``leader`` is bound to was renewed less than ``etcd_lease`` ago, counted from
        the renewal's sending time (the caller's margin holds the drift allowance)."""
        if not self.lease or self._leader_lease != self.lease:
            return False
        return self._clock() + margin - self.renewed_at < self.ttl

    # --- one round ---------------------------------------------------------------------------
    async def tick(self) -> None:
        """Renew the lease, read the group, run for election when it has no master; a
        replica that is not master takes the group's topic table."""
        await self._renew()
        info = await self.refresh()
        if info.master_id is None:
            await self._maybe_elect()
        else:
            self._leaderless_since = None
            await self._maybe_step_down()
        if self.topics is not None and self.leader_revision() is None:
            await self.topics.pull()

    def leader_revision(self) -> int | None:
        """The create revision of ``leader`` while it names this broker under its current
        lease (the fencing token metadata changes are checked against), else None."""
        group = self.group
        if group is None or group.leader is None or not self.lease:
            return None
        if group.leader.lease != self.lease or \
                int(group.leader_doc["brokerId"]) != self.config.broker_id:
            return None
        return group.leader.create_revision

    async def _renew(self) -> None:
        if not self.lease:
            await self._new_lease()
            return
        lease = self.lease
        sent, ttl = await self.etcd.keep_alive(lease)
        if lease != self.lease:
            return  # replaced meanwhile
        if ttl <= 0:
            log.warning("etcd lease of %s (id %d) ran out while etcd was unreachable; taking a "
                        "new one", self.config.broker_name, self.config.broker_id)
            self.lease, self._leader_lease = 0, 0
            await self._new_lease()
            return
        self.renewed_at = max(self.renewed_at, sent)

    async def _new_lease(self) -> None:
        sent = self._clock()
        lease, _granted = await self.etcd.grant(self.ttl)
        await self._claim_replica(lease)
        self.lease, self.renewed_at = lease, sent

    async def _claim_replica(self, lease: int) -> None:
        """``replicas/<id>`` under ``lease``: created if absent, taken over if it names this
        broker's address (a restart before the old lease ran out: that process is gone, since
        it held the data directory), refused if another address holds it."""
        key = self.keys.replica(self.config.broker_id)
        value = self._replica_value()
        for _ in range(3):
            current = await self.etcd.get(key)
            if current is not None:
                holder = _doc(current).get("address")
                if holder != self.broker_addr:
                    await self.etcd.revoke(lease)
                    raise IdentityTaken(f"etcd: {self.config.broker_name} id "
                                        f"{self.config.broker_id} is held by {holder}, alive "
                                        f"(its lease holds); not by {self.broker_addr}")
                if current.lease and current.lease != lease:
                    await self._drop_old_lease(current.lease)
            rev = current.mod_revision if current is not None else 0
            result = await self.etcd.txn([compare_mod(key, rev)], [put(key, value, lease)])
            if result.succeeded:
                return
        raise ControllerError(f"etcd: {key!r} keeps changing; not claimed")

    async def _drop_old_lease(self, old: int) -> None:
        """Revoke a lease this broker's previous process held: its ``leader`` (if it was
        master) goes with it, so the group elects now rather than after the old TTL."""
        log.info("etcd: revoking lease %d of this broker's previous process", old)
        await self.etcd.revoke(old)

    def _replica_value(self) -> bytes:
        st = self._state()
        return orjson.dumps({"address": self.broker_addr, "haAddress": self.ha_addr,
                             "epoch": max(st.epoch, self._last_log_epoch()),
                             "maxOffset": st.max_offset})

    async def _read_group(self) -> GroupState:
        """The group's keys now (one linearizable range read)."""
        kvs, revision = await self.etcd.range(self.keys.base)
        return GroupState.of(self.keys, kvs, revision)

    async def refresh(self) -> MasterInfo:
        """Read the group (linearizable) and hand a changed master to the broker."""
        group = self.group = await self._read_group()
        lead = group.leader_doc
        mine = bool(lead) and int(lead["brokerId"]) == self.config.broker_id
        if mine and group.leader is not None and group.leader.lease != self.lease:
            # A leader key naming this id under a lease this process does not hold: a previous
            # process's, about to expire.  Nobody may write until it does.
            info = MasterInfo(None, "", "", group.last_epoch, group.isr_epoch, group.isr_members)
            self._leader_lease = 0
        else:
            info = group.info()
            self._leader_lease = self.lease if mine else 0
            lead = self.leader_revision()
            if lead is not None and lead != self._taken_over and self.topics is not None:
                # Elected: every topic an earlier master acknowledged, before any write.
                await self.topics.take_over(lead)
                self._taken_over = lead
        await self._learn(info)
        return info

    async def _learn(self, info: MasterInfo) -> None:
        async with self._applying:
            last = self.master
            self.master = info
            if last is not None and (info.master_id, info.master_epoch, info.master_addr) == \
                    (last.master_id, last.master_epoch, last.master_addr):
                return
            await self._on_master(info)

    # --- elections ---------------------------------------------------------------------------
    def _eligible(self, group: GroupState) -> bool:
        me = self.config.broker_id
        if group.epoch is None and group.isr is None:
            # The group's first election: the broker configured as master, unless its log
            # was written under a controller (an epoch above the classic 1), whose in-sync
            # set etcd does not know yet: electing it could elect a replica lacking writes.
            last = self._last_log_epoch()
            if me == 0 and last > CLASSIC_EPOCH:
                if not self._import_said:
                    self._import_said = True
                    log.error("group %s has no state in etcd, but this broker's log holds epoch "
                              "%d (written under a controller): import the controller's state "
                              "first: txbroker etcd-import --controller-data DIR "
                              "--etcd-endpoints %s", self.config.broker_name, last,
                              self.config.etcd_endpoints)
                return False
            return me == 0
        target = group.switchover_to
        if target is not None and target in group.isr_members and target in group.replicas:
            return me == target  # a switch-over names who is next
        return me in group.isr_members

    async def _maybe_step_down(self) -> None:
        """A switch-over to another live in-sync replica: fence first (the broker is told
        the group has no master, and demotes itself: no write from then on), then give up
        ``leader``; only the named replica may be elected while the request stands."""
        group, lead = self.group, self.leader_revision()
        if group is None or lead is None:
            return
        target = group.switchover_to
        me = self.config.broker_id
        if target is None or target == me or target not in group.isr_members \
                or target not in group.replicas:
            return
        log.warning("etcd: %s id %d hands group %s over to id %d (switch-over): fencing, then "
                    "releasing the leader key", self.broker_addr, me, self.config.broker_name,
                    target)
        self._leader_lease = 0  # the write gate closes now, whatever the role's state
        await self._learn(MasterInfo(None, "", "", group.last_epoch, group.isr_epoch,
                                     group.isr_members))
        await self.etcd.txn([compare_create(self.keys.leader, lead)], [delete(self.keys.leader)])
        await self.refresh()

    async def _maybe_elect(self) -> None:
        group = self.group
        if group is None or not self.lease or not self._eligible(group):
            return
        if group.switchover_to == self.config.broker_id:
            await self._elect()  # named by a switch-over: no ranking, no waiting
            return
        now = self._clock()
        if self._leaderless_since is None:
            self._leaderless_since = now
            # Publish this replica's epoch and log end for the others' ranking.
            key = self.keys.replica(self.config.broker_id)
            await self.etcd.txn([compare_create(key, 0, GREATER)],
                                [put(key, self._replica_value(), self.lease)])
            if group.epoch is not None and not self._best(group):
                return
        elif not self._best(group) and now - self._leaderless_since < DEFER_INTERVALS * self.interval:
            return
        await self._elect()

    def _best(self, group: GroupState) -> bool:
        """Whether this broker ranks first among the live in-sync replicas (their published
        epoch and log end, higher first; then the lower id)."""
        def rank(broker_id: int) -> tuple[int, int, int]:
            doc = _doc(group.replicas.get(broker_id))
            return (-int(doc.get("epoch", 0)), -int(doc.get("maxOffset", 0)), broker_id)
        me = self.config.broker_id
        others = [m for m in group.isr_members if m in group.replicas and m != me]
        if not others:
            return True
        st = self._state()
        mine = (-max(st.epoch, self._last_log_epoch()), -st.max_offset, me)
        return mine <= min(rank(m) for m in others)

    async def elect(self) -> MasterInfo:
        """Run for master now: one etcd transaction (see the module docstring).  Returns the
        view after it, whoever won."""
        with _as_refusal():
            return await self._elect()

    async def _elect(self) -> MasterInfo:
        group = self.group = await self._read_group()
        if group.leader is not None or not self.lease or not self._eligible(group):
            return await self.refresh()
        epoch = max(group.last_epoch, self._last_log_epoch()) + 1
        me = self.config.broker_id
        k = self.keys
        leader = orjson.dumps({"brokerId": me, "address": self.broker_addr,
                               "haAddress": self.ha_addr, "epoch": epoch})
        isr = orjson.dumps({"members": [me], "epoch": group.isr_epoch + 1, "masterEpoch": epoch})
        result = await self.etcd.txn(
            [compare_create(k.leader, 0),
             compare_mod(k.epoch, group.epoch.mod_revision if group.epoch else 0),
             compare_mod(k.isr, group.isr.mod_revision if group.isr else 0)],
            [put(k.leader, leader, self.lease), put(k.epoch, orjson.dumps({"epoch": epoch})),
             put(k.isr, isr), delete(k.switchover)])
        if result.succeeded:
            self._leader_lease = self.lease
            log.warning("etcd: %s id %d elected master of group %s, epoch %d", self.broker_addr,
                        me, self.config.broker_name, epoch)
        return await self.refresh()

    async def alter_sync_state_set(self, members: set[int] | frozenset[int],
                                   master_epoch: int) -> MasterInfo:
        """The master makes the group's in-sync set ``members``: one transaction that checks
        this broker still holds ``leader`` under ``master_epoch`` and every other member is
        alive (its replica key exists).  Returns the view once the set is ``members``."""
        with _as_refusal():
            return await self._alter(frozenset(members), master_epoch)

    async def _alter(self, wanted: frozenset[int], master_epoch: int) -> MasterInfo:
        k = self.keys
        me = self.config.broker_id
        for _ in range(3):
            group = self.group
            if group is None:
                await self.refresh()
                group = self.group
                assert group is not None
            lead = group.leader_doc
            if not lead or int(lead["brokerId"]) != me or int(lead["epoch"]) != master_epoch \
                    or group.leader is None or group.leader.lease != self.lease:
                raise ControllerError(f"etcd: {self.config.broker_name} id {me} is not the "
                                      f"master under epoch {master_epoch}")
            if group.isr_members == wanted:
                return group.info()
            isr = orjson.dumps({"members": sorted(wanted), "epoch": group.isr_epoch + 1,
                                "masterEpoch": master_epoch})
            compares = [compare_create(k.leader, group.leader.create_revision),
                        compare_mod(k.isr, group.isr.mod_revision if group.isr else 0)]
            compares += [compare_create(k.replica(m), 0, GREATER) for m in wanted if m != me]
            result = await self.etcd.txn(compares, [put(k.isr, isr)])
            await self.refresh()
            if result.succeeded:
                assert self.group is not None
                return self.group.info()
            missing = [m for m in wanted if m != me and m not in (self.group.replicas
                                                                    if self.group else {})]
            if missing:
                raise ControllerError(f"etcd: in-sync set {sorted(wanted)} refused: replicas "
                                      f"{missing} are not alive")
        raise ControllerError(f"etcd: in-sync set {sorted(wanted)} not accepted: the group's "
                              f"keys keep changing")
