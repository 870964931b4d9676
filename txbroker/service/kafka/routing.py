"""Partition requests on a cluster: global partition numbers in, this broker's queues out
(docs/kafka.md, "Kafka on a cluster").

The data handlers (Produce, Fetch, ListOffsets) work on this broker's queues, as on a single
broker.  On a cluster a client names a *global* partition (:mod:`cluster_view`); the wrapper
made here translates each partition this broker leads to its queue, answers every other one
NOT_LEADER_OR_FOLLOWER (another group's partition, or any partition while this broker is not
its group's master: the client refreshes its metadata and goes to the leader), or
UNKNOWN_TOPIC_OR_PARTITION past the topic's last partition (or for a topic the view does not
hold yet), calls the handler with what is left, and translates its answer back.  While the
view is not complete every partition is NOT_LEADER_OR_FOLLOWER and every coordinator request
NOT_COORDINATOR: a numbering from a partial view could put a batch in another queue than the
one its client meant.
"""

from __future__ import annotations

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.cluster_view import ClusterView
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.group_api import unstable_partition
from txbroker.service.kafka.shapes import SHAPES
from txbroker.service.kafka.staging import TxnStaging
from txbroker.service.kafka.txn_api import PARTICIPANT, REMOTE

#: The partition APIs this module translates (their shapes in ``shapes.py``).
ROUTED = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS)


def refusal(view: ClusterView, topic: str, partition: int) -> tuple[ErrorCode, int]:
    """(NONE, queue id) when this broker serves ``topic``/``partition`` now, else the error."""
    if not view.ready():
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
    slot = view.slot(topic, partition)
    if slot is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if not slot.local:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
    return ErrorCode.NONE, slot.queue_id


def routed(api: ApiKey, handler: Handler, view: ClusterView) -> Handler:
    shape = SHAPES[api]

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict | None:
        refused: dict[tuple[str, int], ErrorCode] = {}
        back: dict[tuple[str, int], int] = {}
        topics = []
        for t in body.get(shape.req_topics) or ():
            name = t[shape.req_name]
            kept = []
            for p in t.get(shape.req_parts) or ():
                index = shape.index_of(p)
                err, queue = refusal(view, name, index)
                if err is not ErrorCode.NONE:
                    refused[(name, index)] = err
                    continue
                back[(name, queue)] = index
                kept.append(shape.renumbered(p, queue))
            if kept:
                topics.append({**t, shape.req_parts: kept})
        answer: dict | None
        if topics or not refused:
            answer = await handler(ctx, {**body, shape.req_topics: topics})
        else:
            answer = None if api == ApiKey.PRODUCE and body.get("acks", 1) == 0 else \
                {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, shape.resp_topics: []}
        if answer is None:
            return None
        out: dict[str, list[dict]] = {}
        for t in answer.get(shape.resp_topics) or ():
            name = t[shape.resp_name]
            for p in t.get(shape.resp_parts) or ():
                local = p[shape.resp_index]
                out.setdefault(name, []).append(
                    {**p, shape.resp_index: back.get((name, local), local)})
        for (name, partition), err in refused.items():
            out.setdefault(name, []).append(shape.refused_partition(partition, err))
        answer[shape.resp_topics] = [{shape.resp_name: name, shape.resp_parts: parts}
                                     for name, parts in out.items()]
        return answer

    return handle


def route_partitions(handlers: dict[int, Handler], view: ClusterView) -> dict[int, Handler]:
    """``handlers`` with the partition APIs translated for the cluster."""
    out = dict(handlers)
    for api in ROUTED:
        if api in out:
            out[api] = routed(api, out[api], view)
    return out


# --- coordinator APIs -------------------------------------------------------------------------
#: API -> (the key's body field, "group" or "txn" keyed).  InitProducerId without a
#: transactional id (an idempotent producer) is served by any master.
COORDINATED = {
    ApiKey.JOIN_GROUP: "group_id", ApiKey.SYNC_GROUP: "group_id",
    ApiKey.HEARTBEAT: "group_id", ApiKey.LEAVE_GROUP: "group_id",
    ApiKey.OFFSET_COMMIT: "group_id", ApiKey.OFFSET_FETCH: "group_id",
    ApiKey.TXN_OFFSET_COMMIT: "group_id",
    ApiKey.INIT_PRODUCER_ID: "transactional_id", ApiKey.ADD_PARTITIONS_TO_TXN: "transactional_id",
    ApiKey.ADD_OFFSETS_TO_TXN: "transactional_id", ApiKey.END_TXN: "transactional_id",
}


def not_coordinator(api: ApiKey, body: dict, err: ErrorCode) -> dict:
    """The answer of a coordinator API refused as a whole with ``err``."""
    if api in (ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT, ApiKey.ADD_PARTITIONS_TO_TXN):
        return SHAPES[api].refuse_all(body, err)
    if api == ApiKey.OFFSET_FETCH:
        return SHAPES[api].refuse_all(body, err, error_code=err)
    if api == ApiKey.INIT_PRODUCER_ID:
        return {"error_code": err, "producer_id": -1, "producer_epoch": -1}
    return {"error_code": err}


