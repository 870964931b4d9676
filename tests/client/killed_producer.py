"""A transactional producer that stores its half message, then hangs in its local transaction.

Run by test_transaction.py, which SIGKILLs it once the transaction id is printed: the half is
stored and no END_TRANSACTION will ever come from this process.
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


async def main(namesrv: str, group: str, topic: str) -> None:
    producer = TransactionProducer(group, namesrv, listener=Hang())
    await producer.start()
    await producer.send_message_in_transaction(Message(topic, b"orphaned half", keys="ORPHAN"))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
