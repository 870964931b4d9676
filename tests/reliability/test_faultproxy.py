"""The TCP fault proxy, and transactions through it: every transaction ends in one outcome.

The broker listens on 127.0.0.2:P and advertises 127.0.0.1:P, where the proxy listens, so the
route every client gets leads through the proxy (name server included: it shares the port).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from bench.chaos.driver import LedgerListener
from bench.chaos.faultproxy import FaultProxy
from bench.chaos.ledger import KINDS, Ledger
from bench.chaos.process import free_port
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
        for _ in range(300):
            if broker.tx.pending_count() == 0:
                break
            await asyncio.sleep(0.1)
        assert broker.tx.pending_count() == 0

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
            for _ in range(100):  # the orphan half, if any, is checked and resolved
                if broker.tx.pending_count() == 0:
                    break
                await asyncio.sleep(0.1)
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
