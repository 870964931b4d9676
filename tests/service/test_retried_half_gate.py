"""A producer's retry of a half is answered like a new put: through the write gate.

The retry of a pending half (same UNIQ_KEY, group, topic and size) stores nothing and answers
with the first half's ids.  That answer is an acknowledgement, so it must pass what a put
passes: a fenced master (its lease not known valid, a demotion) refuses it, where before it
answered SEND_OK for a half that a failover may cut.
"""

from __future__ import annotations

import pytest
from support.clock import ManualClock
from support.txnode import end, half_msg, op_records, open_node, tx_config, visible

from txbroker.remoting.headers import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE
from txbroker.service.transaction.service import TransactionError
from txbroker.service.transaction.state import HalfState
from txbroker.store.results import Fence, PutStatus


@pytest.fixture
async def node(tmp_path):
    n = await open_node(tx_config(tmp_path / "data"), ManualClock())
    try:
        yield n
    finally:
        await n.close()


async def test_a_retried_half_is_refused_while_the_store_is_fenced(node) -> None:
    first = await node.tx.prepare(half_msg(b"retry me", uniq="0" * 31 + "1"), None)
    assert first.status is PutStatus.OK
    node.store.set_write_gate(lambda: Fence.LEASE_NOT_VALID)
    again = await node.tx.prepare(half_msg(b"retry me", uniq="0" * 31 + "1"), None)
    assert again.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert again.reason == Fence.LEASE_NOT_VALID.text
    node.store.set_write_gate(None)
    third = await node.tx.prepare(half_msg(b"retry me", uniq="0" * 31 + "1"), None)
    assert third.status is PutStatus.OK
    assert (third.physical_offset, third.queue_offset, third.msg_id) == \
        (first.physical_offset, first.queue_offset, first.msg_id)
    assert node.tx.pending_count() == 1  # still one half: nothing stored twice


def _gate_up_after_first_ask(appends: int = 1):
    """A write gate that lets ``appends`` appends through and is up when the answer leaves:
    the lease lapsed while the put waited, so what it stored is answered OUTCOME_UNKNOWN."""
    asked = []

    def gate() -> Fence | None:
        asked.append(1)
        return None if len(asked) <= appends else Fence.LEASE_NOT_VALID
    return gate


@pytest.fixture
async def sync_node(tmp_path):
    """Sync flush: a put waits for the disk, so the gate is asked again before it answers."""
    n = await open_node(tx_config(tmp_path / "data", flush_mode="sync"), ManualClock())
    try:
        yield n
    finally:
        await n.close()


async def test_a_half_answered_outcome_unknown_is_indexed_so_its_retry_stores_nothing(sync_node) -> None:
    node = sync_node
    # Stored, but answered OUTCOME_UNKNOWN: the half is in the log, so the index must know it.
    # Without that, the producer's retry stored a second half, its END decided that one, and
    # the check-back committed the first as well: one local transaction delivered twice (the
    # partition harness, scenario (f), SYNC_MASTER).
    node.store.set_write_gate(_gate_up_after_first_ask())
    first = await node.tx.prepare(half_msg(b"unknown", uniq="0" * 31 + "2"), None)
    assert first.status is PutStatus.OUTCOME_UNKNOWN
    assert node.tx.pending_count() == 1  # checked back if never retried, not left pending
    node.store.set_write_gate(None)
    again = await node.tx.prepare(half_msg(b"unknown", uniq="0" * 31 + "2"), None)
    assert again.status is PutStatus.OK
    assert (again.physical_offset, again.queue_offset) == (first.physical_offset, first.queue_offset)
    assert node.tx.pending_count() == 1


@pytest.mark.parametrize("decision", [TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE])
async def test_a_decision_answered_outcome_unknown_is_settled_so_a_check_back_writes_nothing(
        sync_node, decision) -> None:
    # The END's final message (or op record) is stored but answered OUTCOME_UNKNOWN.  Left
    # pending, the half was committed again by the next check-back: a second final message,
    # one transaction delivered twice (partition scenario (f), SYNC_MASTER).
    node = sync_node
    half = await node.tx.prepare(half_msg(b"decided once", uniq="0" * 31 + "3"), None)
    assert half.status is PutStatus.OK
    # a commit appends its final message and its op record, a rollback the op record only
    node.store.set_write_gate(_gate_up_after_first_ask(2 if decision == TRANSACTION_COMMIT_TYPE else 1))
    with pytest.raises(TransactionError, match="stored, but not acknowledged"):
        await end(node, half, decision)
    node.store.set_write_gate(None)
    settled = HalfState.COMMITTED if decision == TRANSACTION_COMMIT_TYPE else HalfState.ROLLED_BACK
    assert node.tx.state_of(half.physical_offset) is settled
    assert node.tx.pending_count() == 0  # nothing left for a check-back
    await end(node, half, decision)  # the decision again, as a check-back answer would bring it
    finals = 1 if decision == TRANSACTION_COMMIT_TYPE else 0
    assert len(visible(node)) == finals
    assert len(op_records(node)) == 1
