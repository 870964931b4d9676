"""Sends started in one loop turn leave in one write, against a real broker.

The connection core corks what is written within a loop turn into one ``writelines``; that
helps only while the SDK's send path writes its request before it first waits (a cached
route, an open connection, a frame template): an await on the way would spread the sends
over loop turns and writes.  The flush is counted on the client connection itself.
"""

from __future__ import annotations

import asyncio

from txbroker.client import (
    LocalTransactionState,
    Message,
    Producer,
    SendStatus,
    TransactionListener,
    TransactionProducer,
)

SENDS = 20


class CommitAll(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def _count_flushes(producer: Producer) -> list[int]:
    """Frames per flush of the producer's one broker connection, from now on."""
    (conn,) = producer._instance._conns.values()
    proto = conn._proto
    flushes: list[int] = []
    flush = proto._flush

    def counting() -> None:
        if proto._out:
            flushes.append(len(proto._out))
        flush()

    proto._flush = counting
    return flushes


async def test_sends_of_one_loop_turn_leave_in_one_write(broker, namesrv) -> None:
    async with Producer("PG_CORK", namesrv) as producer:
        await producer.send(Message("TCork", b"warm-up"))  # route and connection
        flushes = _count_flushes(producer)
        results = await asyncio.gather(*(producer.send(Message("TCork", b"m%d" % i))
                                         for i in range(SENDS)))
    assert all(r.send_status is SendStatus.SEND_OK for r in results)
    assert flushes[0] == SENDS, flushes


async def test_halves_of_one_loop_turn_leave_in_one_write(broker, namesrv) -> None:
    """A transactional producer's halves too (it checks its connection before a half)."""
    async with TransactionProducer("PG_CORK_TX", namesrv, listener=CommitAll()) as producer:
        await producer.send_message_in_transaction(Message("TCorkTx", b"warm-up"))
        flushes = _count_flushes(producer)
        results = await asyncio.gather(*(producer.send_message_in_transaction(
            Message("TCorkTx", b"m%d" % i)) for i in range(SENDS)))
        for _ in range(3):  # the last ENDs are corked until the loop turn ends
            await asyncio.sleep(0)
        flushes = list(flushes)  # before the shutdown's own requests
    assert all(r.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE for r in results)
    assert flushes[0] == SENDS, flushes
    # every END_TRANSACTION was written too, in as many writes as the answers took reads
    assert sum(flushes) == 2 * SENDS, flushes
