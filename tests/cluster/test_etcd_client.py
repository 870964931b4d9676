"""The etcd client (txbroker/cluster/etcd.py) against a real three-member etcd: it moves to
the next member when one refuses connections or does not answer, never sends a transaction
twice, and counts a keep-alive from its sending time."""

from __future__ import annotations

import time

import pytest

from txbroker.cluster.etcd import (
    Etcd,
    EtcdUnavailable,
    compare_create,
    parse_endpoints,
    prefix_end,
    put,
)
from txbroker.cluster.local_etcd import LocalEtcd, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("etcd")]


def test_prefix_end_and_endpoints() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"
    assert parse_endpoints("https://h:1/, h2:2;h3:3") == ["h:1", "h2:2", "h3:3"]
    for bad in ("h", "h:0", "h:99999", ":5"):
        with pytest.raises(ValueError, match="not host:port"):
            parse_endpoints(bad)


async def test_a_member_that_refuses_or_hangs_is_left_for_the_next(etcd_cluster: LocalEtcd) -> None:
    """A refused connection and a paused member (it accepts connections and never answers,
    as one cut off from its majority does) both send the client on to the next member; a
    follower is paused, so etcd keeps its leader meanwhile."""
    dead = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    members = parse_endpoints(etcd_cluster.endpoints)
    follower = next(i for i in range(3) if i != etcd_cluster.leader())
    order = [members[follower], *(m for i, m in enumerate(members) if i != follower)]
    etcd = Etcd([dead, *order], timeout=0.5)
    try:
        assert (await etcd.get(b"/k")) is None  # the refused one passed over
        assert etcd.current == members[follower]
        etcd_cluster.pause(follower)
        t0 = time.monotonic()
        assert await _retrying_put(etcd)
        kv = await etcd.get(b"/k")
        assert kv is not None and kv.value == b"v"
        assert etcd.current != members[follower] and time.monotonic() - t0 < 5.0
    finally:
        etcd_cluster.resume(follower)
        await etcd.close()


async def _retrying_put(etcd: Etcd) -> bool:
    """A guarded put as the product sends one: not sent again by the client, so the caller
    reads and tries again (bounded)."""
    for _ in range(5):
        try:
            result = await etcd.txn([compare_create(b"/k", 0)], [put(b"/k", b"v")])
        except EtcdUnavailable:
            continue
        return result.succeeded or (await etcd.get(b"/k")) is not None
    return False


async def test_a_transaction_is_not_sent_twice(etcd_cluster: LocalEtcd) -> None:
    """Every endpoint down: a read tries each once, a transaction only one, and both say
    which endpoints failed."""
    dead = [f"127.0.0.1:{p}" for p in free_ports(2)]
    etcd = Etcd(dead, timeout=0.3)
    try:
        with pytest.raises(EtcdUnavailable, match="did not answer a read") as read:
            await etcd.get(b"/k")
        assert all(d in str(read.value) for d in dead)
        with pytest.raises(EtcdUnavailable, match="did not answer a transaction") as txn:
            await etcd.txn([], [put(b"/k", b"v")])
        assert sum(d in str(txn.value) for d in dead) == 1
    finally:
        await etcd.close()


async def test_a_keep_alive_reports_its_sending_time(etcd_cluster: LocalEtcd) -> None:
    ticks = iter(range(100, 200))
    etcd = Etcd(parse_endpoints(etcd_cluster.endpoints), timeout=1.0, clock=lambda: next(ticks))
    try:
        lease, granted = await etcd.grant(2)
        assert granted >= 2
        sent, ttl = await etcd.keep_alive(lease)
        assert sent == 100 and ttl >= 2
        await etcd.revoke(lease)
        _, ttl = await etcd.keep_alive(lease)
        assert ttl <= 0  # gone: the caller must take a new lease
    finally:
        await etcd.close()
