"""Network fuzzing against a running broker while a healthy client keeps working; codec fuzzing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from txbroker.bench.chaos.codecfuzz import PROPERTIES, run
from txbroker.bench.chaos.fuzz import BAD_TOPICS, cases, coverage_cases, fuzz_broker
from txbroker.client import Consumer, Message, Producer


async def test_fuzzed_broker_keeps_serving_and_answers_errors(broker_process, tmp_path):
    proc = broker_process()
    sent: list[str] = []
    stop = asyncio.Event()
    ready = asyncio.Event()

    async def healthy() -> None:
        # Keeps sending while the fuzzer runs, and a few more after it, so the store check below
        # always has messages from both sides of the fuzz run (bounded in count).
        async with Producer("healthy_pg", proc.namesrv_addr) as producer:
            i = 0
            while i < 400 and (not stop.is_set() or i < 20):
                r = await producer.send(Message("HealthyTopic", f"h{i}".encode(), keys=f"h{i}"))
                assert r.send_status.name == "SEND_OK"
                sent.append(f"h{i}")
                ready.set()
                i += 1
                await asyncio.sleep(0.01)

    task = asyncio.ensure_future(healthy())
    await asyncio.wait_for(ready.wait(), 30)
    sent_before = len(sent)
    try:
        stats = await fuzz_broker(proc.broker_addr, seed=11, rounds=300, max_message_size=256 * 1024)
    finally:
        sent_during = len(sent) - sent_before
        stop.set()
    await task
    assert proc.alive(), proc.log_tail()
    assert stats.ok, (stats.silent, stats.accepted, stats.left_open, stats.cases)
    assert not stats.unexplained, stats.unexplained  # every error answer says what was wrong
    assert len(stats.cases) >= 25, stats.cases
    # every bad topic was sent (and refused: nothing was accepted) in this run
    assert {t for (name, t) in stats.topics if name == "send-bad-topic"} == set(BAD_TOPICS)
    assert sent_during >= 1  # the healthy client was served while the fuzzer ran
    assert len(sent) >= 20

    # The store stays valid: after a SIGKILL the restarted broker serves every healthy message.
    proc.kill()
    proc.start()
    got: set[str] = set()
    consumer = Consumer("healthy_cg", proc.namesrv_addr, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("HealthyTopic")
    async with consumer:
        for _ in range(len(sent) * 2 + 50):
            msg = await consumer.poll(2.0)
            if msg is None:
                break
            got.add(msg.keys)
            if got >= set(sent):
                break
    assert got == set(sent)
    async with Producer("healthy_pg", proc.namesrv_addr) as producer:
        assert (await producer.send(Message("HealthyTopic", b"after"))).send_status.name == "SEND_OK"


def test_fuzz_cases_draw_per_case_and_cover_every_bad_topic() -> None:
    makers = {maker().name: maker for maker in cases(random.Random(5), 1024)}
    drawn = Counter(makers["send-bad-topic"]().topic for _ in range(2 * len(BAD_TOPICS)))
    assert drawn == dict.fromkeys(BAD_TOPICS, 2)
    assert {c.topic for c in coverage_cases() if c.name == "send-bad-topic"} == set(BAD_TOPICS)
    assert {"%RETRY%", "%RETRY%fuzz_no_such_group"} <= set(BAD_TOPICS)


@pytest.mark.parametrize("prop", PROPERTIES, ids=lambda p: p.__name__)
@pytest.mark.slow
def test_codec_property_small_run(prop):
    run(prop, 150)
