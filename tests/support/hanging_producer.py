"""A transactional producer that stores its half, prints the transaction id, then hangs in its
local transaction until it is SIGKILLed: no END_TRANSACTION will ever come from it.

Run: python tests/support/hanging_producer.py NAMESRV GROUP TOPIC BODY KEYS
"""

from __future__ import annotations

import asyncio
import sys

from txbroker.client import (
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)


class Hang(TransactionListener):
    async def execute_local_transaction(self, msg, arg):
        print(msg.transaction_id, flush=True)
        await asyncio.sleep(3600)
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


async def main(namesrv: str, group: str, topic: str, body: str, keys: str) -> None:
    async with TransactionProducer(group, namesrv, listener=Hang()) as producer:
        await producer.send_message_in_transaction(Message(topic, body.encode(), keys=keys))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
