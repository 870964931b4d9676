"""A check-back that arrives while the producer still answers an earlier check of the same
transaction: the broker counted it, so it gets its own answer, after the first one (the
listener runs once per check, never twice at once for one transaction)."""

from __future__ import annotations

import asyncio

import pytest
from support.waiting import eventually

from txbroker.client import (
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.config import BrokerConfig

UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture
def broker_config(broker_config: BrokerConfig) -> BrokerConfig:
    """The shared test settings with no periodic pass: the test sends each check itself."""
    return broker_config.replace(transaction_check_interval=3600.0)


async def test_a_check_arriving_while_its_transactions_check_runs_is_answered_after_it(
        broker, namesrv) -> None:
    # Without the answer a counted check never gets, the half nears its discard although
    # its producer is online (checks answered UNKNOW here keep it pending).
    running = peak = calls = 0
    release = asyncio.Event()

    class Slow(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return UNKNOW

        async def check_local_transaction(self, msg):
            nonlocal running, peak, calls
            running += 1
            calls += 1
            peak = max(peak, running)
            try:
                await release.wait()
            finally:
                running -= 1
            return UNKNOW

    def answered() -> str | None:
        return broker.metrics.snapshot().get("tx_check_answers_total_unknown")

    async with TransactionProducer("PG_AGAIN", namesrv, listener=Slow()) as producer:
        await producer.send_message_in_transaction(Message("TAgain", b"again"))
        await asyncio.sleep(0.6)  # past the 0.5 s transaction timeout: the half is due
        for n in (1, 2, 3):  # checks 2 and 3 arrive while the first one still runs
            assert (await broker.tx.check_now()).sent == 1
        await eventually(lambda: calls == 1)
        await asyncio.sleep(0.2)  # checks 2 and 3 are in; neither runs beside the first
        assert calls == 1 and peak == 1
        release.set()
        await eventually(lambda: answered() == "3", msg="one answer per check, in turn")
        await asyncio.sleep(0.2)
        assert calls == 3 and peak == 1 and answered() == "3"
