"""txbroker's Python SDK: asyncio producers and consumers speaking the RocketMQ 4.x protocol.

The names below are the public API (RocketMQ's names in Python style)::

    from txbroker.client import (
        Message, MessageExt, SendStatus, SendResult, TransactionSendResult,
        LocalTransactionState, TransactionListener, Producer, TransactionProducer, Consumer,
        MessageQueue,
    )

Errors are in :mod:`txbroker.client.errors`; operator requests (topics, status, pending
transactions) in :mod:`txbroker.client.admin`.
"""

from txbroker.client.consumer import Consumer
from txbroker.client.message import (
    LocalTransactionState,
    Message,
    MessageExt,
    SendResult,
    SendStatus,
    TransactionSendResult,
)
from txbroker.client.producer import Producer
from txbroker.client.rebalance import MessageQueue
from txbroker.client.transaction import TransactionListener, TransactionProducer

__all__ = [
    "Consumer",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageQueue",
    "Producer",
    "SendResult",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]
