"""Scenario (k) of ``python -m txbroker.bench.chaos --partitions --etcd``, one short run: a
three-member etcd (each member a real ``etcd`` in a network namespace of its own), no
controller; each group's master is cut off (silently, both ways) from every etcd member but
not from its clients, its slave or the name servers.  It must stop acknowledging within one
lease of its last renewal; etcd then drops its lease and the slave is elected.  Neither group
may acknowledge a write by the cut-off master after the slave was elected (no split-brain
write, read from the groups' ``leader`` keys in etcd); the SYNC_MASTER group shows no anomaly
at all, and each group is promoted.  Twice: the second run starts only once each group has a
master and both brokers in sync again, so the old master, whose etcd lease ran out while it
was cut off, must have taken a new one and been taken back into the in-sync set.

Real processes in network namespaces (root only; skipped with the reason otherwise).  The full
bench is ``python -m txbroker.bench.chaos --partitions --etcd`` (docs/reliability.md, "Faults
we test").
"""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.netns import unavailable_reason
from txbroker.bench.chaos.partitions import PartitionsConfig, report, run_partitions
from txbroker.cluster.local_etcd import EtcdNotFound, etcd_binary

REASON = unavailable_reason()
try:
    etcd_binary()
except EtcdNotFound as exc:
    REASON = REASON or str(exc)
# One namespace test at a time (pytest -n: one worker), as test_partitions.py.
pytestmark = [pytest.mark.xdist_group("netns"), pytest.mark.chaos]


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(300)
def test_master_cut_off_from_etcd_is_replaced_without_split_brain_and_rejoins(tmp_path):
    lines: list[str] = []
    cfg = PartitionsConfig(scenarios=("k",), runs=2, seed=3, warmup=(1.0, 1.5), after_heal=1.5,
                           settle_timeout=15.0, run_timeout=110.0, healthy_timeout=20.0,
                           work_dir=str(tmp_path), etcd=True)
    results = run_partitions(cfg, progress=lines.append)
    table = "\n".join(lines) + "\n" + report(results)
    assert len(results) == 2, table
    for run in results:
        assert run.error is None, table  # the second: the first's old master rejoined
        assert run.cuts_proved > 0 and run.cuts_unproved == 0, table  # the fault happened
        sync, async_ = run.verdicts["broker-a"], run.verdicts["broker-b"]
        for v in (sync, async_):
            assert v.oks > 0 and any(p is not None for p in v.promotions_s), table
            assert v.split_brain == [], table
            assert all(g is not None for g in v.fault_gaps_s), table  # writes resumed
        assert sync.ok, table