def coordinated(api: ApiKey, handler: Handler, view: ClusterView) -> Handler:
    field = COORDINATED[api]

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict | None:
        key = body.get(field)
        if not view.ready():  # the key's coordinator is not known for sure yet
            here = False
        elif api == ApiKey.INIT_PRODUCER_ID and key is None:
            here = view.leads()
        else:
            here = view.coordinator(key or "")[1]
        if not here:
            return not_coordinator(api, body, ErrorCode.NOT_COORDINATOR)
        return await handler(ctx, body)

    return handle


def local_partitions(view: ClusterView, topic: str, partitions: list[int]
                     ) -> tuple[dict[int, int], dict[int, str], dict[int, ErrorCode]]:
    """(global -> local queue, global -> another broker group leading it, global ->
    refusal) for partitions a transaction names.  Another group's partition joins the
    transaction as that group's (it stages the batches and gets a marker, markers.py)."""
    ok: dict[int, int] = {}
    elsewhere: dict[int, str] = {}
    refused: dict[int, ErrorCode] = {}
    for p in partitions:
        err, queue = refusal(view, topic, p)
        slot = view.slot(topic, p)
        if err is ErrorCode.NOT_LEADER_OR_FOLLOWER and slot is not None:
            elsewhere[p] = slot.broker_name
        elif err is ErrorCode.NONE:
            ok[p] = queue
        else:
            refused[p] = err
    return ok, elsewhere, refused


def add_partitions(handler: Handler, view: ClusterView) -> Handler:
    """AddPartitionsToTxn: this group's partitions in local queue numbers, other groups'
    handed to the coordinator as participants (global numbers)."""
    shape = SHAPES[ApiKey.ADD_PARTITIONS_TO_TXN]

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict | None:
        refused: dict[tuple[str, int], ErrorCode] = {}
        back: dict[tuple[str, int], int] = {}
        remote: dict[str, list[tuple[str, int]]] = {}
        topics = []
        for t in body.get("topics") or ():
            ok, elsewhere, bad = local_partitions(view, t["name"], t["partitions"])
            refused.update({(t["name"], p): e for p, e in bad.items()})
            back.update({(t["name"], q): p for p, q in ok.items()})
            for p, group in elsewhere.items():
                remote.setdefault(group, []).append((t["name"], p))
            if ok:
                topics.append({**t, "partitions": list(ok.values())})
        if refused:  # all or nothing, as the coordinator itself answers
            return {"results": [{"name": t["name"], "results": [
                shape.refused_partition(p, refused.get((t["name"], p),
                                                       ErrorCode.OPERATION_NOT_ATTEMPTED))
                for p in shape.indexes(t)]} for t in body.get("topics") or ()]}
        answer = await handler(ctx, {**body, "topics": topics, REMOTE: remote})
        assert answer is not None
        out: dict[str, list[dict]] = {}
        for t in answer.get("results") or ():
            for r in t.get("results") or ():
                r["partition_index"] = back.get((t["name"], r["partition_index"]),
                                                r["partition_index"])
                out.setdefault(t["name"], []).append(r)
        if remote:
            err = answer.pop(REMOTE, None)
            if err is None:  # refused as a whole before the coordinator looked at it
                err = next((r["partition_error_code"] for rs in out.values() for r in rs),
                           ErrorCode.COORDINATOR_NOT_AVAILABLE)
            for parts in remote.values():
                for name, p in parts:
                    out.setdefault(name, []).append(shape.refused_partition(p, err))
        answer["results"] = [{"name": n, "results": rs} for n, rs in out.items()]
        return answer

    return handle


def add_offsets(handler: Handler, view: ClusterView) -> Handler:
    """AddOffsetsToTxn: the broker group coordinating the consumer group stages the offsets
    (TxnOffsetCommit goes there) and joins the transaction as a participant."""

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict | None:
        return await handler(ctx, {**body, PARTICIPANT: view.coordinator_group(body["group_id"])})

    return handle


