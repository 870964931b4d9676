"""A half the check service gave up on: listed as discarded, resumed by an operator, committed."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from click.testing import CliRunner
from support.consuming import collect
from support.waiting import eventually

from txbroker.cli.main import main
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.config import BrokerConfig


@pytest.fixture
def broker_config(broker_config: BrokerConfig) -> BrokerConfig:
    """The shared test settings, with the check service giving up after two checks."""
    return broker_config.replace(transaction_check_max=2)


class Undecided(TransactionListener):
    def __init__(self) -> None:
        self.answer = LocalTransactionState.UNKNOW

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return self.answer


async def _cli(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), catch_exceptions=False)


async def test_discarded_half_resumed_by_operator(broker, namesrv) -> None:
    listener = Undecided()
    async with TransactionProducer("PG_DISC", namesrv, listener=listener) as producer:
        result = await producer.send_message_in_transaction(Message("TDisc", b"late", keys="d1"))
        async with AdminClient(namesrv) as admin:
            rows = []

            async def discarded() -> bool:
                rows[:] = await admin.txn_list("discarded")
                return bool(rows)

            await eventually(discarded, 15, "the half discarded")
        assert rows[0]["id"] == result.transaction_id and rows[0]["state"] == "discarded"
        out = await _cli("txn", "list", "--state", "discarded", "--json", "--namesrv", namesrv)
        assert out.exit_code == 0 and orjson.loads(out.stdout)[0]["id"] == result.transaction_id
        listener.answer = LocalTransactionState.COMMIT_MESSAGE  # the producer is fixed
        out = await _cli("txn", "resume", result.transaction_id, "--operator", "ops", "--namesrv", namesrv)
        assert out.exit_code == 0, out.output
        assert "now pending" in out.stdout
        await eventually(lambda: broker.tx.pending_count() == 0, msg="resumed half committed by check")
    consumer = Consumer("CG_DISC", namesrv, from_where="first", long_poll_timeout=2.0)
    consumer.subscribe("TDisc")
    async with consumer:
        [msg] = await collect(consumer, 1)
        assert msg.body == b"late" and msg.transaction_id == result.transaction_id
