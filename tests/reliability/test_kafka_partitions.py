"""Scenario (a) of ``python -m txbroker.bench.chaos --partitions --kafka``, one short run: each
group's master is cut off (silently, both ways) from the controller, the name servers and its
slave while the Kafka clients still reach it, under aiokafka's idempotent records,
transactions over both groups and an exactly-once pipeline per group.  The SYNC_MASTER group
must show no anomaly at all (nothing acknowledged lost or moved, nothing twice, every committed
transaction whole, every aborted one invisible, one output per input); the ASYNC_MASTER group
nothing twice and no aborted read.

Real processes in network namespaces (root only; skipped with the reason otherwise).  The full
bench is ``python -m txbroker.bench.chaos --partitions --kafka`` (docs/reliability.md, "Faults
we test", "Kafka clients").
"""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.kafka_partitions import report
from txbroker.bench.chaos.netns import unavailable_reason
from txbroker.bench.chaos.partitions import PartitionsConfig, run_partitions

REASON = unavailable_reason()

# Namespaces, addresses and the bridge are fixed names: one run at a time (pytest -n: one worker).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("netns")]


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(240)
def test_kafka_clients_keep_each_modes_promises_when_the_master_is_cut_off(tmp_path):
    lines: list[str] = []
    cfg = PartitionsConfig(scenarios=("a",), runs=1, seed=3, warmup=(1.0, 1.5), after_heal=1.0,
                           run_timeout=200.0, work_dir=str(tmp_path), kafka=True)
    results = run_partitions(cfg, progress=lines.append)
    table = "\n".join(lines) + "\n" + report(results)
    (run,) = results
    assert run.error is None, table
    assert run.cuts_proved > 0 and run.cuts_unproved == 0, table  # the fault really happened
    sync, async_ = run.verdicts["broker-a"], run.verdicts["broker-b"]
    for v in (sync, async_):
        assert v.oks > 0 and v.txn_committed > 0 and v.txn_aborted > 0 and v.pipe_inputs > 0, table
        assert any(p is not None for p in v.promotions_s), table  # the slave was promoted
    assert sync.ok, table
    assert async_.ok, table
