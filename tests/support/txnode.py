"""A transactional service on a real store and a real TCP server, and a real producer client:
the harness of the transaction service and recovery tests.

One :class:`ManualClock` is shared by the store and the service, so immunity and check timing
are driven by advancing it.  The periodic check service is given a long interval; passes run
through ``check_now()``.  The server-side Connection a half is prepared with is the one the
:class:`Producer` opened (learned from its HEART_BEAT).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from support.clock import ManualClock
from support.waiting import eventually
from txbroker.config import BrokerConfig
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.server import RemotingServer
from txbroker.service.clients import ClientRegistry
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.processors.transaction import transaction_handlers
from txbroker.service.transaction.bridge import TransactionalMessageBridge
from txbroker.service.transaction.service import TransactionalMessageService
from txbroker.store.message_store import MessageStore
from txbroker.store.record import OP_HALF_TOPIC, Message

COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
GROUP = "PG_TX"
TIMEOUT = 5.0


def tx_config(data_dir: Path, **overrides) -> BrokerConfig:
    settings = {"data_dir": str(data_dir), "broker_port": 0, "namesrv_port": -1, "metrics_port": -1,
                    "segment_size": 1024 * 1024, "max_message_size": 64 * 1024,
                    "consume_queue_entries": 1024, "flush_interval": 0.05,
                    "transaction_check_interval": 3600.0, "transaction_timeout": 6.0,
                    "transaction_check_max": 3, "check_concurrency": 4}
    settings.update(overrides)
    return BrokerConfig(**settings)


@dataclass
class Node:
    """A store + transactional service + TCP server serving the transaction handlers."""

    config: BrokerConfig
    clock: ManualClock
    store: MessageStore
    tx: TransactionalMessageService
    registry: ClientRegistry
    metrics: BrokerMetrics
    server: RemotingServer
    port: int
    conns: list = field(default_factory=list)

    async def close(self) -> None:
        await self.server.close(1.0)
        await self.tx.close()
        await self.store.close()


async def open_node(config: BrokerConfig, clock: ManualClock, *,
                    bridge: type[TransactionalMessageBridge] = TransactionalMessageBridge,
                    **store_kw) -> Node:
    """``bridge``: the service's store access; crash tests pass a subclass that injects faults."""
    store = MessageStore(config, clock=clock, store_host=("127.0.0.1", 10911), **store_kw)
    store.open()
    await store.start()
    registry = ClientRegistry(clock=clock)
    metrics = BrokerMetrics()
    tx = TransactionalMessageService(config, store, registry, metrics, clock=clock,
                                     bridge=bridge(store, clock=clock))
    tx.recover()
    await tx.start()
    server = RemotingServer(config)
    node = Node(config, clock, store, tx, registry, metrics, server, 0)
    for code, handler in transaction_handlers(tx).items():
        server.register(int(code), handler)

    async def heartbeat(conn, cmd: RemotingCommand) -> RemotingCommand:
        # the producer announces its group; the registry learns the connection
        registry.note_producer(cmd.ext_fields["group"], conn)
        node.conns.append(conn)
        return cmd.response(ResponseCode.SUCCESS)

    server.register(int(RequestCode.HEART_BEAT), heartbeat)
    node.port = await server.start("127.0.0.1", 0)
    return node


class Producer:
    """A real client; records the CHECK_TRANSACTION_STATE requests it receives and may answer."""

    def __init__(self, node: Node, answer: int | None = None) -> None:
        self.node = node
        self.client = RemotingClient(f"127.0.0.1:{node.port}")
        self.answer = answer
        self.checks: list[RemotingCommand] = []
        self.client.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    async def start(self, group: str = GROUP):
        await self.client.connect()
        before = len(self.node.conns)
        resp = await self.client.invoke(
            RemotingCommand.request(RequestCode.HEART_BEAT, {"group": group}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        assert len(self.node.conns) == before + 1
        self.conn = self.node.conns[-1]
        return self

    async def _on_check(self, cmd: RemotingCommand) -> None:
        self.checks.append(cmd)
        if self.answer is not None:
            ext = cmd.ext_fields
            await self.client.invoke_oneway(end_cmd(int(ext["commitLogOffset"]),
                                                    int(ext["tranStateTableOffset"]),
                                                    self.answer, from_check=True))

    async def wait_checks(self, n: int) -> None:
        await eventually(lambda: len(self.checks) >= n, TIMEOUT,
                         lambda: f"{len(self.checks)} checks received, wanted {n}")

    async def close(self) -> None:
        await self.client.close()


def end_cmd(phys: int, qo: int, decision: int, *, group: str = GROUP, from_check: bool = False,
            oneway: bool = False) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": str(qo), "commitLogOffset": str(phys),
        "commitOrRollback": str(decision), "fromTransactionCheck": "1" if from_check else "0",
        "msgId": "M", "transactionId": "M"}, oneway=oneway)


def half_msg(body: bytes = b"payload", *, topic: str = "TxT", queue_id: int = 1, uniq: str = "U1",
             born: int | None = None, **props: str) -> Message:
    p = {"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": uniq, "TAGS": "TagA", "KEYS": "K1"}
    p.update(props)
    return Message(topic=topic, queue_id=queue_id, body=body, properties=p, sys_flag=4,
                   born_timestamp=int(time.time() * 1000) if born is None else born,
                   born_host=("127.0.0.1", 5555))


async def prepare(node: Node, conn=None, **kw):
    result = await node.tx.prepare(half_msg(**kw), conn)
    assert result.status.name == "OK"
    return result


async def end(node: Node, result, decision: int, **kw):
    return await node.tx.end_transaction(commit_log_offset=result.physical_offset,
                                         tran_state_table_offset=result.queue_offset,
                                         producer_group=kw.pop("group", GROUP),
                                         commit_or_rollback=decision, **kw)


def visible(node: Node, topic: str = "TxT", queue_id: int = 1):
    res = node.store.get(topic, queue_id, 0, 100)
    return res.messages() if res.status.name == "FOUND" else []


def op_records(node: Node):
    return visible(node, OP_HALF_TOPIC, 0)
