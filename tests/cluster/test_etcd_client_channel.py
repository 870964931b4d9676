"""The etcd client's calls share one channel: a call that fails drops it and moves on, and
every other call on it is cancelled with it.  Those must move on too, not end with the
cancellation (a broker's renewal loop ended that way, silently, and never renewed again).

A real three-member etcd on loopback; the first endpoint is a relay that forwards nothing and
closes nothing (a member cut off silently).
"""

from __future__ import annotations

import asyncio

import pytest

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.cluster.etcd import Etcd, EtcdUnavailable, put

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("etcd")]


async def test_calls_on_a_channel_another_call_dropped_move_on(etcd_cluster) -> None:
    host, port = etcd_cluster.members[0].endpoint.rsplit(":", 1)
    silent = await FaultProxy(host, int(port)).start()
    silent.hold()
    client = Etcd([silent.addr, etcd_cluster.members[1].endpoint], timeout=0.5)
    try:
        first = asyncio.ensure_future(client.range(b"/client-test/"))
        await asyncio.sleep(0.1)
        # On the same channel; the first call's time-out drops that channel under it.
        second = asyncio.ensure_future(client.get(b"/client-test/k"))
        (kvs, revision), missing = await asyncio.gather(first, second)
        assert kvs == [] and revision > 0 and missing is None
        # The same for a transaction, which is never sent twice: it ends as "unavailable"
        # (the caller reads again), never as a cancellation.
        await client.close()
        client = Etcd([silent.addr, etcd_cluster.members[1].endpoint], timeout=0.5)
        first = asyncio.ensure_future(client.range(b"/client-test/"))
        await asyncio.sleep(0.1)
        txn = asyncio.ensure_future(client.txn([], [put(b"/client-test/k", b"v")]))
        results = await asyncio.gather(first, txn, return_exceptions=True)
        assert not any(isinstance(r, asyncio.CancelledError) for r in results), results
        assert isinstance(results[1], EtcdUnavailable) or results[1].succeeded, results
    finally:
        await client.close()
        await silent.close()
