"""``bench run --namesrv`` against a cluster of brokers: a ``txbroker namesrv`` and two broker
groups, each a ``txbroker serve`` subprocess registered with it.  The trace's transactions
spread over both groups' queues; check-backs come from both brokers; every outcome is still
as the trace says."""

from __future__ import annotations

import pytest
from bench_helpers import E2E_BROKER
from support.cluster import NamesrvSubprocess

from txbroker.bench.trace.embedded import serve_settings
from txbroker.bench.trace.generate import default_meta
from txbroker.bench.trace.run import run_all

pytestmark = pytest.mark.slow


def test_run_against_two_broker_groups_behind_a_name_server(spark, broker_process, tmp_path):
    namesrv = NamesrvSubprocess(tmp_path / "namesrv.log").start()
    try:
        # RocketMQ only: a cluster broker with a Kafka listener would need a Kafka node id.
        settings = {**serve_settings(E2E_BROKER), "kafka_port": -1}
        groups = [broker_process(tmp_path / name, **settings,
                                 namesrv_addr=namesrv.addr, broker_name=name)
                  for name in ("broker-a", "broker-b")]
        meta = default_meta(1000, seed=5, topics=2, producers=2, rate=1000.0, broker=E2E_BROKER)
        summary, _ = run_all(spark, meta, tmp_path / "work", namesrv.addr, tasks=2,
                             concurrency=32, rate=None)
        assert summary["violation_total"] == 0, summary["violations"]
        assert summary["deliveries"] == summary["expected_commits"] > 0
        assert summary["checks"]["expected"] == summary["expected_checks"] > 0
        # Both groups stored the bench's messages (each topic has queues on both).
        for broker in groups:
            queues = broker.data_dir / "consumequeue"
            stored = [p for p in queues.glob("BenchT*/*/*") if p.stat().st_size > 0]
            assert stored, f"{broker.settings['broker_name']} stored nothing under {queues}"
    finally:
        namesrv.stop()
