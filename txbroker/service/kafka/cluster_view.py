"""The Kafka view of a whole cluster: one Kafka node per broker group, one partition numbering
across groups (docs/kafka.md, "Kafka on a cluster").

Kafka clients know nodes and partitions; a txbroker cluster has broker groups (a master and
its slaves) and queues.  The mapping, chosen so that nothing a client holds changes at a
failover:

* **A broker group is one Kafka node** whose id is the group's ``kafka_node_id`` (configured
  the same on every replica of the group, different between groups).  The node's address is
  the Kafka listener of the group's master *now*; after a failover the same node id answers
  at the new master's address, as a Kafka broker that restarted elsewhere would.
* **A topic's partitions are its queues across groups**, groups taken in node-id order:
  with ``broker-a`` (node 1, 4 queues) and ``broker-b`` (node 2, 2 queues), partitions 0-3 are
  ``broker-a``'s queues 0-3 and 4-5 ``broker-b``'s queues 0-1.  A group that joins later with
  a higher node id adds partitions at the end, as Kafka adds partitions.
* **The leader** of a partition is its group's node; while a group has no master its
  partitions have no leader (LEADER_NOT_AVAILABLE) and keep their numbers.

Where it comes from: every ``kafka_cluster_refresh_interval`` the view asks a name server for
the cluster's groups and their masters (GET_BROKER_CLUSTER_INFO, id 0 = master), asks every
group's master for its topic table (GET_ALL_TOPIC_CONFIG) and, once per broker address, for
its Kafka address and node id (GET_BROKER_RUNTIME_INFO's ``kafkaAddr`` and ``kafkaNodeId``).
This broker's own group is read locally: its own role decides whether it leads, and its
topic table is its own (a slave's is copied from its master).  A group whose master is gone
keeps the node id and the topic table last seen, so its partitions keep their numbers.

**One numbering or none.**  A numbering depends on every group's table, so a view that lacks
one (before its first round, a group listed whose node id or table it never learned, two
groups claiming one node id) would number partitions differently from the other brokers; a
client that read it would send a batch numbered for one queue to another.  Until the view is
*complete* (:meth:`ClusterView.ready`) the handlers offer no numbering at all (Metadata
LEADER_NOT_AVAILABLE, partitions NOT_LEADER_OR_FOLLOWER, coordinators NOT_COORDINATOR), which
clients retry.  Within a round the tables are read from the highest node id down, this
group's own included, and take effect together at the round's end: a topic created group by
group from the lowest node id up (``cluster_admin.py``) is therefore seen as a prefix of its
groups, and no group's block of partitions moves while it is being created.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from txbroker.cluster.slave_sync import parse_topic_table
from txbroker.config import BrokerConfig, ConfigError, parse_address_list
from txbroker.remoting.bodies import ClusterInfo, KVTable
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.header_codec import HeaderError
from txbroker.remoting.headers import (
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from txbroker.remoting.signing import SessionCredentials
from txbroker.service.repeating import Repeating
from txbroker.service.topics import TopicManager

log = logging.getLogger("txbroker.kafka")

#: One request of a refresh round waits at most this long.
REQUEST_TIMEOUT = 3.0
#: A Metadata request that finds the view incomplete waits this many refresh rounds for it.
COMPLETE_WAIT_ROUNDS = 3
#: How often that wait looks again.
COMPLETE_POLL = 0.05
#: A topic just created is listed after at most this many rounds ended since (the round under
#: way may have read the tables before the creation).
KNOWN_WAIT_ROUNDS = 2
#: Runtime-info keys a broker publishes its Kafka listener under (see ``Broker._runtime``).
KAFKA_ADDR_KEY = "kafkaAddr"
KAFKA_NODE_KEY = "kafkaNodeId"


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, 32-bit signed)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_index(key: str, count: int) -> int:
    """Which of ``count`` coordinators owns ``key``: Kafka's ``Utils.abs(key.hashCode) %
    partitionCount`` for ``__consumer_offsets`` and ``__transaction_state``."""
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % count


@dataclass(frozen=True, slots=True)
class KafkaNode:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a global partition lives: its group, that group's queue, the leader now."""

    partition: int
    broker_name: str
    node_id: int
    queue_id: int
    #: The group's master's Kafka node now; None while the group has no known master.
    leader: KafkaNode | None
    #: Whether this broker is that leader (it may read and write the queue).
    local: bool


