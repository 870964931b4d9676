"""ApiVersions, Metadata, CreateTopics and FindCoordinator: the broker as Kafka sees it.

A single txbroker is one Kafka node (id :data:`NODE_ID`, or ``kafka_node_id``) at the advertised
host and the Kafka port; it leads every partition and coordinates every group and
transactional id.  On a cluster (a :class:`ClusterView` given) each broker group is a node and
a topic's partitions are its queues across groups (:mod:`cluster_view`).  A Kafka topic is a
txbroker topic with one partition per queue; the broker's own topics (system topics, retry and
dead-letter topics, the template topic) are not shown.  Topic names follow Kafka's rule
(``[a-zA-Z0-9._-]``, at most 249, not ``.``/``..``), and a new topic may not collide with an
existing one once ``.`` and ``_`` are taken as the same (Kafka's rule): docs/kafka.md, "Topic
names".
"""

from __future__ import annotations

import logging
import re

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ADVERTISED, ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.cluster_admin import UNREACHABLE, forward, spread
from txbroker.service.kafka.cluster_view import ClusterView
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.topics import (
    TopicConfig,
    TopicError,
    TopicManager,
    is_protected_topic,
    validate_topic_name,
)
from txbroker.store.record import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger("txbroker.kafka")

#: The node id of this broker in every Metadata and FindCoordinator answer.
NODE_ID = 0
#: Kafka's topic-name rule (clients check it too); ``.`` is refused by txbroker's own rule.
_KAFKA_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
#: ApiVersions v3: what a client software name and version must look like.
_SOFTWARE_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$")
MAX_PARTITIONS = 1024


def hidden_topic(name: str, config: BrokerConfig) -> bool:
    """The broker's own topics: not listed, not produced to, not fetched by Kafka clients."""
    return is_protected_topic(name, config) or name.startswith(
        (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))


def topic_name_error(name: str | None) -> str | None:
    """Why ``name`` cannot be a Kafka topic, in Kafka's words, or None when it can."""
    if not name or name in (".", "..") or not _KAFKA_TOPIC_RE.match(name):
        try:
            validate_topic_name(name)
        except TopicError as exc:
            return exc.remark
        # Only RocketMQ's separators % and | are left: names Kafka does not allow.
        return (f"Topic name is invalid: {name!r} contains one or more characters other than "
                f"ASCII alphanumerics, '.', '_' and '-'")
    return None


def collision_error(topics: TopicManager, name: str) -> str | None:
    """Kafka's message when a new topic ``name`` collides with an existing one: the same name
    once every ``.`` is read as ``_`` (Kafka's metric names cannot tell them apart, and
    Kafka refuses the second; txbroker keeps the rule so a topic moves between the two)."""
    if "." not in name and "_" not in name:
        return None
    unified = name.replace(".", "_")
    for tc in topics.all():
        if tc.name != name and tc.name.replace(".", "_") == unified:
            return f"Topic '{name}' collides with existing topic: {tc.name}"
    return None


