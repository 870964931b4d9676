"""The unmodified RocketMQ C++ client (rocketmq==0.4.4) producing to a real txbroker.

Each scenario runs the real client in a bounded subprocess against an in-process broker and
then checks what the broker stored and what the client was told.
"""

from __future__ import annotations

import zlib

import pytest
from compat_cpp import run_cpp

from txbroker.store.record import COMPRESSED_FLAG

pytestmark = pytest.mark.needs_cpp

TOPIC = "CompatTopic"


def stored(broker, topic: str) -> list:
    """Every message of ``topic`` as the store holds it, across all queues."""
    out = []
    for qid in broker.store.queues().get(topic, []):
        out.extend(broker.store.get(topic, qid, 0, 1000).messages())
    return out


async def test_send_sync_round_trips_keys_tags_props_and_offset(broker, tmp_path):
    run = await run_cpp(tmp_path / "home", scenario="send_sync", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="PID_COMPAT", count=6, keys="KEY1 KEY2", tags="TagA",
                        props={"color": "red"}, body="hello txbroker")
    run.assert_clean()
    results = run.of("sent")
    assert len(results) == 6
    msgs = stored(broker, TOPIC)
    assert sorted(m.body for m in msgs) == [b"hello txbroker %d" % i for i in range(6)]
    by_uniq = {m.properties["UNIQ_KEY"]: m for m in msgs}
    for r in results:
        assert r["status"] == 0  # SEND_OK
        m = by_uniq[r["msg_id"]]  # the client reports its own UNIQ_KEY
        # The broker's queue offset reaches the client only as a JSON string (quirk 3).
        assert r["offset"] == m.queue_offset
        assert m.properties["KEYS"] == "KEY1 KEY2"
        assert m.properties["TAGS"] == "TagA"
        assert m.properties["color"] == "red"
    # Several sends per queue, so a stuck offset of 0 would be caught.
    assert max(r["offset"] for r in results) >= 1


async def test_send_oneway_is_stored(broker, tmp_path):
    # The client's "one-way" sends carry flag 0 (quirk 1): the broker answers, the client drops it.
    run = await run_cpp(tmp_path / "home", scenario="send_oneway", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="PID_COMPAT", count=3, tags="TagO", body="oneway",
                        linger=1.0)
    run.assert_clean()
    assert len(run.of("sent")) == 3
    msgs = stored(broker, TOPIC)
    assert sorted(m.body for m in msgs) == [b"oneway %d" % i for i in range(3)]
    assert {m.tags for m in msgs} == {"TagO"}


async def test_send_batch_code10_with_batch_1_stores_each_entry(broker, tmp_path):
    # Batches arrive as SEND_MESSAGE (10) with batch="1" (quirk 4), not code 320.
    run = await run_cpp(tmp_path / "home", scenario="send_batch", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="PID_COMPAT", count=2, tags="TagB", body="batch",
                        batch_size=3)
    run.assert_clean()
    results = run.of("sent")
    assert [r["status"] for r in results] == [0, 0]
    msgs = stored(broker, TOPIC)
    assert sorted(m.body for m in msgs) == sorted(
        b"batch %d part %d" % (i, j) for i in range(2) for j in range(3))
    assert len({m.properties["UNIQ_KEY"] for m in msgs}) == 6  # each entry keeps its own id
    for m in msgs:
        i, j = m.body.decode().split()[1::2]
        assert m.keys == f"BK{i}-{j}"
        assert m.tags == "TagB"
    # A batch goes to one queue; the result carries the first entry's queue offset.
    first = {m.body: m for m in msgs}
    assert results[0]["offset"] == first[b"batch 0 part 0"].queue_offset
    assert results[1]["offset"] == first[b"batch 1 part 0"].queue_offset


async def test_send_orderly_goes_to_the_selected_queue(broker, tmp_path):
    # The wrapper's selector picks arg % queue count: 7 % 4 = 3.
    run = await run_cpp(tmp_path / "home", scenario="send_orderly", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="PID_COMPAT", count=3, arg=7, tags="TagS",
                        body="orderly")
    run.assert_clean()
    assert broker.store.queues()[TOPIC] == [3]
    msgs = stored(broker, TOPIC)
    assert [m.body for m in msgs] == [b"orderly %d" % i for i in range(3)]  # in order
    assert [m.queue_offset for m in msgs] == [0, 1, 2]
    assert [r["offset"] for r in run.of("sent")] == [0, 1, 2]


async def test_send_large_is_stored_compressed_and_intact(broker, tmp_path):
    run = await run_cpp(tmp_path / "home", scenario="send_large", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="PID_COMPAT", tags="TagL", body="large", size=6000)
    run.assert_clean()
    [m] = stored(broker, TOPIC)
    assert m.sys_flag & COMPRESSED_FLAG  # the client compressed it (>= 4 KiB) and said so
    assert zlib.decompress(m.body) == b"large:" + b"x" * 6000
    assert run.of("sent")[0]["offset"] == m.queue_offset
