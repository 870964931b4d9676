"""``bench.cluster`` at a tiny size: every row (one broker, two groups, ASYNC_MASTER and
SYNC_MASTER with a slave) runs on real processes and commits transactions that the consumer
sees; the slave rows report a replication-lag sample (the benchmark itself is not timed)."""

from __future__ import annotations

import pytest

from txbroker.bench.cluster import ROWS, main

pytestmark = pytest.mark.slow  # seven broker and name-server processes


def test_every_row_commits_transactions(capsys) -> None:
    results = main(["--seconds", "0.3", "--producers", "2", "--max-tx", "100"])
    assert list(results) == list(ROWS)
    for row, r in results.items():
        assert r.seen > 0 and r.tps > 0, row
        assert r.broker_us > 0 and r.client_us > 0, row
    assert results["single"].lag_max is None and results["2 groups"].lag_max is None
    assert results["async+slave"].lag_max is not None and results["sync+slave"].lag_max is not None
    out = capsys.readouterr().out
    assert "sync/async committed tx/s" in out
    assert all(row in out for row in ROWS)
