"""POP on a cluster of two broker groups: QueryAssignment from one endpoint names both groups'
masters, and the 5.x PushConsumer given only that endpoint consumes the messages of both."""

from __future__ import annotations

import pytest

from tests.grpc.conftest import grpc_endpoint
from tests.grpc.raw import client_metadata, stub
from tests.support.cluster import InProcessCluster, route
from tests.support.waiting import eventually
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.topics import TopicConfig

pytestmark = pytest.mark.slow
TOPIC = "GPopSpread"


async def test_push_consumer_given_one_endpoint_consumes_both_groups(
        grpc_config, tmp_path, py5, py5_consumer) -> None:
    async with InProcessCluster(grpc_config.replace(pop_fifo_groups="GID_SPREAD_FIFO"),
                                tmp_path) as c:
        ns = await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-b")
        for broker in (a, b):
            await broker.topics.create_or_update(TopicConfig(TOPIC, 2, 2))

        async def both_routed() -> bool:
            got = await route(ns.addr, TOPIC)
            return got is not None and len(got.broker_datas) == 2

        await eventually(both_routed, msg="both groups routed")
        async with stub(grpc_endpoint(a)) as (s, _):
            async def assignment(group: str) -> list[tuple[str, int, int]]:
                resp = await s.QueryAssignment(spb.QueryAssignmentRequest(
                    topic=pb.Resource(name=TOPIC), group=pb.Resource(name=group)),
                    metadata=client_metadata(), timeout=10)
                assert resp.status.code == pb.Code.OK, resp.status
                return sorted((x.message_queue.broker.name, x.message_queue.id,
                               x.message_queue.broker.endpoints.addresses[0].port)
                              for x in resp.assignments)

            assert await assignment("GID_SPREAD") == [("broker-a", -1, a.grpc_port),
                                                      ("broker-b", -1, b.grpc_port)]
            assert await assignment("GID_SPREAD_FIFO") == sorted(
                [("broker-a", q, a.grpc_port) for q in range(2)]
                + [("broker-b", q, b.grpc_port) for q in range(2)])
        await py5("send", grpc_endpoint(a), TOPIC, 20)
        events = await py5_consumer("push", grpc_endpoint(a), TOPIC, "GID_SPREAD", 20)
        assert {e["got"] for e in events if "got" in e} == {f"m-{i}" for i in range(20)}
        # Each group's master popped its own share.
        assert a.pop.state.queues and b.pop.state.queues
