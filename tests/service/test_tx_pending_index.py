"""PendingIndex: the columnar index of undecided halves (pure, no store)."""

from __future__ import annotations

import tracemalloc

import pytest

from txbroker.service.transaction.pending import PendingIndex
from txbroker.service.transaction.state import HalfState

HOST = "7F00000100002A9F"  # offsetMsgId prefix: 127.0.0.1:10911


def uniq(i: int) -> str:
    return f"AC11000100002A9F{i:016X}"


def add(ix: PendingIndex, i: int, *, ts: int = 1000, immunity: int = 6000, u: str | None = "",
        group: str = "G", topic: str = "T", conn: object = None) -> int:
    phys = 100 * i
    ix.add(phys=phys, queue_offset=i, store_ts=ts, immunity_ms=immunity, group=group,
           topic=topic, queue_id=i % 4, body_size=10 + i, msg_id=f"{HOST}{phys:016X}",
           uniq=uniq(i) if u == "" else u, conn=conn)
    return phys


def test_fields_are_kept_or_derived_exactly() -> None:
    ix = PendingIndex()
    conn = object()
    add(ix, 3, ts=1234, immunity=5000, group="PG", topic="Orders", conn=conn)
    e = ix.get(300)
    assert (e.phys, e.queue_offset, e.store_ts, e.immunity_ms, e.group, e.topic, e.queue_id,
            e.body_size, e.uniq, e.checks, e.conn, e.state) == (
        300, 3, 1234, 5000, "PG", "Orders", 3, 13, uniq(3), 0, conn, HalfState.PENDING)
    assert e.msg_id == f"{HOST}{300:016X}"
    assert ix.get(301) is None and ix.count(HalfState.PENDING) == len(ix) == 1


@pytest.mark.parametrize("key", [uniq(7), uniq(7).lower(), "my-own-id", None, "0" * 31])
def test_any_uniq_key_round_trips_and_is_found(key: str | None) -> None:
    ix = PendingIndex()
    add(ix, 1)
    phys = add(ix, 7, u=key)
    assert ix.get(phys).uniq == key
    if key:
        assert ix.find_uniq(key) == phys
    ix.remove(phys, HalfState.COMMITTED)
    if key:
        assert ix.find_uniq(key) is None
    assert ix.find_uniq(uniq(1)) == 100


def test_views_share_the_mutable_fields_and_outlive_the_half() -> None:
    ix = PendingIndex()
    for i in range(1, 4):
        add(ix, i)
    a, b = ix.get(200), ix.get(200)
    a.checks += 2
    a.conn = "c"
    assert (b.checks, b.conn) == (2, "c")
    ix.set_state(200, HalfState.DISCARDED)
    assert b.state is HalfState.DISCARDED and ix.count(HalfState.DISCARDED) == 1
    assert [e.phys for e in ix.entries(HalfState.PENDING)] == [100, 300]
    ix.remove(200, HalfState.ROLLED_BACK)
    assert a.state is HalfState.ROLLED_BACK and a.queue_offset == 2 and a.conn is None
    assert ix.get(200) is None and len(ix) == 2


def test_concurrent_prepares_stored_out_of_order_stay_in_log_order() -> None:
    ix = PendingIndex()
    for i in (1, 3, 2):
        add(ix, i)
    assert [e.phys for e in ix.entries(HalfState.PENDING)] == [100, 200, 300]
    with pytest.raises(ValueError):
        add(ix, 2)


def test_tombstones_are_dropped_and_compacted_without_losing_a_half() -> None:
    ix = PendingIndex()
    n = 5000
    for i in range(n):
        add(ix, i, conn=i)
    view = ix.get(100)  # decided among the first, so compacted away
    # decide every half but each seventh, oldest first: compactions move the slots
    for i in range(n):
        if i % 7:
            ix.remove(100 * i, HalfState.COMMITTED)
    assert len(ix._phys) < n // 7 * 1.25 + 1025  # tombstones were compacted away
    left = [i for i in range(n) if i % 7 == 0]
    assert [e.phys for e in ix.entries(HalfState.PENDING)] == [100 * i for i in left]
    for i in left:
        e = ix.get(100 * i)
        assert (e.queue_offset, e.conn, e.uniq) == (i, i, uniq(i))
        assert ix.find_uniq(uniq(i)) == 100 * i
    assert view.state is None  # compacted away: a view then says so
    for i in left:
        ix.remove(100 * i, None)
    assert len(ix) == 0 and len(ix._phys) == 0  # the tail goes at once


def test_due_follows_store_time_and_each_half_immunity() -> None:
    ix = PendingIndex()
    add(ix, 1, ts=0, immunity=6000)
    add(ix, 2, ts=0, immunity=60_000)     # old, but immune longer
    add(ix, 3, ts=1000, immunity=2000)    # younger, shortest immunity
    add(ix, 4, ts=5000, immunity=6000)
    add(ix, 5, ts=9000, immunity=6000)
    ix.set_state(100, HalfState.DISCARDED)
    assert [e.phys for e in ix.due(2999)] == []
    assert [e.phys for e in ix.due(3000)] == [300]
    assert [e.phys for e in ix.due(11_000)] == [300, 400]
    ix.set_state(100, HalfState.PENDING)
    assert [e.phys for e in ix.due(60_000)] == [100, 200, 300, 400, 500]
    ix.remove(300, HalfState.COMMITTED)
    assert [e.phys for e in ix.due(11_000)] == [100, 400]


def test_select_filters_by_state_topic_and_group_in_log_order() -> None:
    ix = PendingIndex()
    for i in range(1, 7):
        add(ix, i, group=f"G{i % 2}", topic=f"T{i % 3}")
    ix.set_state(400, HalfState.DISCARDED)
    assert [e.phys for e in ix.select((HalfState.PENDING,), group="G0", limit=10)] == [200, 600]
    assert [e.phys for e in ix.select((HalfState.PENDING, HalfState.DISCARDED), topic="T1",
                                      limit=10)] == [100, 400]
    assert [e.phys for e in ix.select((HalfState.DISCARDED,), limit=10)] == [400]
    assert len(ix.select((HalfState.PENDING,), limit=2)) == 2
    assert sorted(ix.open_states()) == [(1, 0, "pending"), (2, 0, "pending"), (3, 0, "pending"),
                                        (4, 0, "discarded"), (5, 0, "pending"), (6, 0, "pending")]


def test_a_pending_half_costs_under_200_bytes() -> None:
    # what bench.pending measures at a million, at a size a test can afford (not a timing)
    n = 50_000  # below ~50,000 a set's table is sized for growth, so per half is higher
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ix = PendingIndex()
        conn = object()
        for i in range(n):
            phys = 1_000_000_000 + 400 * i
            ix.add(phys=phys, queue_offset=i, store_ts=1_700_000_000_000 + i, immunity_ms=6000,
                   group="PG", topic="Orders", queue_id=i % 8, body_size=256,
                   msg_id=f"{HOST}{phys:016X}", uniq=uniq(i), conn=conn)
        per_half = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert per_half <= 200, per_half
