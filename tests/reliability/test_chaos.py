"""Short chaos runs: the broker subprocess SIGKILLed under transactional load, then verified.

The full run (>= 20 kills) is ``python -m txbroker.bench.chaos --kills 20`` (docs/reliability.md).
"""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.driver import ChaosConfig, run_chaos


@pytest.mark.chaos
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("flush", "seed", "kills"), [("sync", 3, 3), ("async", 4, 2)])
async def test_sigkill_under_transactional_load(tmp_path, flush, seed, kills):
    cfg = ChaosConfig(seed=seed, kills=kills, producers=3, flush_mode=flush,
                      min_kill_interval=0.4, max_kill_interval=1.0, settle_timeout=30.0,
                      data_dir=str(tmp_path))
    report = await run_chaos(cfg)
    assert report.ok, report.table() + "\n" + (tmp_path / "broker.log").read_text()[-4000:]
    assert report.kills == kills and len(report.recovery_seconds) == kills
    # The load really mixed all four kinds and needed check-backs.
    assert all(report.outcomes[k] > 0 for k in ("commit", "rollback", "unknown-commit", "unknown-rollback"))
    assert report.checks_expected >= report.outcomes["unknown-commit"]
