"""A half whose SEND answer is lost is retried on the same queue, never in another group.

Two broker groups behind one name server; broker-a is reached through a fault proxy that
cuts the connection carrying the first SEND answer (the half is stored, the producer only
sees the connection drop).  A retry in broker-b would store a second half under the same
transaction id: the producer's END commits one, the check-back commits the other, and the
message is delivered twice.  Retried in broker-a, the broker answers with the first half's
ids (it is still pending) and the message is delivered once.
"""

from __future__ import annotations

import pytest
from support.cluster import InProcessCluster, route
from support.consuming import collect
from support.waiting import eventually

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.bench.chaos.process import free_port
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.errors import SendError
from txbroker.service.topics import TopicConfig

TOPIC = "HalfRetry"


class CommitAll(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def _two_groups(c: InProcessCluster, cut_when):
    ns = await c.namesrv()
    port = free_port()
    a = await c.broker("broker-a", listen_host="127.0.0.2", advertised_host="127.0.0.1",
                       broker_port=port, transaction_check_interval=0.5)
    proxy = await FaultProxy("127.0.0.2", a.broker_port, listen_port=port, cut_when=cut_when).start()
    b = await c.broker("broker-b", transaction_check_interval=0.5)
    for broker in (a, b):
        await broker.topics.create_or_update(TopicConfig(TOPIC, 1, 1))

    async def both_routed() -> bool:
        got = await route(ns.addr, TOPIC)
        return got is not None and len(got.broker_datas) == 2

    await eventually(both_routed, msg="both groups routed")
    return ns, a, b, proxy


async def test_a_half_with_a_lost_answer_is_retried_in_its_own_group(broker_config, tmp_path):
    cuts: list[bytes] = []

    def lose_first_send_answer(to_server: bool, chunk: bytes) -> bool:
        if not to_server and b"MSG_REGION" in chunk and not cuts:
            cuts.append(chunk)
            return True
        return False

    async with InProcessCluster(broker_config, tmp_path) as c:
        ns, a, b, proxy = await _two_groups(c, lose_first_send_answer)
        try:
            async with TransactionProducer("PG_HALF_RETRY", ns.addr, listener=CommitAll(),
                                           retries=2) as producer:
                # The producer's queue rotation starts at broker-a for some first message;
                # send until one answer was cut (bounded).
                results = []
                for i in range(8):
                    results.append(await producer.send_message_in_transaction(
                        Message(TOPIC, b"m%d" % i, keys=f"k{i}")))
                    if cuts:
                        break
                assert cuts, "no SEND answer went through broker-a's proxy"
                assert results[-1].broker_name == "broker-a"
                assert all(r.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
                           for r in results)
                await eventually(lambda: a.tx.pending_count() == 0 and b.tx.pending_count() == 0,
                                 20, "no half left pending")
            consumer = Consumer("CG_HALF_RETRY", ns.addr, "first", long_poll_timeout=0.5,
                                rebalance_interval=0.5)
            consumer.subscribe(TOPIC)
            async with consumer:
                got = await collect(consumer, len(results), timeout=15)
                extra = await consumer.poll(2.0)
            keys = sorted(m.keys for m in got) + ([extra.keys] if extra is not None else [])
            assert keys == sorted(f"k{i}" for i in range(len(results))), keys
        finally:
            await proxy.close()


async def test_a_half_whose_outcome_stays_unknown_says_it_may_be_stored(broker_config, tmp_path):
    """Every attempt on broker-a loses its answer: the producer does not try broker-b, does
    not run the local transaction, and says the half may be stored."""
    def lose_every_send_answer(to_server: bool, chunk: bytes) -> bool:
        return not to_server and b"MSG_REGION" in chunk

    ran: list[str] = []

    class Recording(CommitAll):
        def execute_local_transaction(self, msg, arg):
            ran.append(msg.keys)
            return LocalTransactionState.COMMIT_MESSAGE

    async with InProcessCluster(broker_config, tmp_path) as c:
        ns, _a, b, proxy = await _two_groups(c, lose_every_send_answer)
        try:
            async with TransactionProducer("PG_HALF_UNKNOWN", ns.addr, listener=Recording(),
                                           retries=2, send_timeout=2.0) as producer:
                for i in range(8):
                    try:
                        result = await producer.send_message_in_transaction(
                            Message(TOPIC, b"u%d" % i, keys=f"u{i}"))
                    except SendError as exc:
                        assert exc.may_be_stored, exc
                        assert "broker-b" not in str(exc) and str(b.broker_port) not in str(exc)
                        assert "may have been stored" in str(exc)
                        assert f"u{i}" not in ran
                        break
                    assert result.broker_name == "broker-b"
                else:
                    pytest.fail("no half went to broker-a in 8 sends")
            assert b.tx.pending_count() == 0
        finally:
            await proxy.close()
