"""Who is connected: producer groups and consumer groups with their subscriptions.

Two things depend on this registry.  The transaction check service needs a live connection of
a half message's producer group; RocketMQ learns those only from heartbeats, but a producer
heartbeats 10 ms after start and only to brokers it already knows, so its first half messages
can arrive before any heartbeat (docs/protocol.md §8.7).  txbroker therefore also records the
connection that *sent* for a group.  Consumers rebalance queues among the members a broker
reports for their group; when membership changes (heartbeat join, unregister, disconnect,
expiry) every remaining member is told with a one-way NOTIFY_CONSUMER_IDS_CHANGED so it
rebalances now rather than at its next 20 s timer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.filter import SUB_ALL

log = logging.getLogger(__name__)

#: A client silent for this long is dropped (RocketMQ's channel expiry is 120 s).
CLIENT_EXPIRY = 120.0


@dataclass
class Subscription:
    """One topic subscription of a consumer group: the expression and its parsed tags
    (``remoting.filter.parse_tag_expression``)."""

    topic: str
    expression: str = SUB_ALL
    tags: frozenset[str] = frozenset()
    version: int = 0
    expression_type: str = "TAG"

    @property
    def matches_all(self) -> bool:
        return self.expression == SUB_ALL


@dataclass
class ConsumerEntry:
    client_id: str
    conn: Any
    subscriptions: dict[str, Subscription]
    last_seen: float
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"


@dataclass
class _ProducerGroup:
    #: connection id -> (connection, last activity); insertion order = activity order.
    members: dict[int, tuple[Any, float]] = field(default_factory=dict)


class ClientRegistry:
    """Producer and consumer membership.  Event-loop only; no locking needed."""

    def __init__(self, *, clock: Callable[[], float] = time.time,
                 expiry: float = CLIENT_EXPIRY) -> None:
        self._clock = clock
        self.expiry = expiry
        self._producers: dict[str, _ProducerGroup] = {}
        self._consumers: dict[str, dict[str, ConsumerEntry]] = {}
        #: connection id -> client id announced on it (heartbeat / unregister).
        self._client_ids: dict[int, str] = {}

    # --- producers ----------------------------------------------------------------------
    def note_producer(self, group: str, conn: Any) -> None:
        """Remember ``conn`` as the most recently active connection of ``group``.

        Called on every send, so it is kept to two dict operations.
        """
        pg = self._producers.get(group)
        if pg is None:
            pg = self._producers[group] = _ProducerGroup()
        members = pg.members
        members.pop(conn.id, None)
        members[conn.id] = (conn, self._clock())

    def producer_connections(self, group: str) -> list[Any]:
        """Live connections of ``group``, most recently active first."""
        pg = self._producers.get(group)
        if pg is None:
            return []
        return [conn for conn, _ in reversed(pg.members.values()) if not conn.closed]

    def producer_groups(self) -> dict[str, int]:
        return {g: len(self.producer_connections(g)) for g in sorted(self._producers)
                if self.producer_connections(g)}

    # --- consumers ----------------------------------------------------------------------
    def consumer_ids(self, group: str) -> list[str]:
        """Client ids of the group's members, sorted (clients rebalance on this order)."""
        return sorted(self._consumers.get(group, {}))

    def consumer_groups(self) -> dict[str, dict[str, ConsumerEntry]]:
        return self._consumers

    def subscription(self, group: str, topic: str) -> Subscription | None:
        """Any member's subscription of ``topic`` (a group shares one subscription set)."""
        for entry in self._consumers.get(group, {}).values():
            sub = entry.subscriptions.get(topic)
            if sub is not None:
                return sub
        return None

    # --- heartbeat / unregister / disconnect ---------------------------------------------
    def heartbeat(self, conn: Any, client_id: str, producer_groups: Iterable[str],
                  consumers: Iterable[tuple[str, ConsumerEntry]]) -> None:
        """Apply one HEART_BEAT (``consumers`` = (group, entry) pairs).

        Members of a group that gained a client are notified.
        """
        now = self._clock()
        if client_id:
            self._client_ids[conn.id] = client_id
        for group in producer_groups:
            self.note_producer(group, conn)
        for group_name, entry in consumers:
            members = self._consumers.setdefault(group_name, {})
            old = members.get(entry.client_id)
            entry.last_seen = now
            members[entry.client_id] = entry
            if old is None or old.conn is not conn:
                log.info("consumer %s joined group %s", entry.client_id, group_name)
                self.notify_changed(group_name)

    def unregister(self, conn: Any, client_id: str, producer_group: str | None,
                   consumer_group: str | None) -> None:
        if producer_group:
            pg = self._producers.get(producer_group)
            if pg is not None:
                pg.members.pop(conn.id, None)
                if not pg.members:
                    del self._producers[producer_group]
        if consumer_group:
            members = self._consumers.get(consumer_group)
            if members is not None and members.pop(client_id, None) is not None:
                log.info("consumer %s left group %s", client_id, consumer_group)
                if not members:
                    del self._consumers[consumer_group]
                self.notify_changed(consumer_group)

    def connection_closed(self, conn: Any) -> None:
        """Drop everything learned on ``conn`` (RemotingServer.on_disconnect)."""
        self._client_ids.pop(conn.id, None)
        for group in list(self._producers):
            pg = self._producers[group]
            if pg.members.pop(conn.id, None) is not None and not pg.members:
                del self._producers[group]
        for group in list(self._consumers):
            members = self._consumers[group]
            gone = [cid for cid, e in members.items() if e.conn is conn]
            for cid in gone:
                del members[cid]
            if gone:
                log.info("consumers %s left group %s (connection closed)", gone, group)
                if not members:
                    del self._consumers[group]
                self.notify_changed(group)

    def expire(self) -> None:
        """Drop clients silent for longer than ``expiry`` (called periodically)."""
        deadline = self._clock() - self.expiry
        for group in list(self._producers):
            pg = self._producers[group]
            for cid in [cid for cid, (c, seen) in pg.members.items() if seen < deadline or c.closed]:
                del pg.members[cid]
            if not pg.members:
                del self._producers[group]
        for group in list(self._consumers):
            members = self._consumers[group]
            gone = [cid for cid, e in members.items() if e.last_seen < deadline or e.conn.closed]
            for cid in gone:
                del members[cid]
            if gone:
                log.info("consumers %s expired from group %s", gone, group)
                if not members:
                    del self._consumers[group]
                self.notify_changed(group)

    def notify_changed(self, group: str) -> None:
        """One-way NOTIFY_CONSUMER_IDS_CHANGED to every live member of ``group``."""
        for entry in list(self._consumers.get(group, {}).values()):
            if entry.conn.closed:
                continue
            cmd = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                          {"consumerGroup": group}, oneway=True)
            try:
                entry.conn.send_oneway(cmd)
            except (OSError, RuntimeError) as exc:  # a dying connection must not stop the others
                log.debug("notify %s of group %s failed: %s", entry.client_id, group, exc)

    def stats(self) -> dict[str, int]:
        return {
            "producer_groups": len(self._producers),
            "consumer_groups": len(self._consumers),
            "consumers": sum(len(m) for m in self._consumers.values()),
        }
