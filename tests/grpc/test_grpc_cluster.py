"""The gRPC endpoint on a cluster of two broker groups: one group's endpoint routes a topic to
both groups' masters, each at its own endpoint, and the unmodified 5.x client given only the
first endpoint sends and ends transactions on both."""

from __future__ import annotations

import pytest

from tests.grpc.conftest import grpc_endpoint
from tests.support.cluster import InProcessCluster, route
from tests.support.waiting import eventually
from txbroker.service.topics import TopicConfig

pytestmark = pytest.mark.slow
TOPIC = "GSpread"


def stored(broker, topic: str) -> int:
    return sum(broker.store.max_offset(topic, q) for q in range(2))


async def test_one_endpoint_routes_both_groups_and_the_client_uses_both(
        grpc_config, tmp_path, py5) -> None:
    async with InProcessCluster(grpc_config, tmp_path) as c:
        ns = await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-b")
        for broker in (a, b):
            await broker.topics.create_or_update(TopicConfig(TOPIC, 2, 2))

        async def both_routed() -> bool:
            got = await route(ns.addr, TOPIC)
            return got is not None and len(got.broker_datas) == 2

        await eventually(both_routed, msg="both groups routed")
        events = await py5("send", grpc_endpoint(a), TOPIC, 20)
        assert sum("sent" in e for e in events) == 20
        assert stored(a, TOPIC) > 0 and stored(b, TOPIC) > 0
        assert stored(a, TOPIC) + stored(b, TOPIC) == 20

        before = {x: stored(x, TOPIC) for x in (a, b)}
        await py5("tx", grpc_endpoint(a), TOPIC, 8, "--end", "commit", "--prefix", "t")
        assert a.tx.pending_count() == 0 and b.tx.pending_count() == 0
        committed = {x: stored(x, TOPIC) - before[x] for x in (a, b)}
        assert sum(committed.values()) == 8 and all(committed.values()), committed