def txn_offsets(view: ClusterView, staging: TxnStaging) -> Handler:
    """TxnOffsetCommit at the consumer group's coordinator: staged here (staging.py) with
    the broker group owning each queue, set when the transaction's commit marker arrives."""

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict | None:
        group = body["group_id"]
        answer: dict[tuple[str, int], ErrorCode] = {}
        staged = []
        for t in body.get("topics") or ():
            for p in t.get("partitions") or ():
                index, offset = p["partition_index"], p["committed_offset"]
                slot = view.slot(t["name"], index)
                if slot is None or offset < 0:
                    answer[(t["name"], index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                answer[(t["name"], index)] = ErrorCode.NONE
                staged.append((group, t["name"], slot.broker_name, slot.queue_id, offset))
        if staged:
            err = await staging.stage_offsets(body["producer_id"], body["producer_epoch"], staged)
            for key, e in answer.items():
                if e is ErrorCode.NONE:
                    answer[key] = err
        by_topic: dict[str, list[dict]] = {}
        for (name, index), err in answer.items():
            by_topic.setdefault(name, []).append({"partition_index": index, "error_code": err})
        return {"topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]}

    return handle


def offsets(api: ApiKey, handler: Handler, view: ClusterView, validate,
            staging: TxnStaging) -> Handler:
    """OffsetCommit / OffsetFetch over global partitions: this group's queues locally,
    another group's queues in that group (its master's offset table, over RocketMQ's offset
    requests: the table both protocols share).  A fetch with ``require_stable`` answers
    UNSTABLE_OFFSET_COMMIT for every partition whose offset a transaction staged here and has
    not set yet, whichever group owns its queue."""

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict | None:
        group = body["group_id"]
        fetch = api == ApiKey.OFFSET_FETCH
        shape = SHAPES[api]
        remote: list[tuple[str, int, dict]] = []
        back: dict[tuple[str, int], int] = {}
        topics = []
        if fetch and body.get("topics") is None:
            return await handler(ctx, body)  # every offset of this group's own table
        for t in body.get("topics") or ():
            name = t["name"]
            kept = []
            for item in t.get(shape.req_parts) or ():
                p = shape.index_of(item)
                slot = view.slot(name, p)
                if slot is None or slot.local:
                    queue = slot.queue_id if slot is not None else p
                    back[(name, queue)] = p
                    kept.append(shape.renumbered(item, queue))
                else:
                    remote.append((name, p, {} if fetch else item))
            if kept:
                topics.append({**t, shape.req_parts: kept})
        answer = await handler(ctx, {**body, "topics": topics})
        assert answer is not None
        out: dict[str, list[dict]] = {}
        for t in answer.get("topics") or ():
            for p in t.get("partitions") or ():
                p["partition_index"] = back.get((t["name"], p["partition_index"]),
                                                p["partition_index"])
                out.setdefault(t["name"], []).append(p)
        verdict = ErrorCode.NONE if fetch else validate(group, body["generation_id_or_member_epoch"],
                                                        body["member_id"])
        staged = (staging.unstable_offsets(group) if fetch and body.get("require_stable")
                  else set())
        for name, p, item in remote:
            slot = view.slot(name, p)
            assert slot is not None
            if fetch and (name, slot.broker_name, slot.queue_id) in staged:
                out.setdefault(name, []).append(unstable_partition(p))  # no need to ask its group
                continue
            if fetch:
                got = await view.fetch_offset(slot.broker_name, group, name, slot.queue_id)
                err = ErrorCode.COORDINATOR_NOT_AVAILABLE if got is None else ErrorCode.NONE
                out.setdefault(name, []).append({"partition_index": p, "metadata": "",
                                                 "committed_offset": -1 if got is None else got,
                                                 "error_code": err})
                continue
            err = verdict
            if err is ErrorCode.NONE and item["committed_offset"] < 0:
                err = ErrorCode.INVALID_REQUEST
            if err is ErrorCode.NONE and not await view.commit_offset(
                    slot.broker_name, group, name, slot.queue_id, item["committed_offset"]):
                err = ErrorCode.COORDINATOR_NOT_AVAILABLE
            out.setdefault(name, []).append(shape.refused_partition(p, err))
        if staged:  # this group's own queues, answered by the handler above
            for name, parts in out.items():
                for i, p in enumerate(parts):
                    slot = view.slot(name, p["partition_index"])
                    if slot is not None and (name, slot.broker_name, slot.queue_id) in staged:
                        parts[i] = unstable_partition(p["partition_index"])
        answer["topics"] = [{"name": n, "partitions": ps} for n, ps in out.items()]
        return answer

    return handle


def route_coordinators(handlers: dict[int, Handler], view: ClusterView,
                       validate_commit, staging: TxnStaging) -> dict[int, Handler]:
    """``handlers`` with the group and transaction APIs answered NOT_COORDINATOR away from
    the key's coordinator, and their partitions translated (``validate_commit`` is the group
    coordinator's check of a commit's generation and member).  A transaction may span broker
    groups: TxnOffsetCommit is staged (``staging``) at the consumer group's coordinator and
    AddOffsetsToTxn names that group as a participant."""
    out = dict(handlers)
    if ApiKey.ADD_PARTITIONS_TO_TXN in out:
        out[ApiKey.ADD_PARTITIONS_TO_TXN] = add_partitions(out[ApiKey.ADD_PARTITIONS_TO_TXN], view)
    if ApiKey.ADD_OFFSETS_TO_TXN in out:
        out[ApiKey.ADD_OFFSETS_TO_TXN] = add_offsets(out[ApiKey.ADD_OFFSETS_TO_TXN], view)
    out[ApiKey.TXN_OFFSET_COMMIT] = txn_offsets(view, staging)
    for api in (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH):
        if api in out:
            out[api] = offsets(api, out[api], view, validate_commit, staging)
    for api in COORDINATED:
        if api in out:
            out[api] = coordinated(api, out[api], view)
    return out
