"""Kafka's group APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups,
DescribeGroups, DeleteGroups (over the :class:`GroupCoordinator`) and OffsetCommit,
OffsetFetch (over the store's consumer-offset table, the one RocketMQ consumers use: a group's
position is the same through either protocol).

The offset table keeps a Kafka commit's metadata string (OffsetFetch returns it) and commit
time (offset expiry); a request's retention time is ignored, as Kafka does from v5 on
(docs/kafka.md, "Consumer groups")."""

from __future__ import annotations

from collections.abc import Callable, Collection

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.groups import GroupCoordinator
from txbroker.service.kafka.shapes import SHAPES
from txbroker.service.topics import TopicManager
from txbroker.store.message_store import MessageStore
from txbroker.store.offset_log import OffsetRow
from txbroker.store.results import PutStatus

#: Kafka's default ``offset.metadata.max.bytes``.
MAX_METADATA_BYTES = 4096


def group_handlers(groups: GroupCoordinator, store: MessageStore, topics: TopicManager,
                   unstable: Callable[[str], Collection[tuple[str, int]]]) -> dict[int, Handler]:
    """The handlers of the group APIs, keyed by API key.  ``unstable(group)``: the (topic,
    queue) pairs whose offsets an open or deciding transaction of the group will set (KIP-447:
    OffsetFetch v7 with ``require_stable`` answers them UNSTABLE_OFFSET_COMMIT, and the client
    asks again, rather than hand out an offset the commit is about to move)."""

    async def join_group(ctx: KafkaRequestContext, body: dict) -> dict:
        return await groups.join(
            body["group_id"], body["member_id"], client_id=ctx.client_id,
            api_version=ctx.api_version, session_timeout_ms=body["session_timeout_ms"],
            rebalance_timeout_ms=body["rebalance_timeout_ms"],
            protocol_type=body["protocol_type"],
            protocols=[(p["name"], p["metadata"]) for p in body["protocols"]],
            group_instance_id=body.get("group_instance_id"),
            client_host="/" + ctx.peer.rsplit(":", 1)[0])

    async def sync_group(ctx: KafkaRequestContext, body: dict) -> dict:
        return await groups.sync(
            body["group_id"], body["generation_id"], body["member_id"],
            [(a["member_id"], a["assignment"]) for a in body.get("assignments") or ()],
            body.get("group_instance_id"))

    async def heartbeat(ctx: KafkaRequestContext, body: dict) -> dict:
        return {"error_code": groups.heartbeat(body["group_id"], body["generation_id"],
                                               body["member_id"], body.get("group_instance_id"))}

    async def list_groups(ctx: KafkaRequestContext, body: dict) -> dict:
        if not groups.active:
            return {"error_code": ErrorCode.NOT_COORDINATOR, "groups": []}
        types = {t.lower() for t in body.get("types_filter") or ()}
        rows = groups.list_groups(body.get("states_filter"))
        return {"error_code": ErrorCode.NONE,
                "groups": rows if not types or "classic" in types else []}

    async def describe_groups(ctx: KafkaRequestContext, body: dict) -> dict:
        return {"groups": groups.describe(list(body.get("groups") or ()))}

    async def delete_groups(ctx: KafkaRequestContext, body: dict) -> dict:
        names = list(body.get("groups_names") or ())
        return {"results": [{"group_id": g, "error_code": e}
                            for g, e in zip(names, await groups.delete(names), strict=True)]}

    async def leave_group(ctx: KafkaRequestContext, body: dict) -> dict:
        return {"error_code": groups.leave(body["group_id"], body["member_id"])}

    def partition_exists(topic: str, partition: int) -> bool:
        tc = topics.get(topic)
        return tc is not None and 0 <= partition < tc.read_queue_nums

    async def offset_commit(ctx: KafkaRequestContext, body: dict) -> dict:
        group_id = body["group_id"]
        generation = body["generation_id_or_member_epoch"]
        if not group_id:
            verdict = ErrorCode.INVALID_GROUP_ID
        else:
            verdict = groups.validate_commit(group_id, generation, body["member_id"])
        now_ms = int(groups.clock() * 1000)
        out = []
        rows: list[OffsetRow] = []
        taken: list[dict] = []
        for t in body.get("topics") or ():
            parts = []
            for p in t.get("partitions") or ():
                err = verdict
                if err == ErrorCode.NONE:
                    err = _check_one(partition_exists, group_id, t["name"], p, now_ms, rows)
                part = {"partition_index": p["partition_index"], "error_code": err}
                if err == ErrorCode.NONE:
                    taken.append(part)
                parts.append(part)
            out.append({"name": t["name"], "partitions": parts})
        if rows:
            # One offset record for the request (docs/kafka.md, "Consumer groups"), answered
            # once stored as a RocketMQ send is (the table is shared): a stored record whose
            # replication was cut short (no slave left in the in-sync set) still counts.
            result = await store.commit_offsets(rows)
            if not result.ok:
                err = (ErrorCode.NOT_COORDINATOR if result.status is PutStatus.SERVICE_NOT_AVAILABLE
                       else ErrorCode.COORDINATOR_NOT_AVAILABLE)
                for part in taken:
                    part["error_code"] = err
        return {"topics": out}

    async def offset_fetch(ctx: KafkaRequestContext, body: dict) -> dict:
        group_id = body["group_id"]
        wanted = body.get("topics")
        if not group_id or not groups.active:
            err = ErrorCode.INVALID_GROUP_ID if not group_id else ErrorCode.NOT_COORDINATOR
            return SHAPES[ApiKey.OFFSET_FETCH].refuse_all(body, err, error_code=err)
        if wanted is None:      # v2+: every offset the group has
            table = store.offsets.groups().get(group_id, {})
            wanted = [{"name": name, "partition_indexes": sorted(queues)}
                      for name, queues in sorted(table.items())]
        pending = unstable(group_id) if body.get("require_stable") else ()
        out = []
        for t in wanted:
            parts = []
            for i in t.get("partition_indexes") or ():
                if (t["name"], i) in pending:
                    parts.append(unstable_partition(i))
                    continue
                offset = store.offsets.get(group_id, t["name"], i)
                commit = store.offsets.kafka_commit(group_id, t["name"], i)
                parts.append({"partition_index": i,
                              "committed_offset": -1 if offset is None else offset,
                              "metadata": commit[0] if commit is not None else "",
                              "error_code": ErrorCode.NONE})
            out.append({"name": t["name"], "partitions": parts})
        return {"error_code": ErrorCode.NONE, "topics": out}

    return {ApiKey.JOIN_GROUP: join_group, ApiKey.SYNC_GROUP: sync_group,
            ApiKey.HEARTBEAT: heartbeat, ApiKey.LEAVE_GROUP: leave_group,
            ApiKey.OFFSET_COMMIT: offset_commit, ApiKey.OFFSET_FETCH: offset_fetch,
            ApiKey.LIST_GROUPS: list_groups, ApiKey.DESCRIBE_GROUPS: describe_groups,
            ApiKey.DELETE_GROUPS: delete_groups}


