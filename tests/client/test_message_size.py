"""Body size against the broker's limit: sent compressed, sent as is, or refused before sending.

The broker checks the body it receives (after the client's compression) against its
``max_message_size``; these tests run a broker with the default limit, 4 MiB.
"""

from __future__ import annotations

import random

import pytest
from support.consuming import collect

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.message import DEFAULT_MAX_MESSAGE_SIZE
from txbroker.config import BrokerConfig
from txbroker.store.record import COMPRESSED_FLAG, decode_offset_msg_id

LIMIT = DEFAULT_MAX_MESSAGE_SIZE
MIB = 1024 * 1024


@pytest.fixture
def broker_config(broker_config: BrokerConfig) -> BrokerConfig:
    """The broker's default body limit (the shared test settings use 256 KiB)."""
    return broker_config.replace(max_message_size=LIMIT, segment_size=16 * MIB)


async def _send_and_receive(broker, namesrv: str, topic: str, body: bytes) -> int:
    """Send ``body``, check it arrives intact, and return the stored record's sys flag."""
    async with Producer("PG_SIZE", namesrv) as producer:
        result = await producer.send(Message(topic, body))
    stored = broker.store.read(decode_offset_msg_id(result.offset_msg_id)[2])
    consumer = Consumer("CG_SIZE", namesrv, from_where="first")
    consumer.subscribe(topic)
    async with consumer:
        [received] = await collect(consumer, 1)
    assert received.body == body
    return stored.sys_flag


async def test_random_body_at_the_limit_is_sent_uncompressed(broker, namesrv) -> None:
    # zlib makes random bytes longer (4,194,304 -> 4,195,590): compressed, the broker refused it.
    body = random.Random(4).randbytes(LIMIT)
    assert not await _send_and_receive(broker, namesrv, "TSizeRandom", body) & COMPRESSED_FLAG


async def test_compressible_body_over_the_limit_is_sent_compressed(broker, namesrv) -> None:
    rng = random.Random(5)
    body = b"".join(rng.choice((b"order ", b"shipped ", b"paid ", b"42 ")) for _ in range(5 * MIB // 4))
    assert len(body) > LIMIT
    assert await _send_and_receive(broker, namesrv, "TSizeText", body) & COMPRESSED_FLAG


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        raise AssertionError("the local transaction must not run for a refused message")

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def test_random_body_over_the_limit_is_refused_before_sending(broker, namesrv) -> None:
    body = random.Random(6).randbytes(LIMIT + 1)
    error = (r"^message body is 4,194,305 bytes \(4,19\d,\d{3} compressed\), "
             r"over the 4,194,304-byte limit$")
    before = broker.store.max_physical_offset
    async with Producer("PG_SIZE", namesrv) as producer:
        with pytest.raises(ValueError, match=error):
            await producer.send(Message("TSizeBig", body))
    async with TransactionProducer("PG_SIZE_TX", namesrv, listener=_Commit()) as producer:
        with pytest.raises(ValueError, match=error):
            await producer.send_message_in_transaction(Message("TSizeBig", body))
    assert broker.store.max_physical_offset == before  # nothing reached the broker
