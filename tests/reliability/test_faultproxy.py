"""The TCP fault proxy, and transactions through it: every transaction ends in one outcome.

The broker listens on 127.0.0.2:P and advertises 127.0.0.1:P, where the proxy listens, so the
route every client gets leads through the proxy (name server included: it shares the port).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from support.waiting import eventually

from txbroker.bench.chaos.driver import LedgerListener
from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.bench.chaos.ledger import KINDS, Ledger
from txbroker.bench.chaos.process import free_port
from txbroker.broker import Broker
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.errors import ClientError


async def echo_server():
    async def handle(r, w):
        while data := await r.read(1024):
            w.write(data)
            await w.drain()
        w.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_proxy_forwards_and_delays_without_altering_bytes():
    server, port = await echo_server()
    proxy = await FaultProxy("127.0.0.1", port, delay_probability=1.0, max_delay=0.01, seed=1).start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
        payload = bytes(range(256)) * 8
        w.write(payload)
        got = await asyncio.wait_for(r.readexactly(len(payload)), 10)
        assert got == payload
        assert proxy.stats.delays >= 2 and proxy.stats.connections == 1
        w.close()
    finally:
        await proxy.close()
        server.close()


async def test_proxy_cut_closes_both_sides():
    server, port = await echo_server()
    proxy = await FaultProxy("127.0.0.1", port, cut_probability=1.0, seed=2).start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
        w.write(b"hello")
        assert await asyncio.wait_for(r.read(), 10) == b""
        assert proxy.stats.cuts_to_server == 1
    finally:
        await proxy.close()
        server.close()


def test_proxy_refuses_bad_probability():
    with pytest.raises(ValueError):
        FaultProxy("127.0.0.1", 1, cut_probability=1.5)


@pytest.mark.slow
async def test_held_proxy_forwards_nothing_until_released_then_everything():
    server, port = await echo_server()
    proxy = await FaultProxy("127.0.0.1", port).start()
    try:
        r1, w1 = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
        w1.write(b"before")
        assert await asyncio.wait_for(r1.readexactly(6), 10) == b"before"
        proxy.hold()
        assert proxy.held
        w1.write(b"during")  # an open connection stalls, it is not closed
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
        w2.write(b"new")  # a new one is accepted but not carried on
        for reader in (r1, r2):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), 0.5)
        assert proxy.stats.connections == 2 and proxy.stats.chunks == 2  # "before" both ways
        proxy.release()
        assert await asyncio.wait_for(r1.readexactly(6), 10) == b"during"
        assert await asyncio.wait_for(r2.readexactly(3), 10) == b"new"
        w1.close()
        w2.close()
    finally:
        await proxy.close()
        server.close()


async def test_transactions_through_a_faulty_network_end_in_exactly_one_outcome(broker_config):
    port = free_port()
    config = broker_config.replace(listen_host="127.0.0.2", advertised_host="127.0.0.1",
                                   broker_port=port, namesrv_port=-1, flush_mode="sync",
                                   transaction_check_max=1000)
    broker = Broker(config)
    await broker.start()
    proxy = await FaultProxy("127.0.0.2", broker.broker_port, listen_port=port, seed=5,
                             cut_probability=0.03, delay_probability=0.2, max_delay=0.05).start()
    ledger = Ledger()
    rng = random.Random(5)
    producers = [TransactionProducer("proxy_pg", proxy.addr, listener=LedgerListener(ledger),
                                     send_timeout=1.0, retries=0) for _ in range(2)]
    try:
        for p in producers:
            await p.start()

        async def load(idx: int, p: TransactionProducer) -> None:
            for i in range(120):
                key = f"x{idx}-{i}"
                ledger.begin(key, rng.choice(KINDS))
                try:
                    await p.send_message_in_transaction(Message("ProxyTopic", key.encode(), keys=key), key)
                except (ClientError, OSError, TimeoutError):
                    ledger.send_failed(key)
                    await asyncio.sleep(0.05)

        await asyncio.wait_for(asyncio.gather(*(load(i, p) for i, p in enumerate(producers))), 90)
        assert proxy.stats.cuts_to_server + proxy.stats.cuts_to_client > 0
        proxy.enabled = False  # the network heals; check-backs now resolve everything left
        await eventually(lambda: broker.tx.pending_count() == 0, 30, "every half resolved")

        consumer = Consumer("proxy_cg", proxy.addr, from_where="first", long_poll_timeout=0.5)
        consumer.subscribe("ProxyTopic")
        async with consumer:
            while (msg := await consumer.poll(3.0)) is not None:
                ledger.delivered(msg.keys, msg.queue_id, msg.queue_offset)
        report = ledger.verify(pending_at_end=broker.tx.pending_count())
        assert report.ok, report.table()
        assert sum(report.outcomes.values()) > 0
    finally:
        for p in producers:
            await p.shutdown()
        await proxy.close()
        await broker.stop()


class CommitByKey(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


@pytest.mark.slow
async def test_lost_half_answer_with_sdk_retry_commits_once(broker_config):
    port = free_port()
    config = broker_config.replace(listen_host="127.0.0.2", advertised_host="127.0.0.1",
                                   broker_port=port, namesrv_port=-1, flush_mode="sync")
    broker = Broker(config)
    await broker.start()
    cuts = []

    def lose_first_send_answer(to_server: bool, chunk: bytes) -> bool:
        if not to_server and b"MSG_REGION" in chunk and not cuts:
            cuts.append(chunk)
            return True
        return False

    proxy = await FaultProxy("127.0.0.2", broker.broker_port, listen_port=port,
                             cut_when=lose_first_send_answer).start()
    try:
        async with TransactionProducer("retry_pg", proxy.addr, listener=CommitByKey(), retries=2) as p:
            result = await p.send_message_in_transaction(Message("RetryTopic", b"once", keys="ONCE"))
            assert cuts and result.local_transaction_state == LocalTransactionState.COMMIT_MESSAGE
            await eventually(lambda: broker.tx.pending_count() == 0, 10,
                             "the orphan half, if any, checked and resolved")
        consumer = Consumer("retry_cg", proxy.addr, from_where="first", long_poll_timeout=0.5)
        consumer.subscribe("RetryTopic")
        got = []
        async with consumer:
            while (msg := await consumer.poll(2.0)) is not None:
                got.append(msg.keys)
        assert got == ["ONCE"]
    finally:
        await proxy.close()
        await broker.stop()


def request_frame(code: int) -> bytes:
    """The bytes a JSON-header request of ``code`` starts its header with.

    The codec writes every JSON header with ``code`` as its first key (txbroker/remoting/
    codec.py ``_encode_json_header``), and the SDK encodes with JSON, so a chunk carrying such a
    frame contains these bytes; the trailing comma keeps 37 from matching 370.
    """
    return b'{"code":%d,' % code


class DecidedListener(TransactionListener):
    """Answers ``execute`` with the state given per key and every check from ``truth``.

    ``truth`` is the listener's durable state (what a database would say); ``checked`` lists
    the keys the broker asked about, in order.
    """

    def __init__(self, execute: dict[str, LocalTransactionState],
                 truth: dict[str, LocalTransactionState]) -> None:
        self.execute = execute
        self.truth = truth
        self.checked: list[str] = []

    def execute_local_transaction(self, msg, arg):
        return self.execute[msg.keys]

    def check_local_transaction(self, msg):
        self.checked.append(msg.keys)
        return self.truth[msg.keys]


async def _proxied_broker(broker_config, cut_when):
    port = free_port()
    config = broker_config.replace(listen_host="127.0.0.2", advertised_host="127.0.0.1",
                                   broker_port=port, namesrv_port=-1, flush_mode="sync")
    broker = Broker(config)
    await broker.start()
    try:
        proxy = await FaultProxy("127.0.0.2", broker.broker_port, listen_port=port,
                                 cut_when=cut_when).start()
    except BaseException:
        await broker.stop()
        raise
    return broker, proxy


async def _consume(addr: str, topic: str, group: str) -> list[str]:
    consumer = Consumer(group, addr, from_where="first", long_poll_timeout=0.5)
    consumer.subscribe(topic)
    got = []
    async with consumer:
        while (msg := await consumer.poll(2.0)) is not None:
            got.append(msg.keys)
    return got


@pytest.mark.slow
async def test_lost_end_transaction_is_resolved_by_check_back(broker_config):
    # The producer decided (COMMIT for one transaction, ROLLBACK for the other) and sent its
    # one-way END_TRANSACTION, but the connection dies with it: the broker never hears the
    # decision, checks back after the immunity time, and applies the listener's answer.
    cuts: list[bytes] = []

    def lose_ends(to_server: bool, chunk: bytes) -> bool:
        if (to_server and request_frame(37) in chunk
                and b'"fromTransactionCheck":"false"' in chunk):
            cuts.append(chunk)
            return True
        return False

    broker, proxy = await _proxied_broker(broker_config, lose_ends)
    commit, rollback = LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE
    decided = {"END-C": commit, "END-R": rollback}
    listener = DecidedListener(execute=decided, truth=decided)
    try:
        async with TransactionProducer("lostend_pg", proxy.addr, listener=listener) as p:
            for n, (key, state) in enumerate(decided.items(), 1):
                result = await p.send_message_in_transaction(
                    Message("LostEndTopic", key.encode(), keys=key))
                assert result.local_transaction_state == state
                # END is one-way: wait until the proxy has cut it before the next half goes,
                # so the cut loses only the END and not a coalesced half SEND as well.
                await eventually(lambda n=n: len(cuts) == n, 2, f"END_TRANSACTION of {key} was not cut")
            await eventually(lambda: broker.tx.pending_count() == 0, 10.0, "every half resolved")
        assert sorted(set(listener.checked)) == ["END-C", "END-R"]  # resolved by check-back
        assert await _consume(proxy.addr, "LostEndTopic", "lostend_cg") == ["END-C"]
    finally:
        await proxy.close()
        await broker.stop()


@pytest.mark.slow
async def test_lost_check_back_is_asked_again(broker_config):
    # The local transaction answers UNKNOW; the first CHECK_TRANSACTION_STATE is lost with its
    # connection (the producer never sees it).  The broker must ask again on the reopened
    # connection, and the listener's COMMIT then delivers the message exactly once.
    cuts: list[bytes] = []

    def lose_first_check(to_server: bool, chunk: bytes) -> bool:
        if not to_server and request_frame(39) in chunk and not cuts:
            cuts.append(chunk)
            return True
        return False

    broker, proxy = await _proxied_broker(broker_config, lose_first_check)
    listener = DecidedListener(execute={"CHK": LocalTransactionState.UNKNOW},
                               truth={"CHK": LocalTransactionState.COMMIT_MESSAGE})
    try:
        async with TransactionProducer("lostcheck_pg", proxy.addr, listener=listener) as p:
            result = await p.send_message_in_transaction(Message("LostCheckTopic", b"chk", keys="CHK"))
            assert result.local_transaction_state == LocalTransactionState.UNKNOW
            await eventually(lambda: broker.tx.pending_count() == 0, 10.0, "every half resolved")
            assert cuts, "the first check-back must have been cut"
            assert listener.checked == ["CHK"]  # the lost check never reached the listener
        assert await _consume(proxy.addr, "LostCheckTopic", "lostcheck_cg") == ["CHK"]
    finally:
        await proxy.close()
        await broker.stop()