@dataclass(slots=True)
class _Group:
    name: str
    node_id: int | None = None
    leader: KafkaNode | None = None
    #: The master's broker (RocketMQ) address now, "" while none is known.
    master_addr: str = ""
    #: topic -> read queue count, as the group's master last reported it.
    topics: dict[str, int] = field(default_factory=dict)
    #: Whether ``topics`` was ever read (an empty table and an unknown one differ).
    table_seen: bool = False
    #: Every broker of the group answered and none has a Kafka listener: not a Kafka node.
    no_kafka: bool = False


class NodeIdClash(ConfigError):
    """Two broker groups claim one Kafka node id (``str()`` is the one line that says so)."""


class ClusterView:
    """This broker's picture of the Kafka cluster, refreshed in the background.

    ``is_master()`` says whether this broker is its group's master now; ``node`` is its own
    Kafka node (its id is the group's)."""

    def __init__(self, config: BrokerConfig, topics: TopicManager, *, node: KafkaNode,
                 is_master: Callable[[], bool],
                 credentials: SessionCredentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.topics = topics
        self.node = node
        self.is_master = is_master
        self.credentials = credentials
        self._groups: dict[str, _Group] = {}
        #: broker address -> (node id, Kafka node); (None, None) when it has no Kafka listener.
        self._kafka_of: dict[str, tuple[int | None, KafkaNode | None]] = {}
        self._clients: dict[str, RemotingClient] = {}
        #: The name servers and brokers are dialled as the broker dials its peers (its
        #: ``PeerTLS`` context; None: plaintext).
        self._tls = tls
        self._namesrvs = parse_address_list(config.namesrv_addr)
        self._rounds = Repeating(self.refresh, config.kafka_cluster_refresh_interval,
                                 what="Kafka cluster view refresh",
                                 errors=(OSError, TimeoutError, ValueError, HeaderError))
        #: Completed refresh rounds (tests wait on it).
        self.rounds = 0
        #: Why the view offers no numbering now ("" once it is complete).
        self.incomplete = "no refresh round has completed yet"
        #: Set while another group claims this broker's own node id: the line saying so.
        self.own_clash = ""
        self._clashes_logged: set[str] = set()

    async def start(self) -> None:
        """The first round, then one every ``kafka_cluster_refresh_interval``.  A first round
        that finds this broker's node id claimed by another group raises :class:`NodeIdClash`:
        the broker does not start."""
        try:
            await self.refresh()
            if self.own_clash:
                raise NodeIdClash(self.own_clash)
        except NodeIdClash:
            raise
        except (OSError, TimeoutError, ValueError, HeaderError) as exc:
            log.warning("Kafka cluster view: first refresh failed (%s); retrying every %g s",
                        exc, self.config.kafka_cluster_refresh_interval)
        self._rounds.start()

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        """How this node dials its peers (None: plaintext): the name servers and masters
        asked here, and the Kafka listeners that admin requests are forwarded to
        (``cluster_admin.forward``) and markers sent to (``markers.py``)."""
        return self._tls

    async def close(self) -> None:
        await self._rounds.close()
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    # --- what handlers ask ------------------------------------------------------------------
    def leads(self) -> bool:
        return self.is_master()

    def ready(self) -> bool:
        """Whether the view knows every group's node id and table: only then does it number
        partitions or place coordinators (see the module docstring)."""
        return not self.incomplete

    async def wait_complete(self) -> bool:
        """Wait up to :data:`COMPLETE_WAIT_ROUNDS` refresh rounds for the view to be complete;
        whether it is.  A broker serves Kafka before its view's first round (it starts right
        after it registers); a Metadata answer without the topics in that window makes a
        consumer's subscribed topic vanish and come back, and each change rebalances its
        group, which re-reads the committed offsets while a transaction may be committing
        newer ones (an exactly-once app then reprocesses a batch)."""
        interval = self.config.kafka_cluster_refresh_interval
        return await self._poll(self.ready, COMPLETE_WAIT_ROUNDS * interval)

    async def wait_known(self, topic: str) -> bool:
        """Wait until a refresh round lists ``topic``, at most :data:`KNOWN_WAIT_ROUNDS`
        rounds (and never longer than that many intervals and one more); whether it is listed."""
        last = self.rounds + KNOWN_WAIT_ROUNDS
        interval = self.config.kafka_cluster_refresh_interval
        await self._poll(lambda: self.known(topic) or self.rounds >= last,
                         (KNOWN_WAIT_ROUNDS + 1) * interval)
        return self.known(topic)

    @staticmethod
    async def _poll(done: Callable[[], bool], seconds: float) -> bool:
        """Look every :data:`COMPLETE_POLL` until ``done()`` or ``seconds`` pass; ``done()``.
        Polled: a Kafka handler's first step runs outside any task (remoting/_flow.py), where
        asyncio.timeout cannot be used."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not done() and loop.time() < deadline:
            await asyncio.sleep(COMPLETE_POLL)
        return done()

    def nodes(self) -> list[KafkaNode]:
        """Every node with a known leader now, by node id (this broker's when it leads)."""
        out = {g.leader.node_id: g.leader for g in self._groups.values() if g.leader is not None}
        if self.leads():
            out[self.node.node_id] = self.node
        return [out[k] for k in sorted(out)]

    def known(self, topic: str) -> bool:
        return bool(self.slots(topic))

    def slots(self, topic: str) -> list[Slot]:
        """The topic's partitions in global order (empty: no group has it)."""
        counts: list[tuple[int, str, int, KafkaNode | None, bool]] = []
        for g in self._groups.values():
            n = g.topics.get(topic, 0)
            if g.name == self.config.broker_name:
                if n > 0:
                    counts.append((self.node.node_id, g.name, n,
                                   self.node if self.leads() else self._own_leader(),
                                   self.leads()))
            elif g.node_id is not None and n > 0:
                counts.append((g.node_id, g.name, n, g.leader, False))
        counts.sort(key=lambda c: c[0])
        out: list[Slot] = []
        for node_id, name, n, leader, local in counts:
            for q in range(n):
                out.append(Slot(len(out), name, node_id, q, leader, local))
        return out

    def slot(self, topic: str, partition: int) -> Slot | None:
        slots = self.slots(topic)
        return slots[partition] if 0 <= partition < len(slots) else None

    def global_partition(self, topic: str, queue_id: int) -> int:
        """This broker's queue ``queue_id`` of ``topic`` as a global partition number."""
        for s in self.slots(topic):
            if s.broker_name == self.config.broker_name and s.queue_id == queue_id:
                return s.partition
        return queue_id

    def topic_names(self) -> set[str]:
        names: set[str] = set()
        for g in self._groups.values():
            names.update(g.topics)
        return names

    def holders(self, topic: str) -> list[tuple[int, str, int]]:
        """(node id, broker group, queue count) of every group holding ``topic``, by node id."""
        out = [(self.node.node_id if g.name == self.config.broker_name else g.node_id, g.name,
                g.topics[topic]) for g in self._groups.values()
               if g.topics.get(topic, 0) > 0
               and (g.node_id is not None or g.name == self.config.broker_name)]
        return sorted(out)  # type: ignore[arg-type]

    def groups(self) -> list[tuple[int, str, KafkaNode | None]]:
        """(node id, broker group, its master's Kafka node now or None) of every Kafka node."""
        out = {self.node.node_id: (self.node.node_id, self.config.broker_name,
                                   self.node if self.leads() else self._own_leader())}
        for g in self._groups.values():
            if g.name != self.config.broker_name and g.node_id is not None:
                out.setdefault(g.node_id, (g.node_id, g.name, g.leader))
        return [out[k] for k in sorted(out)]

    def coordinator(self, key: str) -> tuple[KafkaNode | None, bool]:
        """The node coordinating group or transactional id ``key`` (None while its group has
        no master) and whether that is this broker.  The groups known, in node-id order, take
        the keys by Kafka's hash; a group keeps its keys through a failover (its node id
        does not change), a group added later takes some keys over."""
        groups: dict[int, tuple[KafkaNode | None, bool]] = {
            self.node.node_id: (self.node if self.leads() else self._own_leader(), self.leads())}
        for g in self._groups.values():
            if g.name != self.config.broker_name and g.node_id is not None:
                groups.setdefault(g.node_id, (g.leader, False))
        ids = sorted(groups)
        return groups[ids[coordinator_index(key, len(ids))]]

    def coordinator_group(self, key: str) -> str:
        """The broker group coordinating ``key`` (the one :meth:`coordinator` names)."""
        names = {self.node.node_id: self.config.broker_name}
        for g in self._groups.values():
            if g.name != self.config.broker_name and g.node_id is not None:
                names.setdefault(g.node_id, g.name)
        ids = sorted(names)
        return names[ids[coordinator_index(key, len(ids))]]

    def leader_of(self, broker_name: str) -> KafkaNode | None:
        """The Kafka node of a group's master now (None while it has none)."""
        if broker_name == self.config.broker_name and self.leads():
            return self.node
        g = self._groups.get(broker_name)
        return g.leader if g is not None else None

    def _own_leader(self) -> KafkaNode | None:
        g = self._groups.get(self.config.broker_name)
        return g.leader if g is not None else None

    # --- consumer offsets of other groups' queues -------------------------------------------
    async def commit_offset(self, broker_name: str, group: str, topic: str, queue_id: int,
                            offset: int) -> bool:
        """Store a consumer offset in the broker group owning the queue (its master), as a
        RocketMQ consumer does: one table per group, shared by both protocols."""
        addr = self._master_of(broker_name)
        if not addr:
            return False
        header = UpdateConsumerOffsetRequestHeader(consumer_group=group, topic=topic,
                                                   queue_id=queue_id, commit_offset=offset)
        try:
            await self._call(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET,
                                                           header.to_ext()))
        except (OSError, TimeoutError, ValueError) as exc:
            log.info("offset of %s on %s-%d not stored at %s: %s", group, topic, queue_id, addr, exc)
            return False
        return True

    async def fetch_offset(self, broker_name: str, group: str, topic: str,
                           queue_id: int) -> int | None:
        """The committed offset in the owning group (-1: none); None when it cannot be asked."""
        addr = self._master_of(broker_name)
        if not addr:
            return None
        # Not found is -1 to a Kafka client (its auto.offset.reset applies), not RocketMQ's 0.
        header = QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic,
                                                  queue_id=queue_id, set_zero_if_not_found=False)
        cmd = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
        try:
            resp = await self._call(addr, cmd, ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        except (OSError, TimeoutError, ValueError) as exc:
            log.info("offset of %s on %s-%d not read at %s: %s", group, topic, queue_id, addr, exc)
            return None
        if resp.code != ResponseCode.SUCCESS:
            return -1
        return int(resp.ext_fields.get("offset", -1))

    def _master_of(self, broker_name: str) -> str:
        g = self._groups.get(broker_name)
        return g.master_addr if g is not None and g.leader is not None else ""

    # --- refresh ----------------------------------------------------------------------------
    async def refresh(self) -> None:
        """One round: the groups and their masters from the name servers, each address's
        Kafka listener (once), then every group's topic table from the highest node id down,
        applied together at the end (see the module docstring)."""
        info = await self._cluster_info()
        names = set(info.cluster_addr_table.get(self.config.cluster_name, ()))
        names.add(self.config.broker_name)
        for name in sorted(names):
            data = info.broker_addr_table.get(name)
            g = self._groups.setdefault(name, _Group(name))
            if name == self.config.broker_name:
                g.node_id = self.node.node_id
            if data is None:
                continue
            answered = True
            for addr in sorted(data.broker_addrs.values()):
                if addr not in self._kafka_of:
                    await self._learn(addr)
                known = self._kafka_of.get(addr)
                if known is None:
                    answered = False
                elif known[0] is not None and name != self.config.broker_name:
                    g.node_id = known[0]
            g.no_kafka = answered and g.node_id is None and name != self.config.broker_name
            master = data.master_addr()
            leader = self._kafka_of[master][1] if master in self._kafka_of else None
            if leader != g.leader:
                log.info("Kafka node %s (group %s) is now %s", g.node_id, name,
                         f"{leader.host}:{leader.port}" if leader else "without a leader")
            g.leader = leader
            g.master_addr = master or ""
        tables: dict[str, dict[str, int]] = {}
        for g in sorted(self._groups.values(), key=lambda g: -1 if g.node_id is None else g.node_id,
                        reverse=True):
            if g.name == self.config.broker_name:
                tables[g.name] = {tc.name: tc.read_queue_nums for tc in self.topics.all()}
            elif g.node_id is not None and g.master_addr and g.leader is not None:
                try:
                    body = await self._ask(g.master_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
                    tables[g.name] = {tc.name: tc.read_queue_nums
                                      for tc in parse_topic_table(body)}
                except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                    log.debug("topic table of %s from %s: %s", g.name, g.master_addr, exc)
        for name, table in tables.items():  # no await from here on: one consistent picture
            self._groups[name].topics = table
            self._groups[name].table_seen = True
        self.incomplete = self._why_incomplete(names)
        # Addresses no group lists any more: a restarted broker may come back with other ports.
        listed = {a for d in info.broker_addr_table.values() for a in d.broker_addrs.values()}
        for addr in [a for a in self._kafka_of if a not in listed]:
            del self._kafka_of[addr]
            client = self._clients.pop(addr, None)
            if client is not None:
                await client.close()
        self.rounds += 1

    def _why_incomplete(self, listed: set[str]) -> str:
        """"" when every listed group's node id and table are known and no two groups claim
        one node id; else why not (a clash is logged once, as an error: an operator's fix)."""
        claims: dict[int, list[str]] = {}
        for g in self._groups.values():
            if g.node_id is not None and g.name in listed:
                claims.setdefault(g.node_id, []).append(g.name)
        self.own_clash = ""
        for node_id, groups in sorted(claims.items()):
            if len(groups) > 1:
                who = ", ".join(f"{n} (master {self._groups[n].master_addr or 'unknown'})"
                                for n in sorted(groups))
                line = (f"kafka_node_id={node_id} is claimed by broker groups {who} of cluster "
                        f"{self.config.cluster_name!r}: give each group its own kafka_node_id "
                        f"(the same on its replicas)")
                if line not in self._clashes_logged:
                    self._clashes_logged.add(line)
                    log.error("%s", line)
                if self.config.broker_name in groups:
                    self.own_clash = line
                return line
        self._clashes_logged.clear()
        for name in sorted(listed):
            g = self._groups[name]
            if g.no_kafka:
                continue
            if g.node_id is None:
                return f"the Kafka node id of broker group {name} is not known yet"
            if not g.table_seen:
                return f"the topic table of broker group {name} is not known yet"
        return ""

    async def _cluster_info(self) -> ClusterInfo:
        """Every name server's answer merged: a name server that restarted lists only the
        groups that registered since, so one answer alone may leave a group out."""
        last: Exception | None = None
        merged = ClusterInfo()
        answered = False
        for addr in self._namesrvs:
            try:
                info = ClusterInfo.decode(await self._ask(addr, RequestCode.GET_BROKER_CLUSTER_INFO))
            except (OSError, TimeoutError, ValueError, HeaderError) as exc:
                last = exc
                continue
            answered = True
            for name, data in info.broker_addr_table.items():
                merged.broker_addr_table.setdefault(name, data)
            for cluster, groups in info.cluster_addr_table.items():
                have = merged.cluster_addr_table.setdefault(cluster, [])
                have.extend(n for n in groups if n not in have)
        if not answered:
            raise last if last is not None else ValueError("no name server configured")
        return merged

    async def _learn(self, addr: str) -> None:
        """The Kafka node id and address a broker publishes (nothing when it cannot say)."""
        try:
            table = KVTable.decode(await self._ask(addr, RequestCode.GET_BROKER_RUNTIME_INFO)).table
        except (OSError, TimeoutError, ValueError, HeaderError) as exc:
            log.debug("runtime info of %s: %s", addr, exc)
            return
        node = table.get(KAFKA_NODE_KEY, "")
        if not node.lstrip("-").isdigit() or int(node) < 0:
            self._kafka_of[addr] = (None, None)  # no Kafka listener (or one not published)
            return
        host, _, port = table.get(KAFKA_ADDR_KEY, "").rpartition(":")
        kafka = KafkaNode(int(node), host, int(port)) if host and port.isdigit() else None
        self._kafka_of[addr] = (int(node), kafka)

    async def _ask(self, addr: str, code: int) -> bytes:
        resp = await self._call(addr, RemotingCommand.request(code))
        return resp.body or b"{}"

    async def _call(self, addr: str, cmd: RemotingCommand,
                    ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = RemotingClient(addr, connect_timeout=REQUEST_TIMEOUT,
                                                          credentials=self.credentials,
                                                          ssl=self._tls)
        # wait_for, not asyncio.timeout: a Kafka handler's first step runs inline, outside any
        # task, where asyncio.timeout refuses to work.  (On 3.11 wait_for can swallow a cancel;
        # the refresh loop still ends at close: Repeating checks its closed flag.)
        resp = await asyncio.wait_for(client.invoke(cmd, REQUEST_TIMEOUT), REQUEST_TIMEOUT)
        if resp.code not in ok:
            raise ValueError(f"{addr} answered request {cmd.code} with {resp.code}: "
                             f"{resp.remark or ''}")
        return resp
