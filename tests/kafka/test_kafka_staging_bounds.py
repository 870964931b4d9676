"""Bounds at a participant of a transaction across broker groups (docs/kafka.md, "Kafka on a
cluster"): staged batches are checked when they arrive (compression bombs, bad records),
verified with the transaction's coordinator (KIP-890), capped in bytes per producer and in
all, and expire when the coordinator says their transaction is over.  Real name server, real
brokers on loopback, raw Kafka requests (what a misbehaving client can send)."""

from __future__ import annotations

import itertools

from support.cluster import InProcessCluster
from test_kafka_bombs import _batch_with_payload, _bombs
from test_kafka_cluster import TOPIC, keys_by_coordinator, two_groups
from test_kafka_listener import Wire

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.compression import GZIP, ZSTD
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch

LIMIT = 1024 * 1024


class Client:
    """A transactional producer speaking raw requests: the coordinator on one connection, the
    participant on another."""

    def __init__(self, coordinator: Wire, participant: Wire, tid: str) -> None:
        self.coordinator, self.participant, self.tid = coordinator, participant, tid
        self.corr = itertools.count(1)
        self.ids: dict = {}

    async def init(self) -> None:
        init = await self.coordinator.call(ApiKey.INIT_PRODUCER_ID, 0, next(self.corr), {
            "transactional_id": self.tid, "transaction_timeout_ms": 60000})
        assert init["error_code"] == 0
        self.ids = {"transactional_id": self.tid, "producer_id": init["producer_id"],
                    "producer_epoch": init["producer_epoch"]}

    async def add(self, partition: int) -> int:
        added = await self.coordinator.call(ApiKey.ADD_PARTITIONS_TO_TXN, 0, next(self.corr), {
            **self.ids, "topics": [{"name": TOPIC, "partitions": [partition]}]})
        return added["results"][0]["results"][0]["partition_error_code"]

    async def produce(self, partition: int, batch: bytes) -> int:
        answer = await self.participant.call(ApiKey.PRODUCE, 7, next(self.corr), {
            "transactional_id": self.tid, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": TOPIC, "partition_data": [
                {"index": partition, "records": batch}]}]})
        return answer["responses"][0]["partition_responses"][0]["error_code"]

    def batch(self, codec: int, payload: bytes, sequence: int) -> bytes:
        return _batch_with_payload(codec, payload, transactional=True,
                                   producer_id=self.ids["producer_id"],
                                   producer_epoch=self.ids["producer_epoch"],
                                   base_sequence=sequence)


async def test_a_participant_refuses_a_bomb_and_bad_records_when_they_arrive(
        broker_config: BrokerConfig, tmp_path) -> None:
    async with InProcessCluster(broker_config.replace(max_message_size=LIMIT, segment_size=4 * LIMIT), tmp_path) as c:
        a, b = await two_groups(c)
        tid = keys_by_coordinator(2)[0]  # coordinated by broker-a; partition 4 is broker-b's
        coord, part = await Wire.open(a.kafka_port), await Wire.open(b.kafka_port)
        try:
            client = Client(coord, part, tid)
            await client.init()
            assert await client.add(4) == ErrorCode.NONE
            assert await client.produce(4, client.batch(ZSTD, _bombs()["zstd"], 0)) == \
                ErrorCode.MESSAGE_TOO_LARGE
            assert await client.produce(4, client.batch(GZIP, b"not gzip", 0)) == \
                ErrorCode.CORRUPT_MESSAGE
            assert b.kafka_staging.staged_count() == 0
        finally:
            coord.close()
            part.close()


async def test_a_producer_staging_without_end_is_refused_at_the_caps(
        broker_config: BrokerConfig, tmp_path) -> None:
    """A hostile client sends batch after batch to a participant and never ends its
    transaction: the participant holds at most ``kafka_transaction_max_bytes`` of it, and all
    producers together at most ``kafka_transactions_max_bytes``."""
    cap, total = 2 * LIMIT, 3 * LIMIT
    config = broker_config.replace(max_message_size=LIMIT, segment_size=16 * LIMIT,
                                   kafka_transaction_max_bytes=cap,
                                   kafka_transactions_max_bytes=total)
    value = bytes(range(256)) * 1024  # 256 KiB, uncompressed
    async with InProcessCluster(config, tmp_path) as c:
        a, b = await two_groups(c)
        on_a = [k for k in (f"hostile-{n}" for n in range(200))
                if a.kafka_view.coordinator(k)[1]][:2]
        coord, part = await Wire.open(a.kafka_port), await Wire.open(b.kafka_port)
        try:
            first = Client(coord, part, on_a[0])
            await first.init()
            assert await first.add(4) == ErrorCode.NONE
            answers = []
            for seq in range(12):  # 3 MiB offered, 2 MiB allowed
                answers.append(await first.produce(4, _plain(first, value, seq)))
                assert b.kafka_staging.staged_count() * len(value) <= cap
            assert answers[:7] == [ErrorCode.NONE] * 7
            assert set(answers[7:]) == {ErrorCode.RECORD_LIST_TOO_LARGE}
            # A second producer fills what is left of the total, then is refused retriably.
            second = Client(coord, part, on_a[1])
            await second.init()
            assert await second.add(4) == ErrorCode.NONE
            answers = []
            for seq in range(6):  # a retriable refusal ends it (the same sequence comes again)
                answers.append(await second.produce(4, _plain(second, value, seq)))
                if answers[-1] != ErrorCode.NONE:
                    break
            assert answers == [ErrorCode.NONE] * (len(answers) - 1) + [ErrorCode.KAFKA_STORAGE_ERROR]
            assert len(answers) > 1
            assert b.kafka_staging.staged_count() * len(value) <= total
            assert b.kafka_staging.staged_bytes <= total
            # The broker goes on: an abort frees what the first producer staged.
            end = await coord.call(ApiKey.END_TXN, 0, 99, {**first.ids, "committed": False})
            assert end["error_code"] == ErrorCode.NONE
            assert b.kafka_staging.staged_bytes <= total - 7 * len(value)
        finally:
            coord.close()
            part.close()


def _plain(client: Client, value: bytes, sequence: int) -> bytes:
    return encode_batch(0, [Record(0, 1_700_000_000_000, None, value, [])],
                        producer_id=client.ids["producer_id"],
                        producer_epoch=client.ids["producer_epoch"], base_sequence=sequence,
                        transactional=True)
