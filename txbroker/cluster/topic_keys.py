"""A broker group's topic configs in etcd, so a topic exists on every replica the moment its
creation is acknowledged (docs/cluster.md, "Consensus on etcd").

Without this, a slave copies its master's topic table every ``metadata_sync_interval``: a
topic created less than that before a failover did not exist on the promoted master, and its
replicated messages were stranded in a queue nobody routed to.  In etcd mode:

* the master writes a change to ``<group>/topics/<name>`` (its config as JSON; deleted with
  the topic) *before* its own file and memory, in a transaction that checks it still holds
  ``leader`` at the create revision it won (the fencing token): a replaced master cannot
  change the group's topics, and a change etcd did not take is refused, not acknowledged;
* every replica reads the group's topics each renewal interval and takes them as its table
  (built-in topics are every broker's own and never leave it);
* a broker elected master reads them before it takes writes, so it holds every topic any
  earlier master acknowledged.

The first master of a group in etcd mode imports its local table once (a cluster moving from
a controller, or topics made before etcd mode): the import and ``topics-imported`` go in one
transaction, so a later master never imports again (it would bring back deleted topics).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING

import orjson

from txbroker.cluster.etcd import KV, EtcdError, compare_create, delete, put
from txbroker.remoting.codes import ResponseCode
from txbroker.service.topics import NotGroupMaster, TopicConfig, TopicStoreError

if TYPE_CHECKING:
    from txbroker.cluster.leadership import EtcdLeadership
    from txbroker.service.topics import TopicManager

log = logging.getLogger(__name__)


class GroupTopics:
    """The group's topic table in etcd, for one broker's :class:`TopicManager`."""

    def __init__(self, leadership: EtcdLeadership, topics: TopicManager) -> None:
        self.leadership = leadership
        self.topics = topics
        self.prefix = leadership.keys.base + b"topics/"
        self.imported = leadership.keys.base + b"topics-imported"
        #: The highest mod revision applied, to skip a table that did not change.
        self._seen: tuple[int, int] = (-1, -1)

    async def publish(self, name: str, tc: TopicConfig | None) -> None:
        """Make etcd hold ``tc`` for ``name`` (None: deleted), as the group's master; the
        change is refused (SERVICE_NOT_AVAILABLE, nothing changed) when this broker does not
        hold ``leader`` now or etcd does not answer."""
        lead = self.leadership.leader_revision()
        if lead is None:
            raise NotGroupMaster(ResponseCode.SERVICE_NOT_AVAILABLE,
                                 f"topic[{name}] not changed: this broker is not its group's "
                                 f"master in etcd")
        key = self.prefix + name.encode()
        op = delete(key) if tc is None else put(key, orjson.dumps(asdict(tc)))
        try:
            result = await self.leadership.etcd.txn([compare_create(self.leadership.keys.leader,
                                                                    lead)], [op])
        except EtcdError as exc:
            raise TopicStoreError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  f"topic[{name}] not changed: etcd did not take it: {exc}") from exc
        if not result.succeeded:
            raise NotGroupMaster(ResponseCode.SERVICE_NOT_AVAILABLE,
                                 f"topic[{name}] not changed: this broker no longer holds its "
                                 f"group's leadership in etcd")

    async def pull(self) -> None:
        """Take the group's table from etcd (a linearizable read) when it changed."""
        kvs, _revision = await self.leadership.etcd.range(self.prefix)
        seen = (max((kv.mod_revision for kv in kvs), default=0), len(kvs))
        if seen == self._seen:
            return
        configs = [c for c in (_config(kv) for kv in kvs) if c is not None]
        if await self.topics.replace_replicated(configs):
            log.info("topic table of group %s taken from etcd: %d topics",
                     self.leadership.config.broker_name, len(configs))
        self._seen = seen

    async def take_over(self, lead: int) -> None:
        """A new master, before it takes writes: import the local table if the group never
        did (one transaction, fenced by ``lead``), then read the group's table."""
        marker = await self.leadership.etcd.get(self.imported)
        if marker is None:
            ops = [put(self.prefix + tc.name.encode(), orjson.dumps(asdict(tc)))
                   for tc in self.topics.own()]
            ops.append(put(self.imported, b"{}"))
            result = await self.leadership.etcd.txn(
                [compare_create(self.leadership.keys.leader, lead),
                 compare_create(self.imported, 0)], ops)
            if result.succeeded and len(ops) > 1:
                log.warning("etcd: imported %d topics of group %s from this broker's table",
                            len(ops) - 1, self.leadership.config.broker_name)
        self._seen = (-1, -1)
        await self.pull()


def _config(kv: KV) -> TopicConfig | None:
    try:
        doc = orjson.loads(kv.value)
        return TopicConfig(**doc)
    except (orjson.JSONDecodeError, TypeError) as exc:
        log.error("etcd key %r is not a topic config, passed over: %s", kv.key, exc)
        return None
