"""The store's write gate: consulted before an append is given an offset, and again before
a put that waited is acknowledged (a real store, a gate the test moves by hand)."""

from __future__ import annotations

import asyncio

from support.store import opened, store_config

from txbroker.store.record import Message
from txbroker.store.results import Fence, PutStatus


async def test_a_fenced_store_refuses_before_assigning_an_offset(tmp_path) -> None:
    store = await opened(store_config(tmp_path))
    try:
        fence: list[Fence | None] = [Fence.LEASE_NOT_VALID]
        store.set_write_gate(lambda: fence[0])
        end = store.max_physical_offset
        r = await store.put(Message("T", 0, b"x"))
        assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "lease" in r.reason
        assert r.physical_offset == -1 and store.max_physical_offset == end
        assert store.fenced is Fence.LEASE_NOT_VALID
        fence[0] = None
        assert (await store.put(Message("T", 0, b"x"))).status is PutStatus.OK
        assert store.fenced is None
    finally:
        await store.close()


async def test_a_put_answered_after_the_lease_went_is_not_acknowledged(tmp_path) -> None:
    store = await opened(store_config(tmp_path))
    try:
        fence: list[Fence | None] = [None]
        release = asyncio.Event()

        async def replicated(end: int) -> PutStatus:
            await release.wait()  # the slaves answer late...
            return PutStatus.OK

        store.set_write_gate(lambda: fence[0])
        store.set_replication(replicated)
        put = asyncio.create_task(store.put(Message("T", 0, b"late")))
        await asyncio.sleep(0.05)
        fence[0] = Fence.LEASE_NOT_VALID  # ...after the lease stopped being known to hold
        release.set()
        r = await put
        assert r.status is PutStatus.OUTCOME_UNKNOWN and not r.ok
        assert "may or may not be delivered" in r.reason
        assert store.read(r.physical_offset).body == b"late"  # stored, only not acknowledged

        # A stopping master finishes what it took: its acknowledgements stand.
        fence[0] = None
        release.clear()
        put = asyncio.create_task(store.put_batch([Message("T", 0, b"s")]))
        await asyncio.sleep(0.05)
        fence[0] = Fence.STOPPING
        release.set()
        assert [x.status for x in await put] == [PutStatus.OK]
    finally:
        store.set_replication(None)
        await store.close()
