"""Scenario (a) of ``python -m txbroker.bench.chaos --partitions``, one short run: each group's
master is cut off (silently, both ways) from the controller, the name servers and its slave
while the client still reaches it.  The SYNC_MASTER group must show no anomaly at all; the
ASYNC_MASTER group may lose acknowledged sends it had not shipped, but must never acknowledge
a write after its slave was promoted (no split-brain write).

Real processes in network namespaces (root only; skipped with the reason otherwise).  The full
bench is ``python -m txbroker.bench.chaos --partitions`` (docs/reliability.md, "Faults we test").
"""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.netns import unavailable_reason
from txbroker.bench.chaos.partitions import PartitionsConfig, report, run_partitions

REASON = unavailable_reason()
# Namespaces, addresses and the bridge are fixed names: one run at a time (pytest -n: one worker).
pytestmark = pytest.mark.xdist_group("netns")


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(150)
def test_master_cut_off_keeps_each_modes_promises(tmp_path):
    lines: list[str] = []
    cfg = PartitionsConfig(scenarios=("a",), runs=1, seed=3, warmup=(1.0, 1.5), after_heal=1.5,
                           settle_timeout=15.0, run_timeout=110.0, work_dir=str(tmp_path))
    results = run_partitions(cfg, progress=lines.append)
    table = "\n".join(lines) + "\n" + report(results)
    (run,) = results
    assert run.error is None, table
    assert run.cuts_proved > 0 and run.cuts_unproved == 0, table  # the fault really happened
    sync, async_ = run.verdicts["broker-a"], run.verdicts["broker-b"]
    for v in (sync, async_):
        assert v.oks > 0 and any(p is not None for p in v.promotions_s), table
    assert sync.ok, table
    assert async_.split_brain == [], table
