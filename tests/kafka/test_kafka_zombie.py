"""Zombie fencing, end to end: two instances of the pipeline app (tests/support/kafka_pipeline.py)
with one transactional.id.  When the second starts (InitProducerId bumps the epoch) the first,
mid-transaction, is fenced: its transaction fails with ProducerFenced and it stops, and nothing
it wrote in that transaction, or after, becomes visible; the second finishes the input, and the
output holds exactly one output per input."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.kafka_e2e import (
    E2E_SETTINGS,
    per_input,
    produce_inputs,
    read_topic,
    start_app,
)

from txbroker.client.admin import AdminClient

pytestmark = pytest.mark.slow  # two app processes and group rebalances: about 10 s

INPUTS = 200


@pytest.fixture
def kafka_config(kafka_config):
    return kafka_config.replace(**E2E_SETTINGS)


def _lines(proc) -> list[tuple[str, list[str]]]:
    out = []
    for line in proc.stdout.read().splitlines():
        kind, _, rest = line.partition(" ")
        out.append((kind, json.loads(rest)))
    return out


async def test_the_older_instance_is_fenced_and_nothing_it_writes_after_becomes_visible(
        kafka_broker, kafka_bootstrap, tmp_path):
    async with AdminClient(kafka_broker.namesrv_addr) as admin:
        for topic in ("zombie-in", "zombie-out"):
            await admin.create_topic(topic, 1)
    inputs = await produce_inputs(kafka_bootstrap, "zombie-in", INPUTS)
    # the older instance: slow transactions (0.3 s inside each), so it is mid-transaction
    older = start_app(kafka_bootstrap, "zombie-in", "zombie-out", "zombie-app", "zombie-tid",
                      instance="older", delay=0.3, idle_exit=30.0, log=tmp_path / "older.log")
    newer = None
    try:
        first = await asyncio.wait_for(asyncio.to_thread(older.stdout.readline), 30)
        assert first.startswith("committed "), first
        newer = start_app(kafka_bootstrap, "zombie-in", "zombie-out", "zombie-app", "zombie-tid",
                          instance="newer", idle_exit=3.0, log=tmp_path / "newer.log")
        assert await asyncio.wait_for(asyncio.to_thread(older.wait), 30) == 3  # fenced
        assert await asyncio.wait_for(asyncio.to_thread(newer.wait), 60) == 0
    finally:
        for p in (older, newer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    older_lines = [("committed", json.loads(first.split(" ", 1)[1])), *_lines(older)]
    assert older_lines[-1][0] == "fenced"
    older_committed = {v for kind, vs in older_lines if kind == "committed" for v in vs}
    fenced = set(older_lines[-1][1])

    outputs = await read_topic(kafka_bootstrap, "zombie-out", "read_committed", 1)
    assert sorted(outputs) == sorted(await read_topic(kafka_bootstrap, "zombie-out",
                                                      "read_uncommitted", 1))
    assert per_input(outputs) == {v: 1 for v in inputs}
    from_older = {o.split("|")[0] for o in outputs if o.endswith("|older")}
    assert from_older == older_committed  # only what it committed before it was fenced
    assert not fenced & from_older
    assert {o.split("|")[0] for o in outputs if o.endswith("|newer")} == set(inputs) - older_committed
