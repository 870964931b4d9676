"""Partition requests on a cluster: global partition numbers in, this broker's queues out
(docs/kafka.md, "Kafka on a cluster").

The data handlers (Produce, Fetch, ListOffsets) work on this broker's queues, as on a single
broker.  On a cluster a client names a *global* partition (:mod:`cluster_view`); the wrapper
made here translates each partition this broker leads to its queue, answers every other one
NOT_LEADER_OR_FOLLOWER (another group's partition, or any partition while this broker is not
its group's master: the client refreshes its metadata and goes to the leader), or
UNKNOWN_TOPIC_OR_PARTITION past the topic's last partition, calls the handler with what is
left, and translates its answer back.  A topic no group has yet is passed through unchanged
while this broker leads (Produce's auto-create makes it here, with this group's numbering).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.cluster_view import ClusterView
from txbroker.service.kafka.context import Handler, KafkaRequestContext


@dataclass(frozen=True)
class Shape:
    """Where partitions sit in one API's request and answer bodies."""

    req_topics: str
    req_name: str
    req_parts: str
    req_index: str
    resp_topics: str
    resp_name: str
    resp_parts: str
    resp_index: str
    #: A refused partition's answer besides its index and error code.
    refused: tuple[tuple[str, Any], ...]


SHAPES = {
    ApiKey.PRODUCE: Shape("topic_data", "name", "partition_data", "index",
                          "responses", "name", "partition_responses", "index",
                          (("base_offset", -1), ("log_append_time_ms", -1),
                           ("log_start_offset", -1))),
    ApiKey.FETCH: Shape("topics", "topic", "partitions", "partition",
                        "responses", "topic", "partitions", "partition_index",
                        (("high_watermark", -1), ("last_stable_offset", -1),
                         ("log_start_offset", -1), ("preferred_read_replica", -1),
                         ("records", b""))),
    ApiKey.LIST_OFFSETS: Shape("topics", "name", "partitions", "partition_index",
                               "topics", "name", "partitions", "partition_index",
                               (("timestamp", -1), ("offset", -1))),
}


def refusal(view: ClusterView, topic: str, partition: int) -> tuple[ErrorCode, int]:
    """(NONE, queue id) when this broker serves ``topic``/``partition`` now, else the error."""
    slot = view.slot(topic, partition)
    if slot is None:
        if view.known(topic):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        # Nowhere yet: the leader may create it (auto-create) with its own numbering.
        return (ErrorCode.NONE, partition) if view.leads() else \
            (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)
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
                err, queue = refusal(view, name, p[shape.req_index])
                if err is not ErrorCode.NONE:
                    refused[(name, p[shape.req_index])] = err
                    continue
                back[(name, queue)] = p[shape.req_index]
                kept.append({**p, shape.req_index: queue})
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
            out.setdefault(name, []).append({shape.resp_index: partition, "error_code": err,
                                             **dict(shape.refused)})
        answer[shape.resp_topics] = [{shape.resp_name: name, shape.resp_parts: parts}
                                     for name, parts in out.items()]
        return answer

    return handle


def route_partitions(handlers: dict[int, Handler], view: ClusterView) -> dict[int, Handler]:
    """``handlers`` with the partition APIs translated for the cluster."""
    out = dict(handlers)
    for api in SHAPES:
        if api in out:
            out[api] = routed(api, out[api], view)
    return out
