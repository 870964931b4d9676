"""The unmodified RocketMQ C++ client (rocketmq==0.4.4) producing to a real txbroker."""

from __future__ import annotations

import pytest
from compat_cpp import run_cpp

pytestmark = pytest.mark.needs_cpp

TOPIC = "CompatTopic"


def stored(broker, topic: str) -> list:
    """Every message of ``topic`` as the store holds it, across all queues."""
    out = []
    for qid in broker.store.queues().get(topic, []):
        res = broker.store.get(topic, qid, 0, 1000)
        out.extend(res.messages())
    return out


async def test_send_sync_round_trips_keys_tags_props_and_offset(broker, tmp_path):
    run = await run_cpp(tmp_path / "home", scenario="send_sync", namesrv=broker.namesrv_addr,
                        topic=TOPIC, group="PID_COMPAT", count=3, keys="KEY1 KEY2", tags="TagA",
                        props={"color": "red"}, body="hello txbroker")
    run.assert_clean()
    results = run.of("sent")
    assert len(results) == 3
    msgs = stored(broker, TOPIC)
    assert sorted(m.body for m in msgs) == [b"hello txbroker %d" % i for i in range(3)]
    by_uniq = {m.properties["UNIQ_KEY"]: m for m in msgs}
    for r in results:
        assert r["status"] == 0
        m = by_uniq[r["msg_id"]]  # the client reports its own UNIQ_KEY
        assert r["offset"] == m.queue_offset
        assert m.properties["KEYS"] == "KEY1 KEY2"
        assert m.properties["TAGS"] == "TagA"
        assert m.properties["color"] == "red"
