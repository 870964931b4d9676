"""The Kafka admin APIs the tools call (docs/kafka.md, "Admin APIs"): DescribeCluster,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreatePartitions, DeleteTopics and
DescribeProducers.  (ListTransactions and DescribeTransactions are the coordinator's:
``txn_api.py``.)

A topic's Kafka configs are a small fixed set mapped onto what the broker really does, so that
a value a tool reads back is the one in force: ``retention.ms`` (the broker's
``file_reserved_time`` unless the topic sets a shorter one), ``retention.bytes`` (-1 only: all
topics share one commitlog), ``cleanup.policy`` (``delete`` only: there is no compaction) and
``max.message.bytes`` (the broker's ``max_message_size``, read-only).  Every other name is
refused with Kafka's INVALID_CONFIG, never silently accepted.

One file of over 450 lines: seven handlers that share the topic lookup, the per-resource
refusal (:class:`ConfigRefused`) and the config catalogue, and on a cluster the same handlers
spread each change over the groups holding the topic (the transport and signature are
``cluster_admin.py``); split, each part would import the others' internals."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.cluster_admin import UNREACHABLE, forward
from txbroker.service.kafka.cluster_view import ClusterView
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.coordinator import TransactionCoordinator
from txbroker.service.kafka.metadata import (
    MAX_PARTITIONS,
    NODE_ID,
    hidden_topic,
    topic_name_error,
)
from txbroker.service.repeating import Repeating
from txbroker.service.topics import (
    TopicConfig,
    TopicError,
    TopicManager,
    TopicStoreError,
)
from txbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

# Kafka's ConfigResource.Type, ConfigEntry.ConfigSource, ConfigDef.Type and AlterConfigOp.OpType.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_INT = 3
TYPE_LONG = 5
TYPE_LIST = 7
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

#: How often per-topic ``retention.ms`` is applied (the store's own pass runs every minute).
RETENTION_PASS_INTERVAL = 30.0


class ConfigRefused(Exception):
    """A config change refused: ``code`` and ``message`` are the resource's answer."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """One described config: its value, where it comes from and the broker setting behind it."""

    name: str
    value: str
    kind: int
    source: int
    read_only: bool
    doc: str
    synonym: tuple[str, str] | None = None

    def entry(self, synonyms: bool, documentation: bool) -> dict:
        syn = []
        if synonyms:
            if self.source == SOURCE_DYNAMIC_TOPIC:
                syn.append({"name": self.name, "value": self.value, "source": self.source})
            if self.synonym is not None:
                syn.append({"name": self.synonym[0], "value": self.synonym[1],
                            "source": SOURCE_STATIC_BROKER})
        # is_default: DescribeConfigs v0's form of config_source (v1+), which Kafka's client
        # reads back as DEFAULT_CONFIG when true
        return {"name": self.name, "value": self.value, "read_only": self.read_only,
                "is_default": self.source == SOURCE_DEFAULT,
                "config_source": self.source, "is_sensitive": False, "synonyms": syn,
                "config_type": self.kind, "documentation": self.doc if documentation else None}


