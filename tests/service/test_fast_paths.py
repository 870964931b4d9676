"""The send and END handlers' fast paths: applied inline (no coroutine) when nobody has to wait
for them, through the coroutine otherwise, with the same outcome and the same records."""

from __future__ import annotations

from types import CoroutineType

import pytest
from support.clock import ManualClock
from support.txnode import (
    COMMIT,
    ROLLBACK,
    end_cmd,
    open_node,
    prepare,
    tx_config,
    visible,
)

from txbroker.remoting.codes import RequestCode
from txbroker.service.processors.transaction import transaction_handlers
from txbroker.store.message_store import MessageStore
from txbroker.store.results import PutStatus


class _Conn:
    """What the END handler reads of a connection: its peer, for the refusal's log line."""

    peer = "127.0.0.1:5555"


def _is_coroutine(value: object) -> bool:
    return isinstance(value, CoroutineType) or hasattr(value, "send") and hasattr(value, "throw")


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
@pytest.mark.parametrize("decision", [COMMIT, ROLLBACK])
async def test_a_one_way_end_is_applied_inline_and_lands_on_disk(tmp_path, flush_mode,
                                                                 decision) -> None:
    """Without slaves to wait for, an END is applied before the handler returns, with sync
    flush too (nobody waits for a one-way END's answer); a clean stop leaves it on disk."""
    config = tx_config(tmp_path / "d", flush_mode=flush_mode)
    node = await open_node(config, ManualClock())
    try:
        result = await prepare(node, body=b"inline")
        handler = transaction_handlers(node.tx)[RequestCode.END_TRANSACTION]
        answer = handler(_Conn(), end_cmd(result.physical_offset, result.queue_offset, decision,
                                          oneway=True))
        assert answer is None  # applied: no coroutine left to run, nothing to answer
        assert [m.body for m in visible(node)] == ([b"inline"] if decision == COMMIT else [])
        assert node.tx.pending_count() == 0
    finally:
        await node.close()
    reopened = await open_node(config, ManualClock())
    try:
        assert [m.body for m in visible(reopened)] == ([b"inline"] if decision == COMMIT else [])
        assert reopened.tx.pending_count() == 0
    finally:
        await reopened.close()


async def test_an_end_that_must_wait_for_slaves_runs_as_a_coroutine(tmp_path) -> None:
    """A SYNC_MASTER's END waits for its slaves: the handler hands back a coroutine, which
    applies the decision once the slaves hold it."""
    node = await open_node(tx_config(tmp_path / "d"), ManualClock())
    try:
        result = await prepare(node, body=b"replicated")
        waited: list[int] = []

        async def slaves_hold(end: int) -> PutStatus:
            waited.append(end)
            return PutStatus.OK

        store: MessageStore = node.store
        store.set_replication(slaves_hold)
        handler = transaction_handlers(node.tx)[RequestCode.END_TRANSACTION]
        rest = handler(_Conn(), end_cmd(result.physical_offset, result.queue_offset, COMMIT,
                                        oneway=True))
        assert _is_coroutine(rest)
        assert visible(node) == []  # nothing applied before the coroutine runs
        assert await rest is None
        assert [m.body for m in visible(node)] == [b"replicated"]
        assert waited and waited[-1] == store.max_physical_offset
    finally:
        node.store.set_replication(None)
        await node.close()


async def test_an_end_on_a_half_being_decided_waits_its_turn(tmp_path) -> None:
    """While another decision holds the half's lock, an END does not jump ahead inline: it
    queues behind it as a coroutine and then finds the half decided (a repeat)."""
    node = await open_node(tx_config(tmp_path / "d"), ManualClock())
    try:
        result = await prepare(node, body=b"locked")
        phys = result.physical_offset
        await node.tx._locks.acquire(phys)
        handler = transaction_handlers(node.tx)[RequestCode.END_TRANSACTION]
        rest = handler(_Conn(), end_cmd(phys, result.queue_offset, COMMIT, oneway=True))
        assert _is_coroutine(rest)
        node.tx._locks.release(phys)
        assert await rest is None
        assert [m.body for m in visible(node)] == [b"locked"]
    finally:
        await node.close()
