"""A short cluster chaos run: the master of a SYNC_MASTER group SIGKILLed twice under
transactional load; every kill must lead to a promotion, the killed broker must rejoin, and
the Ledger's verdict must be clean.

The full run is ``python -m txbroker.bench.chaos --cluster --kills 10`` (docs/bench.md).
"""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.cluster import ClusterChaosConfig, run_cluster_chaos


@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_master_sigkilled_twice_under_transactional_load(tmp_path):
    cfg = ClusterChaosConfig(seed=5, kills=2, producers=2, lease=1.5, heartbeat_interval=0.3,
                             settle_timeout=40.0, data_dir=str(tmp_path))
    report = await run_cluster_chaos(cfg)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))
    assert report.ok, report.table() + "\n" + logs
    assert len(report.kills) == 2
    assert all(k.promotion_s is not None and k.rejoin_s is not None for k in report.kills)
    # Both brokers were master once: the first victim came back as a slave and was promoted.
    assert {k.victim for k in report.kills} == {0, 1}
    assert report.ledger.lost == [] and report.ledger.duplicated == []
    assert report.ledger.pending_at_end == 0
    assert all(report.ledger.outcomes[k] > 0 for k in ("commit", "rollback", "unknown-commit",
                                                        "unknown-rollback"))


def test_kill_gap_spans_kill_to_first_send_after_promotion():
    # A send the dying master answered lands just after the kill (10.01): the gap that
    # counts is the one up to the first send after the promotion at 12.0.
    from txbroker.bench.chaos.cluster import KillRecord, _kill_gap

    ok = [9.0, 9.9, 10.01, 12.3, 12.31, 13.0]
    assert _kill_gap(ok, KillRecord(victim=0, promotion_s=2.0, t_kill=10.0)) == pytest.approx(2.29)
    assert _kill_gap(ok, KillRecord(victim=0, promotion_s=None, t_kill=10.0)) is None
    assert _kill_gap(ok, KillRecord(victim=0, promotion_s=5.0, t_kill=10.0)) is None  # no send after


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_etcd_leader_then_master_sigkilled_under_transactional_load(tmp_path):
    """The same run electing on etcd: each round SIGKILLs etcd's leader, then the group's
    master; every kill is followed by an election, the victim rejoins, and the Ledger finds
    nothing lost, duplicated or wrongly delivered."""
    cfg = ClusterChaosConfig(seed=7, kills=2, producers=2, lease=2.0, settle_timeout=40.0,
                             data_dir=str(tmp_path), etcd=True)
    report = await run_cluster_chaos(cfg)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))
    assert report.ok, report.table() + "\n" + logs
    assert len(report.kills) == 2 and {k.victim for k in report.kills} == {0, 1}
    assert report.ledger.lost == [] and report.ledger.duplicated == []
    assert report.ledger.pending_at_end == 0