def complete_old_versions(handlers: dict[int, Handler]) -> dict[int, Handler]:
    """``handlers`` with the fields JoinGroup v0 and OffsetCommit v0 lack filled in with what
    Kafka reads them as, so the handlers and the cluster routing in front of them see the
    newer versions' bodies (docs/kafka.md, "Against Kafka 3.9 and Kafka 4"): JoinGroup v0 has
    no rebalance timeout, the session timeout stands in; OffsetCommit v0 has neither
    generation nor member, a "simple" commit (generation -1, empty member id), accepted only
    while the group has no members.  Their answers need nothing: the codec leaves out what
    an old version lacks (the throttle time of JoinGroup v0-1, SyncGroup v0, OffsetCommit v0-2)."""
    out = dict(handlers)
    join, commit = handlers[ApiKey.JOIN_GROUP], handlers[ApiKey.OFFSET_COMMIT]

    async def join_group(ctx: KafkaRequestContext, body: dict) -> dict | None:
        if ctx.api_version == 0:
            body = {**body, "rebalance_timeout_ms": body["session_timeout_ms"]}
        return await join(ctx, body)

    async def offset_commit(ctx: KafkaRequestContext, body: dict) -> dict | None:
        if ctx.api_version == 0:
            body = {**body, "generation_id_or_member_epoch": -1, "member_id": ""}
        return await commit(ctx, body)

    out[ApiKey.JOIN_GROUP], out[ApiKey.OFFSET_COMMIT] = join_group, offset_commit
    return out


def _check_one(partition_exists, group_id: str, topic: str, p: dict, now_ms: int,
               rows: list[OffsetRow]) -> ErrorCode:
    """Check one partition's committed offset and add its row to ``rows``; the error code."""
    if not partition_exists(topic, p["partition_index"]):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    metadata = p.get("committed_metadata")
    if metadata is not None and len(metadata.encode()) > MAX_METADATA_BYTES:
        return ErrorCode.OFFSET_METADATA_TOO_LARGE
    if p["committed_offset"] < 0:
        return ErrorCode.INVALID_REQUEST      # the offset table holds positions >= 0 only
    # v1's commit timestamp, when given, is the commit's time (expiry counts from it), as in
    # Kafka 3.9; -1 and the other versions: the time the broker took the commit.
    stamp = p.get("commit_timestamp", -1)
    rows.append((group_id, topic, p["partition_index"], p["committed_offset"],
                 (metadata or "", now_ms if stamp == -1 else stamp)))
    return ErrorCode.NONE


def unstable_partition(partition: int) -> dict:
    """An OffsetFetch partition whose offset a transaction is about to set."""
    return {"partition_index": partition, "committed_offset": -1, "metadata": "",
            "error_code": ErrorCode.UNSTABLE_OFFSET_COMMIT}