def _parse_long(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigRefused(ErrorCode.INVALID_CONFIG, f"Invalid value {value} for configuration "
                            f"{name}: Not a number of type LONG") from None


class KafkaAdmin:
    """Handlers of the admin APIs, and the task that applies per-topic ``retention.ms``."""

    def __init__(self, config: BrokerConfig, topics: TopicManager, store: MessageStore,
                 coordinator: TransactionCoordinator, *, host: str, port: int,
                 view: ClusterView | None = None) -> None:
        self.config = config
        self.topics = topics
        self.store = store
        self.coordinator = coordinator
        self.host = host
        self.port = port
        #: On a cluster: the groups a topic's changes reach (cluster_admin.py).
        self.view = view
        self.node_id = config.kafka_node_id if config.kafka_node_id >= 0 else NODE_ID
        self._retention = Repeating(self._retention_pass, RETENTION_PASS_INTERVAL,
                                    what="kafka topic retention", errors=(OSError,))

    def handlers(self) -> dict[int, Handler]:
        return {ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
                ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
                ApiKey.ALTER_CONFIGS: self.alter_configs,
                ApiKey.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
                ApiKey.CREATE_PARTITIONS: self.create_partitions,
                ApiKey.DELETE_TOPICS: self.delete_topics,
                ApiKey.DESCRIBE_PRODUCERS: self.describe_producers}

    # --- per-topic retention -------------------------------------------------------------------
    async def start(self) -> None:
        """Apply the topics' retention at once (a queue's start is not kept across a restart,
        and this runs before the listener serves), then every RETENTION_PASS_INTERVAL."""
        self.apply_retention()
        self._retention.start()

    async def close(self) -> None:
        await self._retention.close()

    async def _retention_pass(self) -> None:
        self.apply_retention()

    def apply_retention(self) -> int:
        """Move the start of every queue of a topic with ``retention.ms`` past the records
        stored longer ago than that; returns how many queues moved.  The records stay in the
        commitlog, unreachable, until the broker's own retention deletes their segment."""
        cutoff_base = int(self.store.clock() * 1000)
        moved = 0
        for tc in self.topics.all():
            if tc.retention_ms <= 0 or hidden_topic(tc.name, self.config):
                continue
            for q in range(max(tc.read_queue_nums, tc.write_queue_nums)):
                before = self.store.min_offset(tc.name, q)
                cut = self.store.offset_by_time(tc.name, q, cutoff_base - tc.retention_ms)
                if self.store.expire_head(tc.name, q, cut) > before:
                    moved += 1
        return moved

    # --- the cluster ----------------------------------------------------------------------
    async def describe_cluster(self, ctx: KafkaRequestContext, body: dict) -> dict:
        if body.get("endpoint_type", 1) != 1:  # 2 asks for controllers: a broker has none
            return {"error_code": ErrorCode.UNSUPPORTED_ENDPOINT_TYPE, "error_message":
                    f"endpoint type {body.get('endpoint_type')}: this is a broker endpoint (1)",
                    "cluster_id": self.config.cluster_name}
        if self.view is not None:  # every group's master; the controller as Metadata names it
            nodes = self.view.nodes()
            return {"error_code": 0, "cluster_id": self.config.cluster_name, "endpoint_type": 1,
                    "controller_id": nodes[0].node_id if nodes else -1,
                    "brokers": [{"broker_id": n.node_id, "host": n.host, "port": n.port,
                                 "rack": None, "is_fenced": False} for n in nodes]}
        return {"error_code": 0, "cluster_id": self.config.cluster_name, "endpoint_type": 1,
                "controller_id": NODE_ID,
                "brokers": [{"broker_id": NODE_ID, "host": self.host, "port": self.port,
                             "rack": None, "is_fenced": False}]}

    # --- the same change in every group holding a topic (cluster_admin.py) ----------------------
    def _peer(self, ctx: KafkaRequestContext, body: dict) -> bool | str:
        """False: a client's request (acts on the cluster); True: a forwarded one (acts
        here only); a string: a forwarded one refused, and why."""
        if self.view is None:
            return False
        peer = ctx.cluster_peer
        if isinstance(peer, str):
            log.warning("%s from %s refused: %s", ApiKey(ctx.api_key).name, ctx.peer, peer)
        return peer

    def _holders(self, name: str, descending: bool = False) -> list[tuple[str, object]]:
        """(group, its master's Kafka node) of every group holding topic ``name``; refused when
        the view is not complete, no group holds it or one of them has no master now."""
        assert self.view is not None
        if not self.view.ready():
            raise ConfigRefused(UNREACHABLE,
                                f"the cluster view is not complete: {self.view.incomplete}")
        holders = self.view.holders(name)
        if not holders or hidden_topic(name, self.config):
            raise ConfigRefused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist")
        out = []
        for _, group, _ in sorted(holders, reverse=descending):
            leader = self.view.leader_of(group)
            if leader is None:
                raise ConfigRefused(UNREACHABLE, f"broker group {group} of topic {name!r} has "
                                    f"no master now")
            out.append((group, leader))
        return out

    def _is_here(self, group: str) -> bool:
        return group == self.config.broker_name and self.view is not None and self.view.leads()

    async def _forward_one(self, ctx: KafkaRequestContext, group: str, leader, body: dict,
                           results: str, name_key: str) -> None:
        """Forward ``body`` (one resource) to ``group``'s master; ConfigRefused on its error."""
        try:
            answer = await forward(group, leader, ctx.api_key, ctx.api_version, body,
                                   self.config,
                                   self.view.tls_context if self.view is not None else None)
            got = answer[results][0]
        except (OSError, TimeoutError, ValueError, KeyError, IndexError) as exc:
            raise ConfigRefused(UNREACHABLE, f"broker group {group} ({leader.host}:"
                                f"{leader.port}): {exc or type(exc).__name__}") from exc
        if got["error_code"] != ErrorCode.NONE:
            raise ConfigRefused(ErrorCode(got["error_code"]), f"broker group {group}: "
                                f"{got.get('error_message') or got[name_key]}")

    # --- configs ----------------------------------------------------------------------------
    def _broker_retention_ms(self) -> int:
        return int(self.config.file_reserved_time * 1000)

    def _topic_configs(self, tc: TopicConfig) -> list[ConfigValue]:
        broker_ms = str(self._broker_retention_ms())
        if tc.retention_ms >= 0:
            retention = ConfigValue("retention.ms", str(tc.retention_ms), TYPE_LONG,
                                    SOURCE_DYNAMIC_TOPIC, False,
                                    "Set on this topic; at most the broker's file_reserved_time.",
                                    ("log.retention.ms", broker_ms))
        else:
            retention = ConfigValue("retention.ms", broker_ms, TYPE_LONG, SOURCE_STATIC_BROKER,
                                    False, "The broker's file_reserved_time.",
                                    ("log.retention.ms", broker_ms))
        return [
            ConfigValue("cleanup.policy", "delete", TYPE_LIST, SOURCE_DEFAULT, False,
                        "Records are deleted by retention; there is no compaction."),
            retention,
            ConfigValue("retention.bytes", "-1", TYPE_LONG, SOURCE_DEFAULT, False,
                        "No size limit per topic: all topics share one commitlog."),
            ConfigValue("max.message.bytes", str(self.config.max_message_size), TYPE_INT,
                        SOURCE_STATIC_BROKER, True, "The broker's max_message_size.",
                        ("message.max.bytes", str(self.config.max_message_size))),
        ]

    def _broker_configs(self) -> list[ConfigValue]:
        c = self.config
        return [ConfigValue(name, value, kind, SOURCE_STATIC_BROKER, True, doc) for name, value,
                kind, doc in (
                    ("log.retention.ms", str(self._broker_retention_ms()), TYPE_LONG,
                     "file_reserved_time"),
                    ("message.max.bytes", str(c.max_message_size), TYPE_INT, "max_message_size"),
                    ("num.partitions", str(c.default_queue_nums), TYPE_INT, "default_queue_nums"),
                    ("auto.create.topics.enable", str(c.auto_create_topic).lower(), 1,
                     "auto_create_topic"))]

    def _topic(self, name: str) -> TopicConfig:
        why = topic_name_error(name)
        if why is not None:
            raise ConfigRefused(ErrorCode.INVALID_TOPIC_EXCEPTION, why)
        tc = self.topics.get(name)
        if tc is None or hidden_topic(name, self.config):
            raise ConfigRefused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist")
        return tc

    def _resource_configs(self, rtype: int, name: str) -> list[ConfigValue]:
        if rtype == RESOURCE_TOPIC:
            return self._topic_configs(self._topic(name))
        if rtype == RESOURCE_BROKER:
            if name not in ("", str(self.node_id)):
                raise ConfigRefused(ErrorCode.INVALID_REQUEST, f"unexpected broker id {name!r}: "
                                    f"this broker is {self.node_id} (or the empty default)")
            return self._broker_configs()
        raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                            f"config resource type {rtype} is not supported (topics 2, broker 4)")

    async def describe_configs(self, ctx: KafkaRequestContext, body: dict) -> dict:
        synonyms = bool(body.get("include_synonyms"))
        documentation = bool(body.get("include_documentation"))
        results = []
        for r in body.get("resources") or ():
            out = {"resource_type": r["resource_type"], "resource_name": r["resource_name"],
                   "error_code": 0, "error_message": None, "configs": []}
            if (self.view is not None and r["resource_type"] == RESOURCE_TOPIC
                    and self.topics.get(r["resource_name"]) is None
                    and self.view.holders(r["resource_name"])):
                results.append(await self._describe_elsewhere(ctx, body, r, out))
                continue
            try:
                values = self._resource_configs(r["resource_type"], r["resource_name"])
            except ConfigRefused as exc:
                out.update(error_code=exc.code, error_message=exc.message)
            else:
                keys = r.get("configuration_keys")
                out["configs"] = [v.entry(synonyms, documentation) for v in values
                                  if keys is None or v.name in keys]
            results.append(out)
        return {"results": results}

    async def _describe_elsewhere(self, ctx: KafkaRequestContext, body: dict, r: dict,
                                  out: dict) -> dict:
        """A topic this group does not hold is described by the first group that does (every
        holder has the same configs: the alter APIs change them all)."""
        try:
            group, leader = self._holders(r["resource_name"])[0]
            answer = await forward(group, leader, ctx.api_key, ctx.api_version,
                                   {**body, "resources": [r]}, self.config,
                                   self.view.tls_context if self.view is not None else None)
            return answer["results"][0]
        except ConfigRefused as exc:
            return {**out, "error_code": exc.code, "error_message": exc.message}
        except (OSError, TimeoutError, ValueError, KeyError, IndexError) as exc:
            return {**out, "error_code": UNREACHABLE,
                    "error_message": f"broker group {group}: {exc or type(exc).__name__}"}

    def _check(self, tc: TopicConfig, name: str, value: str) -> dict:
        """The TopicConfig fields a valid ``name=value`` sets; ConfigRefused otherwise."""
        if name == "retention.ms":
            ms = _parse_long(name, value)
            broker_ms = self._broker_retention_ms()
            if not 1 <= ms <= broker_ms:
                raise ConfigRefused(ErrorCode.INVALID_CONFIG, (
                    f"retention.ms={ms} on topic {tc.name!r}: must be 1..{broker_ms} (all topics "
                    f"share one commitlog kept for file_reserved_time, {broker_ms} ms)"))
            return {"retention_ms": ms}
        if name == "retention.bytes":
            if _parse_long(name, value) != -1:
                raise ConfigRefused(ErrorCode.INVALID_CONFIG, (
                    f"retention.bytes={value} on topic {tc.name!r}: only -1 (all topics share one "
                    f"commitlog; retention is by time)"))
            return {}
        if name == "cleanup.policy":
            policies = {p.strip() for p in value.split(",") if p.strip()}
            if policies != {"delete"}:
                raise ConfigRefused(ErrorCode.INVALID_CONFIG, (
                    f"cleanup.policy={value} on topic {tc.name!r}: only 'delete' (no compaction)"))
            return {}
        if name == "max.message.bytes":
            raise ConfigRefused(ErrorCode.INVALID_CONFIG, (
                f"max.message.bytes is read-only on this broker (its max_message_size, "
                f"{self.config.max_message_size})"))
        raise ConfigRefused(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {name}")

    async def _alter_across(self, ctx: KafkaRequestContext, body: dict,
                            changes_of: Callable[[TopicConfig, list[dict]], dict]) -> dict:
        """A client's alter on a cluster: each topic resource applied in every group holding
        the topic (checked first where it is held here, or by the first holder), the rest
        here."""
        peer = self._peer(ctx, body)
        if self.view is None or peer is not False:
            if isinstance(peer, str):
                return {"responses": [{"resource_type": r["resource_type"],
                                       "resource_name": r["resource_name"],
                                       "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                       "error_message": peer} for r in body.get("resources") or ()]}
            return await self._alter(body, changes_of)
        resources = list(body.get("resources") or ())
        keys = [(r["resource_type"], r["resource_name"]) for r in resources]
        out = []
        for i, r in enumerate(resources):
            one = {**body, "resources": [r]}
            if r["resource_type"] != RESOURCE_TOPIC or keys.count(keys[i]) > 1:
                out.append((await self._alter(body, changes_of))["responses"][i])
                continue
            answer = {"resource_type": r["resource_type"], "resource_name": r["resource_name"],
                      "error_code": 0, "error_message": None}
            try:
                for group, leader in self._holders(r["resource_name"]):
                    if self._is_here(group):
                        got = (await self._alter(one, changes_of))["responses"][0]
                        if got["error_code"] != ErrorCode.NONE:
                            raise ConfigRefused(ErrorCode(got["error_code"]), got["error_message"])
                    else:
                        await self._forward_one(ctx, group, leader, one, "responses",
                                                "resource_name")
            except ConfigRefused as exc:
                answer.update(error_code=exc.code, error_message=exc.message)
            out.append(answer)
        return {"responses": out}

    async def _alter(self, body: dict, changes_of: Callable[[TopicConfig, list[dict]], dict]
                     ) -> dict:
        """Shared by both alter APIs: ``changes_of`` turns one resource's entries into the
        TopicConfig fields to set (or raises ConfigRefused); applied unless validate_only."""
        resources = body.get("resources") or ()
        seen: dict[tuple[int, str], int] = {}
        for r in resources:
            key = (r["resource_type"], r["resource_name"])
            seen[key] = seen.get(key, 0) + 1
        out = []
        for r in resources:
            rtype, name = r["resource_type"], r["resource_name"]
            answer = {"resource_type": rtype, "resource_name": name, "error_code": 0,
                      "error_message": None}
            try:
                if seen[(rtype, name)] > 1:
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"resource {name!r} appears more than once")
                if rtype == RESOURCE_BROKER:
                    raise ConfigRefused(ErrorCode.INVALID_CONFIG, (
                        "broker configs are read-only here: they are the options "
                        "`txbroker serve` started with"))
                if rtype != RESOURCE_TOPIC:
                    self._resource_configs(rtype, name)  # raises the resource-type refusal
                tc = self._topic(name)
                entries = r.get("configs") or []
                names = [e["name"] for e in entries]
                if len(set(names)) != len(names):
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"duplicate config names for topic {name!r}")
                changes = changes_of(tc, entries)
                if not body.get("validate_only"):
                    new = replace(tc, **changes)
                    if new != tc:
                        await self.topics.create_or_update(new)
                        log.info("topic %r configs changed: %s", name, changes)
            except ConfigRefused as exc:
                answer.update(error_code=exc.code, error_message=exc.message)
            except TopicError as exc:
                code = (ErrorCode.KAFKA_STORAGE_ERROR if isinstance(exc, TopicStoreError)
                        else ErrorCode.INVALID_REQUEST)
                answer.update(error_code=code, error_message=exc.remark)
            out.append(answer)
        return {"responses": out}

    async def alter_configs(self, ctx: KafkaRequestContext, body: dict) -> dict:
        """AlterConfigs replaces the topic's whole set: a config not named returns to its
        default, as in Kafka."""
        def changes_of(tc: TopicConfig, entries: list[dict]) -> dict:
            changes: dict = {"retention_ms": -1}
            for e in entries:
                if e.get("value") is None:
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"Null value not supported for : {e['name']}")
                changes.update(self._check(tc, e["name"], e["value"]))
            return changes
        return await self._alter_across(ctx, body, changes_of)

    async def incremental_alter_configs(self, ctx: KafkaRequestContext, body: dict) -> dict:
        """SET and DELETE on every config; APPEND and SUBTRACT on the list one only."""
        def changes_of(tc: TopicConfig, entries: list[dict]) -> dict:
            changes: dict = {}
            for e in entries:
                name, op, value = e["name"], e["config_operation"], e.get("value")
                if op not in (OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT):
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"unknown config operation {op} for {name}")
                if op == OP_DELETE:
                    self._check(tc, name, self._default_of(name))  # a known, alterable name
                    if name == "retention.ms":
                        changes["retention_ms"] = -1
                    continue
                if value is None:
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"Null value not supported for : {name}")
                if op in (OP_APPEND, OP_SUBTRACT):
                    if name != "cleanup.policy":
                        self._check(tc, name, self._default_of(name))
                        raise ConfigRefused(ErrorCode.INVALID_CONFIG, (
                            f"Config value {'append' if op == OP_APPEND else 'subtract'} is not "
                            f"allowed for config key: {name}"))
                    current = {"delete"}
                    given = {p.strip() for p in value.split(",") if p.strip()}
                    value = ",".join(sorted(current | given if op == OP_APPEND else current - given))
                changes.update(self._check(tc, name, value))
            return changes
        return await self._alter_across(ctx, body, changes_of)

    def _default_of(self, name: str) -> str:
        """A valid value of an alterable config (to check a name before DELETE/APPEND)."""
        return {"retention.ms": str(self._broker_retention_ms()), "retention.bytes": "-1",
                "cleanup.policy": "delete"}.get(name, "")

    # --- topics -------------------------------------------------------------------------------
    async def create_partitions(self, ctx: KafkaRequestContext, body: dict) -> dict:
        topics = body.get("topics") or ()
        names = [t["name"] for t in topics]
        peer = self._peer(ctx, body)
        results = []
        for t in topics:
            name = t["name"]
            try:
                if isinstance(peer, str):
                    raise ConfigRefused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, peer)
                if names.count(name) > 1:
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"topic {name!r} appears more than once")
                if self.view is not None and peer is False:
                    await self._grow_across(ctx, t, bool(body.get("validate_only")))
                else:
                    await self._grow(t, bool(body.get("validate_only")), ctx.peer)
                results.append({"name": name, "error_code": 0, "error_message": None})
            except ConfigRefused as exc:
                results.append({"name": name, "error_code": exc.code, "error_message": exc.message})
        return {"results": results}

    async def _grow_across(self, ctx: KafkaRequestContext, t: dict, validate_only: bool) -> None:
        """The new partitions go to the group whose block of the topic is last (the highest
        node id holding it): numbered after every existing partition, so none moves."""
        assert self.view is not None
        name, count = t["name"], t["count"]
        holders = self._holders(name)
        current = sum(n for _, _, n in self.view.holders(name))
        if count <= current:
            raise ConfigRefused(ErrorCode.INVALID_PARTITIONS, (
                f"Topic already has {current} partitions." if count == current else
                f"Topic currently has {current} partitions, which is higher than the requested "
                f"{count}: partitions cannot be removed"))
        node_id, group, local = self.view.holders(name)[-1]
        assignments = t.get("assignments")
        if assignments is not None and (len(assignments) != count - current or any(
                a["broker_ids"] != [node_id] for a in assignments)):
            raise ConfigRefused(ErrorCode.INVALID_REPLICA_ASSIGNMENT, (
                f"one assignment [{node_id}] per new partition ({count - current}): new "
                f"partitions go to node {node_id} (broker group {group}), the topic's last"))
        part = {"name": name, "count": local + count - current, "assignments": None}
        if self._is_here(group):
            await self._grow(part, validate_only, ctx.peer)
        else:
            await self._forward_one(ctx, group, holders[-1][1],
                                    {"topics": [part], "timeout_ms": 5000,
                                     "validate_only": validate_only}, "results", "name")

    async def _grow(self, t: dict, validate_only: bool, peer: str) -> None:
        tc = self._topic(t["name"])
        count, current = t["count"], tc.read_queue_nums
        if count < current:
            raise ConfigRefused(ErrorCode.INVALID_PARTITIONS, (
                f"Topic currently has {current} partitions, which is higher than the requested "
                f"{count}: partitions cannot be removed"))
        if count == current:
            raise ConfigRefused(ErrorCode.INVALID_PARTITIONS,
                                f"Topic already has {current} partitions.")
        if count > MAX_PARTITIONS:
            raise ConfigRefused(ErrorCode.INVALID_PARTITIONS,
                                f"{count} partitions: at most {MAX_PARTITIONS}")
        assignments = t.get("assignments")
        if assignments is not None and (len(assignments) != count - current or any(
                a["broker_ids"] != [NODE_ID] for a in assignments)):
            raise ConfigRefused(ErrorCode.INVALID_REPLICA_ASSIGNMENT, (
                f"one assignment [{NODE_ID}] per new partition ({count - current}): this "
                f"broker is a single node"))
        if validate_only:
            return
        try:
            await self.topics.create_or_update(
                replace(tc, read_queue_nums=count, write_queue_nums=max(count, tc.write_queue_nums)))
        except TopicError as exc:
            raise ConfigRefused(ErrorCode.KAFKA_STORAGE_ERROR if isinstance(exc, TopicStoreError)
                                else ErrorCode.INVALID_REQUEST, exc.remark) from exc
        log.info("topic %r grown from %d to %d partitions by %s", tc.name, current, count, peer)

    async def delete_topics(self, ctx: KafkaRequestContext, body: dict) -> dict:
        """As the RocketMQ DELETE_TOPIC request: the topic's config, consume queues and
        consumer offsets go; its records stay in the commitlog, unreachable, until retention."""
        names = list(body.get("topic_names") or ())
        peer = self._peer(ctx, body)
        out = []
        for name in names:
            answer = {"name": name, "error_code": 0, "error_message": None}
            try:
                if isinstance(peer, str):
                    raise ConfigRefused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, peer)
                if names.count(name) > 1:
                    raise ConfigRefused(ErrorCode.INVALID_REQUEST,
                                        f"topic {name!r} appears more than once")
                if self.view is None or peer is True:
                    await self._delete_here(name, ctx.peer)
                else:
                    await self._delete_across(ctx, name)
            except ConfigRefused as exc:
                answer.update(error_code=exc.code, error_message=exc.message)
            out.append(answer)
        return {"responses": out}

    async def _delete_across(self, ctx: KafkaRequestContext, name: str) -> None:
        """From the highest node id down: the blocks left keep their numbers."""
        for group, leader in self._holders(name, descending=True):
            if self._is_here(group):
                await self._delete_here(name, ctx.peer)
            else:
                await self._forward_one(ctx, group, leader,
                                        {"topic_names": [name], "timeout_ms": 5000},
                                        "responses", "name")

    async def _delete_here(self, name: str, peer: str) -> None:
        self._topic(name)
        try:
            await self.topics.delete(name)
        except TopicError as exc:
            raise ConfigRefused(ErrorCode.KAFKA_STORAGE_ERROR, exc.remark) from exc
        queues = await self.store.delete_topic(name)
        log.warning("topic %s deleted through Kafka by %s (%d queues held messages)",
                    name, peer, queues)

    # --- producers ------------------------------------------------------------------------------
    async def describe_producers(self, ctx: KafkaRequestContext, body: dict) -> dict:
        """The idempotent and transactional producers with state on each partition.  An open
        transaction has no records in any partition before its commit (the half-message
        design), so ``current_txn_start_offset`` is always -1."""
        out = []
        for t in body.get("topics") or ():
            tc = self.topics.get(t["name"])
            if tc is not None and hidden_topic(tc.name, self.config):
                tc = None
            parts = []
            for p in t.get("partition_indexes") or ():
                if tc is None or not 0 <= p < tc.read_queue_nums:
                    parts.append({"partition_index": p,
                                  "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  "error_message": f"{t['name']}-{p} does not exist"})
                    continue
                active = []
                for pid, state in sorted(self.coordinator.producers.on_partition(tc.name, p),
                                         key=lambda e: e[0]):
                    last = state.batches[-1] if state.batches else None
                    active.append({"producer_id": pid, "producer_epoch": state.epoch,
                                   "last_sequence": last.last_seq if last else -1,
                                   "last_timestamp": last.timestamp if last else -1,
                                   "coordinator_epoch": -1, "current_txn_start_offset": -1})
                parts.append({"partition_index": p, "error_code": 0,
                              "active_producers": active})
            out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}
