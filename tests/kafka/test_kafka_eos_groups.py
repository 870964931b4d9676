"""Exactly once across broker groups: the aiokafka consume-transform-produce app
(tests/support/kafka_pipeline.py) on a cluster of two broker groups, its transactions
coordinated by one group and its consumer group by the other, its output spread over both; each
group's master is SIGKILLed and restarted (pinned ports) while it runs.  At the end the output
holds exactly one record per input, read_committed (docs/kafka.md, "Kafka on a cluster")."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.kafka_e2e import per_input, produce_inputs, read_topic, start_app
from test_kafka_cluster import keys_by_coordinator
from test_kafka_txn_groups_crash import (
    create_in_group,
    create_topic,
    group_process,
    namesrv,
    seen_everywhere,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
#: The name-server process fixture, shared with the crash tests.
__all__ = ["namesrv"]

INPUTS = 600
#: Seconds of running before each master is killed (broker-b first, then broker-a).
KILL_AFTER = (1.5, 1.5)


async def _wait_exit(proc, timeout: float) -> int | None:
    try:
        return await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)
    except TimeoutError:
        return None


async def test_pipeline_outputs_exactly_once_through_master_kills_on_two_groups(
        broker_process, namesrv, tmp_path) -> None:
    a = group_process(broker_process, tmp_path, "broker-a", 1, namesrv.addr,
                      kafka_group_initial_rebalance_delay=0.2, kafka_group_min_session_timeout=1.0)
    b = group_process(broker_process, tmp_path, "broker-b", 2, namesrv.addr,
                      kafka_group_initial_rebalance_delay=0.2, kafka_group_min_session_timeout=1.0)
    # Input on broker-b only (the consumer group's coordinator: its offsets stay in its own
    # group); output over both groups.
    await create_in_group(b, "eos-in", 2)
    await create_topic(a, "eos-out", 4)  # two partitions in each group
    await seen_everywhere([a, b], "eos-in", [2, 2])
    await seen_everywhere([a, b], "eos-out", [1, 1, 2, 2])
    tid, group = keys_by_coordinator(2)  # transactions on broker-a, the consumer group on broker-b
    bootstrap = f"{a.kafka_addr},{b.kafka_addr}"
    inputs = await produce_inputs(bootstrap, "eos-in", INPUTS)
    log = tmp_path / "app.log"
    done: set[str] = set()

    def app():
        return start_app(bootstrap, "eos-in", "eos-out", group, tid, delay=0.05, idle_exit=4.0,
                         log=log)

    def reap(p) -> None:
        for line in p.stdout.read().splitlines():
            if line.startswith("committed "):
                done.update(json.loads(line.split(" ", 1)[1]))

    proc = app()
    try:
        for victim, after in zip((b, a), KILL_AFTER, strict=True):
            await asyncio.sleep(after)
            assert proc.poll() is None or proc.returncode == 0, log.read_text()[-3000:]
            victim.kill()
            victim.start()
        mid_stream = len(done) < INPUTS
        for _ in range(5):  # the app may give up on a broker it lost: start it again
            code = await _wait_exit(proc, 90)
            assert code is not None, "the pipeline app did not finish"
            reap(proc)
            if code == 0:
                break
            proc = app()
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert mid_stream, "the kills came after the app had finished"
    committed = await read_topic(bootstrap, "eos-out", "read_committed", 4)
    counts = per_input(committed)
    missing = [v for v in inputs if counts[v] == 0]
    twice = {v: n for v, n in counts.items() if n != 1}
    assert not missing and not twice, (len(missing), missing[:10], list(twice.items())[:10])
    assert len(committed) == INPUTS
