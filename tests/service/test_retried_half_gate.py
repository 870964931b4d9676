"""A producer's retry of a half is answered like a new put: through the write gate.

The retry of a pending half (same UNIQ_KEY, group, topic and size) stores nothing and answers
with the first half's ids.  That answer is an acknowledgement, so it must pass what a put
passes: a fenced master (its lease not known valid, a demotion) refuses it, where before it
answered SEND_OK for a half that a failover may cut.
"""

from __future__ import annotations

import pytest
from support.clock import ManualClock
from support.txnode import half_msg, open_node, tx_config

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
