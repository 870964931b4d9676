"""The history checker on hand-built histories: each anomaly found, a clean history passed,
and the mode decides which anomalies fail a run."""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.history import ASYNC, SYNC, check, join_ops

A0, A1 = "10.213.0.4:10911", "10.213.0.5:10911"
G = "broker-a"


def send(key, t0, t1, kind="ok", broker=A0, decision="commit", status="SEND_OK"):
    ev = [{"type": "invoke", "key": key, "group": G, "mono": t0}]
    done = {"type": kind, "key": key, "group": G, "mono": t1}
    if kind == "ok":
        done.update(broker=broker, status=status)
    if decision is not None:
        done["decision"] = decision
    return ev + [done]


def read(key, queue=0, offset=0):
    return {"type": "read", "key": key, "group": G, "queue": queue, "offset": offset}


def master(t, addr, epoch):
    return {"type": "master", "group": G, "mono": t, "master": addr, "epoch": epoch}


def test_clean_history_passes_in_both_modes():
    h = [master(0.0, A0, 1), *send("k1", 1.0, 1.1), *send("k2", 1.2, 1.3, decision="rollback"),
         *send("k3", 1.4, 3.4, kind="info", decision=None), *send("k4", 1.5, 1.6, kind="fail", decision=None),
         read("k1"), {"type": "pending", "group": G, "count": 0}]
    for mode in (SYNC, ASYNC):
        v = check(h, G, mode)
        assert v.ok, v.verdict
        assert (v.oks, v.infos, v.fails) == (2, 1, 1)
        assert v.longest_gap_s == pytest.approx(0.2)


def test_lost_commit_fails_sync_but_async_only_counts_it_with_its_window():
    h = [master(0.0, A0, 1), *send("k1", 1.0, 1.1), *send("k2", 2.0, 2.1), master(3.5, A1, 2),
         *send("k3", 4.0, 4.1, broker=A1), read("k2", 0, 0), read("k3", 0, 1)]
    sync = check(h, G, SYNC)
    assert sync.lost == ["k1"] and not sync.ok
    assert sync.loss_window_s == pytest.approx(2.4)
    assert "1 acknowledged commit(s) lost" in sync.verdict
    async_ = check(h, G, ASYNC)
    assert async_.lost == ["k1"] and async_.ok, async_.verdict


def test_unreplicated_acknowledgement_lost_is_not_a_sync_violation():
    h = [master(0.0, A0, 1), *send("k1", 1.0, 3.0, status="FLUSH_SLAVE_TIMEOUT")]
    v = check(h, G, SYNC)
    assert v.lost == [] and v.lost_unreplicated == ["k1"] and v.ok


def test_duplicate_and_aborted_reads():
    h = [master(0.0, A0, 1), *send("k1", 1.0, 1.1), *send("k2", 1.2, 1.3, decision="rollback"),
         *send("k3", 1.4, 3.4, kind="info", decision=None), *send("k4", 1.5, 1.6, kind="fail", decision=None),
         read("k1", 0, 0), read("k1", 1, 7), read("k1", 1, 7), read("k2", 0, 1), read("k3", 0, 2),
         read("k4", 0, 3), read("stranger", 0, 4)]
    v = check(h, G, ASYNC)
    assert v.duplicated == ["k1"]  # the same position twice is a redelivery, two positions a duplicate
    assert sorted(v.aborted_reads) == ["k2", "k3", "k4"]
    assert v.unknown_reads == ["stranger"]
    assert not v.ok


def test_indeterminate_either_way_but_never_both():
    h = [*send("k1", 1.0, 3.0, kind="info", decision="either"),
         *send("k2", 1.0, 3.0, kind="info", decision="either"),
         *send("k3", 1.0, 3.0, kind="info", decision="either"),
         read("k2", 0, 0), read("k3", 0, 1), read("k3", 2, 1)]
    v = check(h, G, SYNC)
    assert v.indeterminate_twice == ["k3"] and v.lost == [] and v.aborted_reads == []