async def lookup_topic(topics: TopicManager, config: BrokerConfig, name: str, *,
                       auto_create: bool, peer: str = "?") -> tuple[TopicConfig | None, ErrorCode]:
    """The topic a client names, created when allowed (``auto_create`` and the broker's
    ``auto_create_topic``); an error code when it does not exist or cannot.  A name refused
    for what it is (INVALID_TOPIC_EXCEPTION) when it was to be created is logged, naming
    ``peer``."""
    tc = topics.get(name)
    if tc is not None:
        if hidden_topic(name, config):
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return tc, ErrorCode.NONE
    why = topic_name_error(name)
    if why is None and auto_create and config.auto_create_topic:
        why = collision_error(topics, name)
    if why is not None:
        if auto_create:
            log.warning("Kafka topic %r from %s refused: %s", name[:300], peer, why)
        return None, ErrorCode.INVALID_TOPIC_EXCEPTION
    if hidden_topic(name, config) or not (auto_create and config.auto_create_topic):
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        return await topics.get_or_create(name, auto_create=True), ErrorCode.NONE
    except TopicError:
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class KafkaMetadata:
    """Handlers of the cluster-shape APIs.  ``host``/``port`` are what clients connect to."""

    def __init__(self, config: BrokerConfig, topics: TopicManager, *, host: str,
                 port: int, view: ClusterView | None = None) -> None:
        self.config = config
        self.topics = topics
        self.host = host
        self.port = port
        self.view = view
        self.node_id = config.kafka_node_id if config.kafka_node_id >= 0 else NODE_ID

    def handlers(self) -> dict[int, Handler]:
        return {ApiKey.API_VERSIONS: self.api_versions, ApiKey.METADATA: self.metadata,
                ApiKey.CREATE_TOPICS: self.create_topics,
                ApiKey.FIND_COORDINATOR: self.find_coordinator}

    async def api_versions(self, ctx: KafkaRequestContext, body: dict) -> dict:
        keys = [{"api_key": int(k), "min_version": lo, "max_version": hi}
                for k, (lo, hi) in sorted(ADVERTISED.items())]
        error = ErrorCode.NONE
        if ctx.api_version >= 3:
            name = body.get("client_software_name") or ""
            version = body.get("client_software_version") or ""
            if not (_SOFTWARE_RE.match(name) and _SOFTWARE_RE.match(version)):
                error = ErrorCode.INVALID_REQUEST
        return {"error_code": error, "api_keys": keys, "throttle_time_ms": 0}

    async def metadata(self, ctx: KafkaRequestContext, body: dict) -> dict:
        if self.view is not None:
            return await self._cluster_metadata(ctx, body, self.view)
        requested = body.get("topics")
        if requested is None or (ctx.api_version == 0 and not requested):
            names = [tc.name for tc in self.topics.all() if not hidden_topic(tc.name, self.config)]
        else:
            names = [t["name"] for t in requested]
        auto = body.get("allow_auto_topic_creation", True)  # absent below v4: True
        out = []
        for name in names:
            tc, error = await lookup_topic(self.topics, self.config, name, auto_create=auto,
                                           peer=ctx.peer)
            partitions = []
            if tc is not None:
                node = self.node_id
                partitions = [{"error_code": 0, "partition_index": q, "leader_id": node,
                               "leader_epoch": 0, "replica_nodes": [node],
                               "isr_nodes": [node], "offline_replicas": []}
                              for q in range(tc.read_queue_nums)]
            out.append({"error_code": error, "name": name, "is_internal": False,
                        "partitions": partitions})
        return {"throttle_time_ms": 0,
                "brokers": [{"node_id": self.node_id, "host": self.host, "port": self.port,
                             "rack": None}],
                "cluster_id": self.config.cluster_name, "controller_id": self.node_id,
                "topics": out}

    async def _cluster_metadata(self, ctx: KafkaRequestContext, body: dict,
                                view: ClusterView) -> dict:
        """Every group's master as a node; a topic's partitions across groups, each led by
        its group's node (none while the group has no master: LEADER_NOT_AVAILABLE).  Only a
        master creates a topic a client asks for, in its own group."""
        await view.wait_complete()
        requested = body.get("topics")
        if requested is None or (ctx.api_version == 0 and not requested):
            names = sorted(n for n in view.topic_names() if not hidden_topic(n, self.config))
        else:
            names = [t["name"] for t in requested]
        auto = body.get("allow_auto_topic_creation", True)  # absent below v4: True
        out = []
        for name in names:
            error = ErrorCode.NONE
            if hidden_topic(name, self.config):
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not view.ready():
                # A partial view would number the partitions as no other broker does.
                error = ErrorCode.LEADER_NOT_AVAILABLE
            elif not view.known(name):
                error = await self._unlisted(ctx, name, auto, view)
            partitions = []
            for s in view.slots(name) if error == ErrorCode.NONE else ():
                leader = s.leader.node_id if s.leader is not None else -1
                partitions.append({
                    "error_code": ErrorCode.NONE if s.leader is not None
                    else ErrorCode.LEADER_NOT_AVAILABLE,
                    "partition_index": s.partition, "leader_id": leader, "leader_epoch": 0,
                    "replica_nodes": [s.node_id], "isr_nodes": [s.node_id] if s.leader else [],
                    "offline_replicas": [] if s.leader else [s.node_id]})
            out.append({"error_code": error, "name": name, "is_internal": False,
                        "partitions": partitions})
        nodes = view.nodes()
        return {"throttle_time_ms": 0,
                "brokers": [{"node_id": n.node_id, "host": n.host, "port": n.port, "rack": None}
                            for n in nodes],
                "cluster_id": self.config.cluster_name,
                "controller_id": nodes[0].node_id if nodes else -1, "topics": out}

    async def _unlisted(self, ctx: KafkaRequestContext, name: str, auto: bool,
                        view: ClusterView) -> ErrorCode:
        """The answer for a topic the view does not list (yet).  As Kafka creates a topic a
        client names across the cluster, a master here creates it in every group, group by
        group like CreateTopics; a group that has it already (created by another broker whose
        creation this view has not seen) counts as done, so two brokers creating it at once
        end with one numbering.  Creating it in the asking broker's group only let a second
        broker, whose view was a round behind, create it in its group too, and the topic's
        partitions were numbered anew under the clients of the first (a consumer started
        then found no partitions and stopped).  The view's next rounds are then awaited,
        bounded, so the answer numbers the partitions; LEADER_NOT_AVAILABLE (retried by
        clients) when they still do not list it."""
        tc, error = await lookup_topic(self.topics, self.config, name, auto_create=False)
        if tc is None and not (auto and self.config.auto_create_topic and view.leads()):
            return error
        if tc is None:  # a topic this group has (made here, or by another master) is not grown
            spec = {"name": name, "num_partitions": -1, "replication_factor": -1,
                    "assignments": [], "configs": []}
            error, message = await self._create_across(ctx, spec, False, view, existing_ok=True)
            if error != ErrorCode.NONE:
                log.warning("Kafka topic %r from %s not auto-created: %s", name[:300], ctx.peer,
                            message)
                return error if error == ErrorCode.INVALID_TOPIC_EXCEPTION \
                    else ErrorCode.LEADER_NOT_AVAILABLE
        return ErrorCode.NONE if await view.wait_known(name) else ErrorCode.LEADER_NOT_AVAILABLE

    async def create_topics(self, ctx: KafkaRequestContext, body: dict) -> dict:
        """On a cluster a client's topic is created in every broker group with a master, its
        partitions spread over them (``cluster_admin.py``); a forwarded request creates this
        group's part only."""
        results = []
        validate_only = bool(body.get("validate_only"))
        peer = ctx.cluster_peer if self.view else False
        for t in body.get("topics") or []:
            name = t["name"]
            if isinstance(peer, str):
                log.warning("CreateTopics from %s refused: %s", ctx.peer, peer)
                error, message = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, peer
            elif self.view is None or peer is True:
                error, message = await self._create(t, validate_only)
            else:
                error, message = await self._create_across(ctx, t, validate_only, self.view)
            results.append({"name": name, "error_code": error, "error_message": message})
        return {"throttle_time_ms": 0, "topics": results}

    async def _create_across(self, ctx: KafkaRequestContext, t: dict, validate_only: bool,
                             view: ClusterView, *, existing_ok: bool = False
                             ) -> tuple[ErrorCode, str | None]:
        """Group by group from the lowest node id up: every view then sees a prefix of the
        groups holding the new topic, never a block out of place.  ``existing_ok``: a group
        that has the topic already is passed over (auto-creation, see :meth:`_unlisted`)."""
        name = t["name"]
        if not view.ready():
            return UNREACHABLE, f"the cluster view is not complete: {view.incomplete}"
        if view.known(name) and not existing_ok:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        error, message = await self._create(t, validate_only=True)
        if existing_ok and error == ErrorCode.TOPIC_ALREADY_EXISTS:
            error, message = ErrorCode.NONE, None
        if error != ErrorCode.NONE or validate_only:
            return error, message
        groups = [(g, leader) for _, g, leader in view.groups() if leader is not None]
        n = t.get("num_partitions", -1)
        n = self.config.default_queue_nums if n == -1 else n
        for (group, leader), share in zip(groups, spread(n, len(groups)), strict=True):
            if share == 0:
                continue
            part = {**t, "num_partitions": share, "replication_factor": -1, "assignments": []}
            if group == self.config.broker_name and view.leads():
                error, message = await self._create(part, validate_only=False)
            else:
                try:
                    # A CreateTopics request is forwarded in its own version; auto-creation
                    # (a Metadata request) in the highest one served.
                    version = (ctx.api_version if ctx.api_key == ApiKey.CREATE_TOPICS
                               else ADVERTISED[ApiKey.CREATE_TOPICS][1])
                    answer = await forward(group, leader, ApiKey.CREATE_TOPICS, version,
                                           {"topics": [part], "timeout_ms": 5000},
                                           self.config, view.tls_context)
                    got = answer["topics"][0]
                    error, message = ErrorCode(got["error_code"]), got.get("error_message")
                except (OSError, TimeoutError, ValueError, KeyError, IndexError) as exc:
                    error, message = UNREACHABLE, str(exc) or type(exc).__name__
            if existing_ok and error == ErrorCode.TOPIC_ALREADY_EXISTS:
                continue
            if error != ErrorCode.NONE:
                log.warning("topic %r from %s not created in broker group %s: %s", name,
                            ctx.peer, group, message)
                return error, f"broker group {group} ({leader.host}:{leader.port}): {message}"
        log.info("topic %r created by %s with %d partitions over %d broker groups", name,
                 ctx.peer, n, sum(1 for s in spread(n, len(groups)) if s))
        return ErrorCode.NONE, None

    async def _create(self, t: dict, validate_only: bool) -> tuple[ErrorCode, str | None]:
        name = t["name"]
        why = topic_name_error(name)
        if why is not None:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, why
        if self.topics.get(name) is not None:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        why = collision_error(self.topics, name)
        if why is not None:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, why
        if hidden_topic(name, self.config):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, f"{name!r} is reserved by the broker"
        if t.get("assignments"):
            return ErrorCode.INVALID_REQUEST, "manual partition assignments are not supported"
        rf = t.get("replication_factor", -1)
        if rf not in (-1, 1):
            return (ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {rf}: this broker is a single node (-1 or 1)")
        n = t.get("num_partitions", -1)
        if n == -1:
            n = self.config.default_queue_nums
        if not 1 <= n <= MAX_PARTITIONS:
            return ErrorCode.INVALID_PARTITIONS, f"{n} partitions: must be 1..{MAX_PARTITIONS}"
        if validate_only:
            return ErrorCode.NONE, None
        try:
            await self.topics.create_or_update(TopicConfig(name, n, n))
        except TopicError as exc:
            return ErrorCode.INVALID_REQUEST, exc.remark
        return ErrorCode.NONE, None

    async def find_coordinator(self, ctx: KafkaRequestContext, body: dict) -> dict:
        key_type = body.get("key_type", 0)
        if key_type not in (0, 1):
            return {"error_code": ErrorCode.INVALID_REQUEST, "error_message":
                    f"key type {key_type}", "node_id": -1, "host": "", "port": -1}
        if self.view is not None:  # the key's broker group, by Kafka's hash
            node, _ = self.view.coordinator(body.get("key") or "")
            if not self.view.ready():
                return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                        "error_message": f"the cluster view is not complete: {self.view.incomplete}",
                        "node_id": -1, "host": "", "port": -1}
            if node is None:
                return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                        "error_message": "the coordinator's broker group has no master now",
                        "node_id": -1, "host": "", "port": -1}
            return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                    "node_id": node.node_id, "host": node.host, "port": node.port}
        return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "node_id": self.node_id, "host": self.host, "port": self.port}
