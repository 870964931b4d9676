"""The Kafka transaction APIs: request bodies in, coordinator calls, response bodies out
(docs/kafka.md, "Transaction coordinator").  InitProducerId v0-4, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn and TxnOffsetCommit v0-2, DescribeTransactions v0, ListTransactions
v0-1.  A state record that cannot be stored answers COORDINATOR_NOT_AVAILABLE (retriable);
before recovery is finished every request gets COORDINATOR_LOAD_IN_PROGRESS."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.coordinator import (
    WHOLE_REQUEST,
    CoordinatorUnavailable,
    TransactionCoordinator,
)

#: Keys the cluster routing (routing.py) adds to AddPartitionsToTxn / AddOffsetsToTxn bodies:
#: the other broker groups' partitions, the broker group coordinating the consumer group.
REMOTE, PARTICIPANT = "txbroker_remote", "txbroker_participant"

STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
          "PrepareEpochFence", "Dead")


def _grouped(results: dict[tuple[str, int], ErrorCode], topic_key: str, part_key: str,
             parts_key: str, err_key: str) -> list[dict]:
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), err in results.items():
        by_topic.setdefault(topic, []).append({part_key: partition, err_key: int(err)})
    return [{topic_key: t, parts_key: ps} for t, ps in by_topic.items()]


def txn_handlers(coordinator: TransactionCoordinator) -> dict[int, Handler]:
    c = coordinator

    def guarded(fn: Callable[[KafkaRequestContext, dict], Awaitable[dict]],
                fail: Callable[[dict, ErrorCode], dict]) -> Handler:
        async def handler(ctx: KafkaRequestContext, body: dict) -> dict:
            if not c.ready:
                return fail(body, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            try:
                return await fn(ctx, body)
            except CoordinatorUnavailable:
                return fail(body, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return handler

    def top_error(body: dict, err: ErrorCode) -> dict:
        return {"error_code": int(err)}

    async def init_producer_id(ctx: KafkaRequestContext, body: dict) -> dict:
        err, pid, epoch = await c.init_producer_id(
            body.get("transactional_id"), body["transaction_timeout_ms"],
            body.get("producer_id", -1), body.get("producer_epoch", -1), ctx.api_version)
        return {"error_code": int(err), "producer_id": pid, "producer_epoch": epoch}

    def add_partitions_fail(body: dict, err: ErrorCode) -> dict:
        return {"results": [{"name": t["name"], "results": [
            {"partition_index": p, "partition_error_code": int(err)} for p in t["partitions"]]}
            for t in body["topics"]]}

    async def add_partitions(ctx: KafkaRequestContext, body: dict) -> dict:
        parts = [(t["name"], p) for t in body["topics"] for p in t["partitions"]]
        results = await c.add_partitions(body["transactional_id"], body["producer_id"],
                                         body["producer_epoch"], parts, ctx.api_version,
                                         body.get(REMOTE))
        whole = results.pop(WHOLE_REQUEST, None)
        answer: dict = {"results": _grouped(results, "name", "partition_index", "results",
                                            "partition_error_code")}
        if body.get(REMOTE):  # how the other groups' partitions fare (routing.py answers them)
            errs = set(results.values())
            answer[REMOTE] = int(whole if whole is not None else
                                 ErrorCode.OPERATION_NOT_ATTEMPTED
                                 if ErrorCode.UNKNOWN_TOPIC_OR_PARTITION in errs else errs.pop())
        return answer

    async def add_offsets(ctx: KafkaRequestContext, body: dict) -> dict:
        err = await c.add_offsets(body["transactional_id"], body["producer_id"],
                                  body["producer_epoch"], body["group_id"], ctx.api_version,
                                  body.get(PARTICIPANT))
        return {"error_code": int(err)}

    async def end_txn(ctx: KafkaRequestContext, body: dict) -> dict:
        err = await c.end_txn(body["transactional_id"], body["producer_id"], body["producer_epoch"],
                              bool(body["committed"]), ctx.api_version)
        return {"error_code": int(err)}

    def offset_commit_fail(body: dict, err: ErrorCode) -> dict:
        if err is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            err = ErrorCode.COORDINATOR_NOT_AVAILABLE  # Kafka's mapping for v0-1; kept for all
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": int(err)}
            for p in t["partitions"]]} for t in body["topics"]]}

    async def txn_offset_commit(ctx: KafkaRequestContext, body: dict) -> dict:
        offsets = [(t["name"], p["partition_index"], p["committed_offset"])
                   for t in body["topics"] for p in t["partitions"]]
        results = await c.txn_offset_commit(body["transactional_id"], body["group_id"],
                                            body["producer_id"], body["producer_epoch"], offsets,
                                            ctx.api_version)
        return {"topics": _grouped(results, "name", "partition_index", "partitions", "error_code")}

    async def describe(ctx: KafkaRequestContext, body: dict) -> dict:
        states = []
        for tid in body["transactional_ids"]:
            v = c.describe(tid)
            if v is None:
                states.append({"error_code": int(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND),
                               "transactional_id": tid, "transaction_state": "",
                               "transaction_timeout_ms": 0, "transaction_start_time_ms": -1,
                               "producer_id": -1, "producer_epoch": -1})
                continue
            topics: dict[str, list[int]] = {}
            for topic, partition in v.partitions:
                topics.setdefault(topic, []).append(partition)
            states.append({"error_code": 0, "transactional_id": tid,
                           "transaction_state": v.state, "transaction_timeout_ms": v.timeout_ms,
                           "transaction_start_time_ms": v.started_ms if v.started_ms is not None else -1,
                           "producer_id": v.producer_id, "producer_epoch": v.producer_epoch,
                           "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
        return {"transaction_states": states}

    async def list_transactions(ctx: KafkaRequestContext, body: dict) -> dict:
        wanted = list(body.get("state_filters") or [])
        unknown = [s for s in wanted if s not in STATES]
        pids = set(body.get("producer_id_filters") or [])
        duration = body.get("duration_filter", -1)
        now = c.now_ms()
        out = []
        for v in c.transactions(wanted):
            if pids and v.producer_id not in pids:
                continue
            if duration >= 0 and (v.started_ms is None or now - v.started_ms < duration):
                continue
            out.append({"transactional_id": v.transactional_id, "producer_id": v.producer_id,
                        "transaction_state": v.state})
        return {"error_code": 0, "unknown_state_filters": unknown, "transaction_states": out}

    return {
        ApiKey.INIT_PRODUCER_ID: guarded(init_producer_id, top_error),
        ApiKey.ADD_PARTITIONS_TO_TXN: guarded(add_partitions, add_partitions_fail),
        ApiKey.ADD_OFFSETS_TO_TXN: guarded(add_offsets, top_error),
        ApiKey.END_TXN: guarded(end_txn, top_error),
        ApiKey.TXN_OFFSET_COMMIT: guarded(txn_offset_commit, offset_commit_fail),
        ApiKey.DESCRIBE_TRANSACTIONS: guarded(describe, lambda body, err: {"transaction_states": [
            {"error_code": int(err), "transactional_id": t} for t in body["transactional_ids"]]}),
        ApiKey.LIST_TRANSACTIONS: guarded(list_transactions, top_error),
    }
