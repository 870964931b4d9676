"""Produce, Fetch and ListOffsets: Kafka's data path on txbroker's store.

A partition is a queue and a partition offset the queue offset (docs/kafka.md, "Produce and
fetch").  Produce decodes each partition's one RecordBatch, lets the transaction coordinator
check it (idempotence, fencing, KIP-890) and stores its records with one ``put_batch``;
transactional batches go to the coordinator, which appends them only at commit.  So every
record a partition holds is committed: Fetch builds one plain RecordBatch per partition from
the stored messages, read_committed and read_uncommitted alike, with the last stable offset
equal to the high watermark.  Long polls wait on the store's append callbacks, never on a
timer loop.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import RecordsError, encode_batch, read_batches
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.mapping import (
    message_to_record,
    record_to_message,
    unreadable_record,
)
from txbroker.service.kafka.metadata import lookup_topic
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.processors.pull import PullHoldService
from txbroker.service.topics import TopicManager
from txbroker.store.message_store import MessageStore
from txbroker.store.record import RecordError, decode_record, decode_records
from txbroker.store.results import PutResult, PutStatus

if TYPE_CHECKING:
    from txbroker.remoting.kafka.records import RecordBatch
    from txbroker.service.kafka.coordinator import TransactionCoordinator
    from txbroker.service.kafka.staging import TxnStaging
    from txbroker.store.record import Message

log = logging.getLogger("txbroker.kafka")

T = TypeVar("T")

#: Records read per partition per fetch at most (the byte limits usually stop it first).
MAX_FETCH_RECORDS = 10000
#: Kafka's compression codec id of zstd, allowed in Produce from v7 only.
ZSTD = 4

#: A refused put -> the Kafka error of the partition's answer.
_PUT_ERRORS = {
    PutStatus.SERVICE_NOT_AVAILABLE: ErrorCode.KAFKA_STORAGE_ERROR,
    PutStatus.MESSAGE_ILLEGAL: ErrorCode.MESSAGE_TOO_LARGE,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ErrorCode.INVALID_RECORD,
    PutStatus.FLUSH_DISK_TIMEOUT: ErrorCode.REQUEST_TIMED_OUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    PutStatus.SLAVE_NOT_AVAILABLE: ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    PutStatus.OUTCOME_UNKNOWN: ErrorCode.REQUEST_TIMED_OUT,  # may or may not be written: retriable
}


def _peer_host(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


class KafkaData:
    """Handlers of Produce, Fetch and ListOffsets."""

    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicManager,
                 metrics: BrokerMetrics, coordinator: TransactionCoordinator,
                 holds: PullHoldService) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.metrics = metrics
        self.coordinator = coordinator
        #: The broker's one set of long polls woken by appends (RocketMQ pulls wait there
        #: too): its shutdown answers held fetches at once, a SYNC_MASTER's recheck wakes them.
        self.holds = holds
        #: Intents: the put of an idempotent batch under way, by (producer id, topic,
        #: partition).  A batch of the same producer for the same partition waits for it.
        self._puts: dict[tuple[int, str, int], asyncio.Task[list[PutResult]]] = {}
        #: On a cluster, where transactional batches of transactions coordinated by another
        #: broker group are staged (staging.py); None on a single broker.
        self.staging: TxnStaging | None = None

    def handlers(self) -> dict[int, Handler]:
        return {ApiKey.PRODUCE: self.produce, ApiKey.FETCH: self.fetch,
                ApiKey.LIST_OFFSETS: self.list_offsets}

    async def _wait(self, keys: list[tuple[str, int]], timeout: float) -> None:
        """Until an append to one of ``keys``, ``timeout`` seconds, or the broker stopping."""
        if self.holds.closing or timeout <= 0:
            return
        held = [(topic, qid, self.holds.wait(topic, qid)) for topic, qid in keys]
        try:
            await asyncio.wait([f for _, _, f in held], timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for topic, qid, fut in held:
                self.holds.discard(topic, qid, fut)

    # --- Produce ----------------------------------------------------------------------------
    async def produce(self, ctx: KafkaRequestContext, body: dict) -> dict | None:
        acks = body.get("acks", 1)
        txn_id = body.get("transactional_id")
        born_host = _peer_host(ctx.peer)
        responses = []
        for td in body.get("topic_data") or ():
            name = td["name"]
            parts = []
            for pd in td.get("partition_data") or ():
                index = pd["index"]
                if acks not in (0, 1, -1):
                    error, base = ErrorCode.INVALID_REQUIRED_ACKS, -1
                else:
                    error, base = await self._produce_partition(
                        ctx, txn_id, name, index, pd.get("records"), born_host, acks)
                parts.append({"index": index, "error_code": error, "base_offset": base,
                              "log_append_time_ms": -1,
                              "log_start_offset": self.store.min_offset(name, index)
                              if error == ErrorCode.NONE else -1})
            responses.append({"name": name, "partition_responses": parts})
        if acks == 0:
            return None
        return {"responses": responses, "throttle_time_ms": 0}

    async def _produce_partition(self, ctx: KafkaRequestContext, txn_id: str | None, topic: str,
                                 partition: int, data: bytes | None, born_host: tuple[str, int],
                                 acks: int) -> tuple[ErrorCode, int]:
        """(error, base offset) of one partition's batch."""
        tc, error = await lookup_topic(self.topics, self.config, topic, auto_create=True,
                                       peer=ctx.peer)
        if tc is None:
            return error, -1
        if not 0 <= partition < tc.write_queue_nums:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        if not data:
            return ErrorCode.INVALID_RECORD, -1
        if len(data) > self.config.max_message_size:
            return ErrorCode.MESSAGE_TOO_LARGE, -1
        try:
            batches = read_batches(data)
            if len(batches) != 1:
                return ErrorCode.INVALID_RECORD, -1
            batch = batches[0]
            if batch.magic != 2 or batch.is_control:
                return ErrorCode.INVALID_RECORD, -1
            if batch.compression == ZSTD and ctx.api_version < 7:
                return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, -1
            records = None if batch.is_transactional else batch.records(
                self.config.max_message_size)
        except RecordsError as exc:
            log.info("Produce to %s-%d from %s refused: %s", topic, partition, ctx.peer, exc)
            return exc.error_code, -1
        if records is not None and not records:
            return ErrorCode.INVALID_RECORD, -1
        coordinator = self.coordinator
        if records is None and self.staging is not None and self.staging.takes(txn_id):
            return await self.staging.stage_batch(topic, partition, batch)
        key = (batch.producer_id, topic, partition)
        if records is not None and batch.producer_id >= 0:
            # A retry must not be checked while the first try of the same batch is still
            # being stored (a client that dropped its connection retries on a new one):
            # wait for the outcome of this producer's put on this partition, then check.
            while (earlier := self._puts.get(key)) is not None:
                await asyncio.wait([earlier])
        error, dup = coordinator.check_batch(txn_id, topic, partition, batch)
        if error != ErrorCode.NONE:
            return error, -1
        if dup is not None:
            self.metrics.kafka_duplicate_batches.inc()
            return await self._confirm_duplicate(dup, acks)
        if records is None:
            return await _detached(coordinator.append_transactional(
                txn_id, topic, partition, batch)), -1
        msgs = [record_to_message(topic, partition, r, born_host=born_host) for r in records]
        if batch.producer_id < 0:
            results = await self.store.put_batch(msgs)
            if all(r.ok for r in results):
                self.metrics.kafka_records_produced.inc(len(msgs))
            return self._answer(ctx, topic, partition, results, acks)
        coordinator.tag_batch(msgs[0], batch)  # replayed into producer state at recovery
        # Intent, effect, bookkeeping: the put and its recording run as one task of their own,
        # registered before this step yields, so neither a cancelled handler nor a retry
        # overtaking it can separate the two.
        put = asyncio.get_running_loop().create_task(self._put_recorded(key, batch, msgs))
        self._puts[key] = put
        return self._answer(ctx, topic, partition, await asyncio.shield(put), acks)

    async def _put_recorded(self, key: tuple[int, str, int], batch: RecordBatch,
                            msgs: list[Message]) -> list[PutResult]:
        """Store an idempotent batch, then remember it for deduplication if it is in the log."""
        try:
            results = await self.store.put_batch(msgs)
            if all(r.in_log for r in results):
                # In the log, even if the flush or a slave is late, or the write gate went up
                # while it waited: a retry is answered as its duplicate, through the same
                # flush, replica and gate checks (_confirm_duplicate), never stored again.
                self.metrics.kafka_records_produced.inc(len(msgs))
                self.coordinator.record_batch(key[1], key[2], batch, results[0].queue_offset)
            return results
        finally:
            if self._puts.get(key) is asyncio.current_task():
                del self._puts[key]

    async def _confirm_duplicate(self, offset: int, acks: int) -> tuple[ErrorCode, int]:
        """A retried batch already in the log: answered as its put would be answered now
        (acks=-1 after the flush and the replicas, both covering the log's end, and the write
        gate), with the original offset."""
        if acks == 0:
            return ErrorCode.NONE, offset
        store = self.store
        result = await store.confirm_stored(
            PutResult(PutStatus.OK, physical_offset=store.max_physical_offset))
        if result.status is PutStatus.OK or (result.ok and acks != -1):
            return ErrorCode.NONE, offset
        return self._put_error(result.status), -1

    def _put_error(self, status: PutStatus) -> ErrorCode:
        """The Kafka error of a refused put.  A fenced store (its lease lapsed, a demotion, a
        stop) answers NOT_LEADER_OR_FOLLOWER, as a Kafka broker that lost leadership does:
        clients then refresh their metadata and find the group's master, where
        KAFKA_STORAGE_ERROR made aiokafka retry this broker until the fence lifted."""
        if status is PutStatus.SERVICE_NOT_AVAILABLE and self.store.fenced is not None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return _PUT_ERRORS[status]

    def _answer(self, ctx: KafkaRequestContext, topic: str, partition: int,
                results: list[PutResult], acks: int) -> tuple[ErrorCode, int]:
        """A put's (error, base offset): a flush or replica time-out is an error under acks=-1
        only (the records are stored)."""
        bad = next((r for r in results if r.status is not PutStatus.OK), None)
        if bad is None:
            return ErrorCode.NONE, results[0].queue_offset
        if not bad.ok:
            log.warning("Produce to %s-%d from %s refused by the store: %s %s", topic,
                        partition, ctx.peer, bad.status.name, bad.reason)
        elif acks != -1:
            return ErrorCode.NONE, results[0].queue_offset
        return self._put_error(bad.status), -1

    # --- Fetch --------------------------------------------------------------------------------
    async def fetch(self, ctx: KafkaRequestContext, body: dict) -> dict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, body.get("max_wait_ms", 0)) / 1000
        min_bytes = body.get("min_bytes", 1)
        committed = body.get("isolation_level", 0) == 1
        wanted = [(t["topic"], p) for t in body.get("topics") or () for p in t["partitions"]]
        # The client's limits, within the broker's (kafka_fetch_max_bytes): the answer is built
        # in memory, so what a client may ask for is bounded here, not by the log's size.
        max_bytes = min(body.get("max_bytes", 0x7FFFFFFF), self.config.kafka_fetch_max_bytes)
        while True:
            responses, size, errors = await self._read(wanted, max_bytes, committed)
            remaining = deadline - loop.time()
            if size >= min_bytes or errors or remaining <= 0 or self.holds.closing:
                break
            await self._wait([(t, p["partition"]) for t, p in wanted], remaining)
        return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}

    async def _read(self, wanted: list[tuple[str, dict]], max_bytes: int,
                    committed: bool) -> tuple[list[dict], int, bool]:
        """The answer to every partition, its record bytes in all, and whether any partition
        had an error (which answers at once, as Kafka does)."""
        by_topic: dict[str, list[dict]] = {}
        total = 0
        errors = False
        store = self.store
        for topic, p in wanted:
            qid = p["partition"]
            answer = {"partition_index": qid, "error_code": 0, "high_watermark": -1,
                      "last_stable_offset": -1, "log_start_offset": -1,
                      "aborted_transactions": [] if committed else None,
                      "preferred_read_replica": -1, "records": b""}
            by_topic.setdefault(topic, []).append(answer)
            tc, error = await lookup_topic(self.topics, self.config, topic, auto_create=False)
            if tc is None or not 0 <= qid < tc.read_queue_nums:
                answer["error_code"] = error if tc is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                errors = True
                continue
            lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
            answer.update(high_watermark=hi, last_stable_offset=hi, log_start_offset=lo)
            offset = p["fetch_offset"]
            if not lo <= offset <= hi:
                answer["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
                errors = True
                continue
            if offset == hi:
                continue
            # KIP-74: the first partition with data gets at least one record, whatever the limits.
            budget = min(p.get("partition_max_bytes", max_bytes), max_bytes - total)
            if budget <= 0 and total > 0:
                continue
            data, count = self._batch(topic, qid, offset, max(budget, 1))
            if data:
                answer["records"] = data
                total += len(data)
                self.metrics.kafka_records_fetched.inc(count)
        responses = [{"topic": t, "partitions": parts} for t, parts in by_topic.items()]
        return responses, total, errors

    def _batch(self, topic: str, qid: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """One uncompressed RecordBatch of the stored records from ``offset`` (at least one
        when any), and how many records it holds.  A stored message that cannot be converted
        still takes its offset, as a record carrying the reason (mapping.py,
        CONVERSION_ERROR_HEADER): a consumer moves past it rather than fetching it forever."""
        got = self.store.get(topic, qid, offset, MAX_FETCH_RECORDS, max_bytes)
        limit = self.config.max_message_size
        records = []
        expected = offset
        for raw in got.raw:
            try:
                m = decode_record(raw)
            except (RecordError, ValueError, IndexError, struct.error) as exc:
                log.error("fetch %s-%d at %d: unreadable record: %s", topic, qid, expected, exc)
                records.append(unreadable_record(expected - offset, f"unreadable record: {exc}"))
                expected += 1
                continue
            if m.queue_offset != expected:  # offsets of one batch must follow each other
                break
            records.append(message_to_record(m, expected - offset, limit))
            expected += 1
        if not records:
            return b"", 0
        return encode_batch(offset, records), len(records)

    # --- ListOffsets --------------------------------------------------------------------------
    async def list_offsets(self, ctx: KafkaRequestContext, body: dict) -> dict:
        out = []
        for t in body.get("topics") or ():
            name = t["name"]
            tc, error = await lookup_topic(self.topics, self.config, name, auto_create=False)
            parts = []
            for p in t.get("partitions") or ():
                qid = p["partition_index"]
                answer = {"partition_index": qid, "error_code": 0, "timestamp": -1, "offset": -1}
                parts.append(answer)
                if tc is None or not 0 <= qid < tc.read_queue_nums:
                    answer["error_code"] = error if tc is None else \
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                answer["offset"], answer["timestamp"] = self._offset_for(name, qid, p["timestamp"])
            out.append({"name": name, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": out}

    def _offset_for(self, topic: str, qid: int, timestamp: int) -> tuple[int, int]:
        """(offset, timestamp): -1 latest (= the LSO too), -2 earliest, else the first record
        stored at or after ``timestamp`` ms (-1, -1 when there is none)."""
        store = self.store
        if timestamp == -1:
            return store.max_offset(topic, qid), -1
        if timestamp == -2:
            return store.min_offset(topic, qid), -1
        offset = store.offset_by_time(topic, qid, timestamp)
        if offset >= store.max_offset(topic, qid):
            return -1, -1
        got = store.get(topic, qid, offset, 1)
        if not got.raw:
            return -1, -1
        msg = decode_records(got.raw[0])[0]
        return offset, msg.born_timestamp or msg.store_timestamp


async def _detached(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` run as a task of its own: cancelling the caller does not stop it, so a
    write and what records it are never separated by a cancelled request."""
    return await asyncio.shield(asyncio.ensure_future(coro))