def test_split_brain_write_after_another_broker_was_named():
    h = [master(0.0, A0, 1), master(5.0, A1, 2),
         *send("before", 4.0, 5.2),            # invoked before the promotion: may be answered late
         *send("after", 5.1, 5.3),             # invoked after A1 was named, stored by A0
         *send("new", 5.1, 5.3, broker=A1),    # the new master: fine
         *send("early", 4.5, 4.6, broker=A1),  # A1 answered before the poll saw it named: fine
         master(8.0, A0, 3),
         *send("back", 8.1, 8.2),              # A0 is master again in epoch 3: fine
         *send("renamed", 7.9, 8.3),           # A0 named again before it answered: fine
         read("before"), read("after", 0, 1), read("new", 0, 2), read("early", 0, 5), read("back", 0, 3), read("renamed", 0, 4)]
    v = check(h, G, ASYNC)
    assert v.split_brain == ["after"]
    assert "1 split-brain write(s)" in v.verdict


def test_pending_halves_and_promotion_times():
    h = [master(0.0, A0, 1), {"type": "fault", "mono": 2.0, "until": 9.0},
         {"type": "master", "group": G, "mono": 3.0, "master": "", "epoch": 1},
         master(4.5, A1, 2), {"type": "fault", "mono": 10.0, "until": 12.0},
         {"type": "pending", "group": G, "count": 2}, {"type": "pending", "group": "other", "count": 5}]
    v = check(h, G, SYNC)
    assert v.pending == 2 and "2 half(s) left pending" in v.verdict
    assert v.promotions_s == [pytest.approx(2.5), None]


def test_bookkeeping_errors_are_refused():
    with pytest.raises(ValueError, match="invoked twice"):
        join_ops(send("k", 1, 2) + send("k", 3, 4))
    with pytest.raises(ValueError, match="without one open invocation"):
        join_ops(send("k", 1, 2)[1:])
    with pytest.raises(ValueError, match="mode"):
        check([], G, "MASTER")


def fault(t0, until, **extra):
    return {"type": "fault", "scenario": "x", "mono": t0, "until": until, **extra}


def test_write_gap_per_fault_window_and_its_bound():
    # oks at 1.0, 1.5 | fault 2.0-4.0 | 5.2, 5.4 (a gap of 3.7 s across the fault) | second
    # fault 8.0-9.0 with no gap above 0.9 s around it.
    h = [master(0.0, A0, 1), *send("k1", 0.9, 1.0), *send("k2", 1.4, 1.5),
         fault(2.0, 4.0, gap_bound=3.0), *send("k3", 5.1, 5.2), *send("k4", 5.3, 5.4),
         *send("k5", 7.8, 7.9), fault(8.0, 9.0), *send("k6", 8.1, 8.3), *send("k7", 9.1, 9.2)]
    v = check(h, G, SYNC)
    assert v.fault_gaps_s == [pytest.approx(3.7), pytest.approx(0.9)]
    assert v.gap_bounds_s == [3.0, None]
    assert not v.ok and "write gap 3.7 s above the bound 3.0 s" in v.verdict
    h[h.index(fault(2.0, 4.0, gap_bound=3.0))] = fault(2.0, 4.0, gap_bound=4.0)
    assert check(h + [read(f"k{i}", 0, i) for i in range(1, 8)], G, SYNC).ok


def test_a_bounded_fault_after_which_nothing_is_acknowledged_fails():
    h = [master(0.0, A0, 1), *send("k1", 0.9, 1.0), fault(2.0, 4.0, gap_bound=5.0),
         *send("k2", 2.5, 4.5, kind="info", decision=None)]
    v = check(h, G, SYNC)
    assert v.fault_gaps_s == [None] and "writes never resumed" in v.verdict


def test_acknowledged_without_quorum():
    # The control plane lost its majority from 2.0 to 6.0, lease 2 s: k2 (invoked 3.0, inside
    # the lease) may be acknowledged, k3 (invoked 4.5) must not be before 6.0; k4 after 6.0 is.
    h = [master(0.0, A0, 1), *send("k1", 1.0, 1.1), *send("k2", 3.0, 3.1),
         *send("k3", 4.5, 4.6), fault(2.0, 6.0, quorum_lost=[2.0, 6.0], lease=2.0),
         *send("k4", 6.5, 6.6), read("k1"), read("k2", 0, 1), read("k3", 0, 2), read("k4", 0, 3)]
    v = check(h, G, SYNC)
    assert v.acked_without_quorum == ["k3"] and v.resumed_after_quorum is True
    assert not v.ok and "1 send(s) acknowledged more than one lease" in v.verdict
    h2 = [e for e in h if e.get("key") not in ("k3", "k4")]
    v2 = check(h2, G, SYNC)
    assert v2.acked_without_quorum == [] and v2.resumed_after_quorum is False
    assert "no write acknowledged after the control plane came back" in v2.verdict
