"""One local SparkSession for all bench tests (JVM start-up is the slow part), and one real
end-to-end bench run (embedded ``txbroker serve`` subprocess on loopback) shared by the tests
that inspect its results."""

from __future__ import annotations

import pytest
from bench_helpers import E2E_BROKER, E2E_TRANSACTIONS

from txbroker.bench.trace.generate import default_meta


@pytest.fixture(scope="session")
def spark():
    from txbroker.bench.trace.spark import session

    # Four slots: an end-to-end run's 2 replay tasks and 2 delivery tasks run at once.
    s = session("local[4]", app="txbroker-bench-tests", shuffle_partitions=2)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def e2e_run(spark, tmp_path_factory):
    """generate → replay (real broker) → verify → report; returns (work dir, summary, timings)."""
    from txbroker.bench.trace.run import run_all

    work = tmp_path_factory.mktemp("bench-e2e")
    meta = default_meta(E2E_TRANSACTIONS, seed=7, topics=2, producers=4, rate=2000.0,
                        broker=E2E_BROKER)
    summary, timings = run_all(spark, meta, work, None, tasks=2, concurrency=64, rate=None)
    return work, summary, timings
