"""Exactly once, end to end: an aiokafka consume-transform-produce app (tests/support/
kafka_pipeline.py: read topic A in a group, read_committed; one output per input to topic B
and the consumed offsets in the same transaction) runs as a process that is SIGKILLed at random
points and restarted with the same transactional.id, while the broker (a ``txbroker serve``
process with a pinned Kafka port, so the clients reconnect to the same address) is SIGKILLed and
restarted too.  At the end topic B holds exactly one output per input, read_committed and
read_uncommitted alike: nothing of an aborted attempt, nothing twice."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from support.kafka_e2e import (
    E2E_SETTINGS,
    per_input,
    produce_inputs,
    read_topic,
    start_app,
)

from txbroker.bench.chaos.process import free_port
from txbroker.client.admin import AdminClient

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

INPUTS = 2000
PARTITIONS = 2
#: Chaos rounds: after a random 0.5-2 s the app is SIGKILLed (the broker in the rounds named).
ROUNDS = 6
BROKER_ROUNDS = {2}
SEED = 15


async def _wait_exit(proc, timeout: float) -> int | None:
    try:
        return await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)
    except TimeoutError:
        return None


async def test_pipeline_outputs_exactly_once_through_app_and_broker_crashes(broker_process, tmp_path):
    port = free_port()
    broker = broker_process(kafka_port=port, **E2E_SETTINGS)
    assert broker.kafka_port == port and broker.kafka_addr == f"127.0.0.1:{port}"
    bootstrap = broker.kafka_addr
    async with AdminClient(broker.namesrv_addr) as admin:
        for topic in ("eos-in", "eos-out"):
            await admin.create_topic(topic, PARTITIONS)
    inputs = await produce_inputs(bootstrap, "eos-in", INPUTS)
    log = tmp_path / "app.log"

    def app():
        return start_app(bootstrap, "eos-in", "eos-out", "eos-app", "eos-tid", delay=0.05,
                         idle_exit=4.0, log=log)

    rng = random.Random(SEED)
    proc = app()
    kills = broker_kills = 0
    done: set[str] = set()  # inputs whose transaction an app reported committed
    mid_stream: list[str] = []  # the crashes that came while inputs were left

    def reap(p) -> None:
        for line in p.stdout.read().splitlines():
            if line.startswith("committed "):
                done.update(json.loads(line.split(" ", 1)[1]))
    try:
        for round_no in range(ROUNDS):
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            if round_no in BROKER_ROUNDS:
                broker.kill()
                broker_kills += 1
                broker.start()
                assert broker.kafka_addr == bootstrap  # same address after the restart
            if proc.poll() is None:
                proc.kill()
                kills += 1
            proc.wait(10)
            reap(proc)
            if len(done) < INPUTS:  # what was committed up to the crash(es) of this round
                mid_stream.append("broker" if round_no in BROKER_ROUNDS else "app")
            proc = app()
        # let the last instance run to its end: it exits 0 after 4 s without input
        for _ in range(5):
            code = await _wait_exit(proc, 60)
            if code == 0:
                break
            assert code is not None, "the pipeline app did not finish"
            reap(proc)
            proc = app()  # it lost the broker (a restart): start it again
        assert proc.returncode == 0, log.read_text()[-3000:]
        reap(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert kills >= 1 and broker_kills == 1
    # the crashes hit a running app (not one that had finished): the app and the broker
    assert "app" in mid_stream and "broker" in mid_stream, (mid_stream, len(done))
    assert done <= set(inputs)
    committed = await read_topic(bootstrap, "eos-out", "read_committed", PARTITIONS)
    uncommitted = await read_topic(bootstrap, "eos-out", "read_uncommitted", PARTITIONS)
    counts = per_input(committed)
    missing = [v for v in inputs if counts[v] == 0]
    twice = {v: n for v, n in counts.items() if n != 1}
    assert not missing and not twice, (len(missing), missing[:10], list(twice.items())[:10])
    assert set(counts) == set(inputs) and len(committed) == INPUTS
    assert sorted(uncommitted) == sorted(committed)  # one design: partitions hold committed data only
