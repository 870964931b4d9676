"""The SDK's pure cluster parts, no I/O: routes with several broker groups and slaves, where
reads go, the send fault tolerance on an injected clock, and suggestWhichBrokerId."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.client.delivery import DeliveryBuffer
from txbroker.client.errors import RouteError
from txbroker.client.faults import FaultTracker, not_available_ms
from txbroker.client.instance import ClientInstance
from txbroker.client.namesrv import NameServerClient, TopicRoute, pick_read_addr
from txbroker.client.pull import OwnedQueue, Puller
from txbroker.client.rebalance import MessageQueue, OffsetTracker
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.command import RemotingCommand

A0, A1, A2, B1, C0 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911", "10.0.1.2:10911", "10.0.2.1:10911"

# fastjson's form (unquoted numeric keys): broker-a has a master and two slaves, broker-b only a
# slave (its master is down), broker-c a master; broker-c's queues are read-only.
ROUTE = (b'{"brokerDatas":['
         b'{"brokerAddrs":{0:"' + A0.encode() + b'",2:"' + A2.encode() + b'",1:"' + A1.encode()
         + b'"},"brokerName":"broker-a","cluster":"C"},'
         b'{"brokerAddrs":{1:"' + B1.encode() + b'"},"brokerName":"broker-b","cluster":"C"},'
         b'{"brokerAddrs":{"0":"' + C0.encode() + b'"},"brokerName":"broker-c","cluster":"C"}],'
         b'"filterServerTable":{},"queueDatas":['
         b'{"brokerName":"broker-a","perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2},'
         b'{"brokerName":"broker-b","perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2},'
         b'{"brokerName":"broker-c","perm":4,"readQueueNums":1,"topicSysFlag":0,"writeQueueNums":1}]}')


def _names(queues: list[MessageQueue]) -> list[tuple[str, int]]:
    return [(q.broker_name, q.queue_id) for q in queues]


def test_route_keeps_every_address_and_skips_masterless_groups_for_writes() -> None:
    route = TopicRoute.parse("T", ROUTE)
    assert route.addrs == {"broker-a": {0: A0, 1: A1, 2: A2}, "broker-b": {1: B1}, "broker-c": {0: C0}}
    assert route.brokers == {"broker-a": A0, "broker-c": C0}  # masters only
    # broker-b has no master: no writable queue (RocketMQ skips it); broker-c is read-only
    assert _names(route.write_queues()) == [("broker-a", 0), ("broker-a", 1)]
    # every group with any address stays readable
    assert _names(route.read_queues()) == [("broker-a", 0), ("broker-a", 1), ("broker-b", 0),
                                           ("broker-b", 1), ("broker-c", 0)]


def test_read_addr_rules() -> None:
    group = {0: A0, 1: A1, 2: A2}
    assert pick_read_addr(group, 0) == A0
    assert pick_read_addr(group, 2) == A2  # the exact suggested id
    assert pick_read_addr(group, 7) == A0  # unknown id: the master
    assert pick_read_addr({1: A1, 2: A2}, 0) == A1  # master down: the lowest slave
    assert pick_read_addr({2: A2, 1: A1}, 5) == A1
    assert pick_read_addr({}, 0) is None
    # a master whose connection failed is passed over while a slave is listed ...
    assert pick_read_addr(group, 0, avoid={A0}) == A1
    assert pick_read_addr(group, 1, avoid={A1}) == A0
    # ... and used anyway when it is the only address
    assert pick_read_addr({0: A0}, 0, avoid={A0}) == A0


def test_name_server_client_addresses_after_a_route() -> None:
    ns = NameServerClient("127.0.0.1:9876", request_timeout=1.0, credentials=None)
    route = TopicRoute.parse("T", ROUTE)
    ns.groups.update(route.addrs)
    assert ns.broker_addr("broker-a") == A0
    with pytest.raises(RouteError, match="broker-b.*no master"):
        ns.broker_addr("broker-b")
    with pytest.raises(RouteError, match="broker-x.*not known"):
        ns.broker_addr("broker-x")
    assert ns.read_addr("broker-b", 0) == B1  # reading from a slave while the master is down
    assert ns.read_addr("broker-a", 1) == A1
    with pytest.raises(RouteError, match="broker-x"):
        ns.read_addr("broker-x")
    assert ns.offset_addrs("broker-a") == [A0, A1, A2]  # master first, then the slaves
    assert ns.offset_addrs("broker-b") == [B1]
    assert ns.is_master("broker-a", A0) and not ns.is_master("broker-a", A1)
    assert ns.broker_addrs == {"broker-a": A0, "broker-c": C0}
    assert ns.all_addrs() == {A0, A1, A2, B1, C0}
    # a failover: broker-b's slave became its master, and broker-a lost its master
    ns.groups.update({"broker-b": {0: B1}, "broker-a": {1: A1, 2: A2}})
    assert ns.broker_addr("broker-b") == B1
    with pytest.raises(RouteError, match="no master"):
        ns.broker_addr("broker-a")


def test_fault_back_off_table_is_rocketmq_5() -> None:
    assert [not_available_ms(x) for x in (0, 49, 100, 549, 550, 1800, 3000, 5000, 15000, 99999)] == \
        [0, 0, 0, 0, 2000, 5000, 6000, 10000, 30000, 30000]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


QUEUES = [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(2)]


def test_failed_broker_is_avoided_for_its_back_off_then_used_again() -> None:
    clock = Clock()
    faults = FaultTracker(clock=clock)
    faults.update("broker-a", 5.0)  # fast answers change nothing
    assert faults.items == {} and faults.available("broker-a")
    faults.update("broker-a", 3.0, isolation=True)  # a failure: 10 s back-off
    assert not faults.available("broker-a") and faults.available("broker-b")
    assert {faults.select(QUEUES, n, None).broker_name for n in range(8)} == {"broker-b"}
    clock.now += 9.9
    assert {faults.select(QUEUES, n, None).broker_name for n in range(8)} == {"broker-b"}
    clock.now += 0.1
    assert faults.available("broker-a")
    assert {faults.select(QUEUES, n, None).broker_name for n in range(8)} == {"broker-a", "broker-b"}
    # a slow answer (600 ms) keeps it out for 2 s, a fast one afterwards brings it back at once
    faults.update("broker-a", 600.0)
    assert not faults.available("broker-a")
    faults.update("broker-a", 10.0)
    assert faults.available("broker-a")


def test_selection_excludes_the_broker_that_just_failed_and_falls_back() -> None:
    clock = Clock()
    faults = FaultTracker(clock=clock)
    # the retry after a failure on broker-b goes to broker-a whatever the index
    assert {faults.select(QUEUES, n, "broker-b").broker_name for n in range(8)} == {"broker-a"}
    # both unavailable, broker-a unreachable (refused): the reachable one, not the last failed
    faults.update("broker-a", 1.0, isolation=True, reachable=False)
    faults.update("broker-b", 1.0, isolation=True)
    assert {faults.select(QUEUES, n, None).broker_name for n in range(8)} == {"broker-b"}
    # ... unless broker-b just failed: then any other broker, even an unreachable one
    assert {faults.select(QUEUES, n, "broker-b").broker_name for n in range(8)} == {"broker-a"}
    # one group only: it is used even right after failing (nothing else to try)
    only_a = [q for q in QUEUES if q.broker_name == "broker-a"]
    assert {faults.select(only_a, n, "broker-a").broker_name for n in range(4)} == {"broker-a"}
    # round robin within the chosen tier
    clock.now += 60
    assert [faults.select(QUEUES, n, None).queue_id for n in range(4)] == [0, 1, 0, 1]


def test_disabled_fault_tolerance_only_avoids_the_last_failed_broker() -> None:
    faults = FaultTracker(enabled=False, clock=Clock())
    faults.update("broker-a", 1.0, isolation=True)
    assert faults.items == {}
    assert {faults.select(QUEUES, n, None).broker_name for n in range(8)} == {"broker-a", "broker-b"}
    assert {faults.select(QUEUES, n, "broker-a").broker_name for n in range(8)} == {"broker-b"}


async def test_pull_follows_suggest_which_broker_id() -> None:
    instance = ClientInstance("127.0.0.1:9876")  # never started: no I/O
    instance.namesrv.groups.update({"broker-a": {0: A0, 1: A1}, "broker-b": {1: B1}})
    puller = Puller(instance, "G", DeliveryBuffer(8), batch_size=4, long_poll_timeout=1.0,
                    request_timeout=1.0, error_backoff=0.1)
    owned = OwnedQueue(MessageQueue("T", "broker-a", 0), A0, OffsetTracker(0))
    assert puller.pull_addr(owned) == A0
    answer = RemotingCommand(ResponseCode.PULL_NOT_FOUND, flag=1, ext_fields={
        "suggestWhichBrokerId": "1", "nextBeginOffset": "0", "minOffset": "0", "maxOffset": "0"})
    assert await puller._handle(owned, None, answer)
    assert owned.broker_id == 1 and puller.pull_addr(owned) == A1
    answer.ext_fields["suggestWhichBrokerId"] = "0"
    assert await puller._handle(owned, None, answer)
    assert owned.broker_id == 0 and puller.pull_addr(owned) == A0
    # a group whose master is down is pulled from its slave
    slave_only = OwnedQueue(MessageQueue("T", "broker-b", 0), B1, OffsetTracker(0))
    assert puller.pull_addr(slave_only) == B1
    # a master whose connection failed is passed over for a while (the route still lists it)
    puller.avoid[A0] = asyncio.get_running_loop().time() + 60
    assert puller.pull_addr(owned) == A1
    puller.avoid[A0] = asyncio.get_running_loop().time() - 1  # expired: back to the master
    assert puller.pull_addr(owned) == A0 and A0 not in puller.avoid
