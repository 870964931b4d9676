"""Admin requests: topics (create, delete, list), message lookup by offset, runtime info and
the status document.

BROKER_STATUS (9004, txbroker's private range) is what ``txbroker status`` prints: topics with
per-queue min/max offsets, consumer groups with their committed offsets and members, pending
half messages, key metrics and, in a cluster, the broker's role, master epoch and its
group's in-sync replicas, as one JSON document.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.bodies import KVTable
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    ViewMessageByIdRequestHeader,
)
from txbroker.service.clients import ClientRegistry
from txbroker.service.topics import TopicConfig, TopicManager, validate_topic_name

log = logging.getLogger(__name__)


class AdminProcessor:
    def __init__(self, config: BrokerConfig, store, topics: TopicManager, registry: ClientRegistry,
                 tx, metrics, *, runtime: Callable[[], dict[str, str]] | None = None,
                 replication: Callable[[], dict | None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.registry = registry
        self.tx = tx
        self.metrics = metrics
        self.runtime = runtime or (dict)
        #: The broker's role in its group (None: a single broker, always its own master).
        self.replication = replication or (lambda: None)
        self.clock = clock
        self.started = clock()

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.all_consumer_offsets,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message,
            RequestCode.BROKER_STATUS: self.status,
        }

    async def create_topic(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        h = CreateTopicRequestHeader.from_ext(cmd.ext_fields)
        read = h.read_queue_nums or self.config.default_queue_nums
        write = h.write_queue_nums or read
        # RocketMQ's request has no retention field: a topic's Kafka ``retention.ms`` stays.
        old = self.topics.get(h.topic)
        tc = await self.topics.create_or_update(
            TopicConfig(h.topic, read, write, h.perm, h.topic_sys_flag, h.order,
                        retention_ms=old.retention_ms if old is not None else -1))
        return cmd.response(ResponseCode.SUCCESS, ext={"topic": tc.name})

    async def delete_topic(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        """The topic's config, consume queues and consumer offsets go; system topics never
        (they hold the transaction state: deleting one would lose or forge decisions)."""
        topic = validate_topic_name(DeleteTopicRequestHeader.from_ext(cmd.ext_fields).topic)
        config = self.topics.get(topic)
        existed = await self.topics.delete(topic)
        stored = await self.store.delete_topic(topic)  # only queues that ever held a message
        if not existed and not stored:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] does not exist")
        queues = max(config.read_queue_nums, config.write_queue_nums, stored) if config else stored
        log.warning("topic %s deleted by %s: %d queues, %d of them holding messages", topic,
                    getattr(conn, "peer", "?"), queues, stored)
        return cmd.response(ResponseCode.SUCCESS)

    async def all_topic_config(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        doc = {"topicConfigTable": {t.name: t.to_wire() for t in self.topics.all()},
               "dataVersion": {"counter": len(self.topics.names()),
                               "timestamp": int(self.started * 1000)}}
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))

    async def all_consumer_offsets(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ's ConsumerOffsetSerializeWrapper: ``{"offsetTable": {"topic@group":
        {queueId: offset}}}``, plus ``kafkaCommitTable`` (``{"topic@group": {queueId:
        [metadata, commit ms]}}``), for tools (a txbroker slave gets offsets from the
        replicated offset log, docs/cluster.md "Consumer offsets in the log")."""
        table: dict[str, dict[str, int]] = {}
        for group, topics in self.store.offsets.groups().items():
            for topic, queues in topics.items():
                table[f"{topic}@{group}"] = {str(q): o for q, o in queues.items()}
        # Kafka commits' metadata and commit time, in a field of its own: RocketMQ's tools
        # read offsetTable only.
        kafka: dict[str, dict[str, list]] = {}
        for (group, topic, q), (metadata, commit_ms) in self.store.offsets.kafka_commits().items():
            kafka.setdefault(f"{topic}@{group}", {})[str(q)] = [metadata, commit_ms]
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(
            {"offsetTable": table, "kafkaCommitTable": kafka}))

    async def view_message(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        offset = ViewMessageByIdRequestHeader.from_ext(cmd.ext_fields).offset
        raw = self.store.read_raw(offset)
        if raw is None:
            raise Refusal(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return cmd.response(ResponseCode.SUCCESS, body=raw)

    def runtime_table(self) -> dict[str, str]:
        table = {str(k): str(v) for k, v in self.metrics.snapshot().items()}
        for k, v in self.store.stats().items():
            table[f"store_{k}"] = str(v)
        for k, v in self.registry.stats().items():
            table[k] = str(v)
        table.update(self.runtime())
        table.update({
            "brokerVersionDesc": "V4_9_8", "brokerVersion": "409",
            "commitLogMaxOffset": str(self.store.max_physical_offset),
            "commitLogMinOffset": str(self.store.min_physical_offset),
            "pendingHalfMessages": str(self.tx.pending_count()),
            "bootTimestamp": str(int(self.started * 1000)),
            "flushMode": self.config.flush_mode,
        })
        return table

    async def runtime_info(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=KVTable(self.runtime_table()).encode())

    def status_doc(self) -> dict:
        queues = self.store.queues()
        topics = {}
        for tc in self.topics.all():
            qids = sorted(set(range(tc.read_queue_nums)) | set(queues.get(tc.name, [])))
            topics[tc.name] = {
                "readQueueNums": tc.read_queue_nums, "writeQueueNums": tc.write_queue_nums,
                "perm": tc.perm,
                "queues": [{"queueId": q, "minOffset": self.store.min_offset(tc.name, q),
                            "maxOffset": self.store.max_offset(tc.name, q)} for q in qids],
            }
        groups: dict[str, dict] = {}
        for group, members in self.registry.consumer_groups().items():
            groups[group] = {"consumers": sorted(members), "offsets": {}}
        for group, by_topic in self.store.offsets.groups().items():
            entry = groups.setdefault(group, {"consumers": [], "offsets": {}})
            for topic, by_queue in by_topic.items():
                entry["offsets"][topic] = {str(q): off for q, off in sorted(by_queue.items())}
        return {
            "broker": {"name": self.config.broker_name, "cluster": self.config.cluster_name,
                       "flushMode": self.config.flush_mode,
                       "uptimeSeconds": round(self.clock() - self.started, 3)},
            "topics": topics,
            "consumerGroups": groups,
            "producerGroups": self.registry.producer_groups(),
            "pendingHalfMessages": self.tx.pending_count(),
            "metrics": self.runtime_table(),
            "replication": self.replication(),
        }

    async def status(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(self.status_doc()))
