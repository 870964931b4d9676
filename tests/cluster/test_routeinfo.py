"""The name server's tables (RouteInfoManager), mirroring RocketMQ's RouteInfoManagerNewTest:
registration of masters and slaves, role switches, unregistration, expiry, closed connections
and the DataVersion check.  Pure: a manual clock, channels are plain objects."""

from __future__ import annotations

from support.clock import ManualClock

from txbroker.cluster.routeinfo import RouteInfoManager
from txbroker.remoting.bodies import (
    DataVersion,
    TopicConfigData,
    TopicConfigSerializeWrapper,
)

CLUSTER = "DefaultCluster"
NAME = "broker-a"
MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:10921"
MASTER_HA = "127.0.0.1:10912"


def _wrapper(*topics: str, counter: int = 1) -> TopicConfigSerializeWrapper:
    return TopicConfigSerializeWrapper(DataVersion(1000, counter),
                                       {t: TopicConfigData(t, 8, 8) for t in topics})


def _manager(clock: ManualClock | None = None, expiry: float = 120.0) -> RouteInfoManager:
    return RouteInfoManager(clock=clock or ManualClock(), expiry=expiry)


def _register(m: RouteInfoManager, addr: str, broker_id: int, *topics: str, name: str = NAME,
              channel: object = None, counter: int = 1, ha: str = "") -> object:
    return m.register(CLUSTER, addr, name, broker_id, ha or addr, _wrapper(*topics, counter=counter),
                      channel)


def test_register_slave_broker_learns_its_master() -> None:
    m = _manager()
    assert _register(m, MASTER, 0, "T", ha=MASTER_HA).master_addr is None
    result = _register(m, SLAVE, 1, "T")
    assert (result.master_addr, result.ha_server_addr) == (MASTER, MASTER_HA)
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {0: MASTER, 1: SLAVE}


def test_register_only_slave_broker_sets_no_route() -> None:
    m = _manager()
    result = _register(m, SLAVE, 1, "T")
    assert result.master_addr is None
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {1: SLAVE}
    assert m.pickup_route("T") is None  # slaves' topic tables are ignored
    assert m.topic_list() == []


def test_switch_broker_role_replaces_the_entry_under_the_old_id() -> None:
    m = _manager()
    _register(m, MASTER, 0, "T")
    _register(m, SLAVE, 1, "T")
    # The slave is promoted (same address, id 0); the old master comes back as id 1.
    _register(m, SLAVE, 0, "T", counter=2)
    _register(m, MASTER, 1, "T")
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {0: SLAVE, 1: MASTER}
    assert m.pickup_route("T").broker_datas[0].broker_addrs == {0: SLAVE, 1: MASTER}


def test_unregister_master_keeps_the_group_while_a_slave_remains() -> None:
    m = _manager()
    _register(m, MASTER, 0, "T")
    _register(m, SLAVE, 1, "T")
    m.unregister(CLUSTER, MASTER, NAME, 0)
    route = m.pickup_route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: SLAVE}
    assert MASTER not in m.live
    m.unregister(CLUSTER, SLAVE, NAME, 1)
    assert m.pickup_route("T") is None
    assert m.cluster_info().broker_addr_table == {} and m.cluster_info().cluster_addr_table == {}


def test_unregister_of_a_former_address_keeps_its_successor() -> None:
    m = _manager()
    _register(m, MASTER, 0, "T")
    _register(m, SLAVE, 0, "T", counter=2)  # another broker took id 0
    m.unregister(CLUSTER, MASTER, NAME, 0)
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {0: SLAVE}


def test_pickup_topic_route_data_with_slave_and_two_groups() -> None:
    m = _manager()
    _register(m, MASTER, 0, "T", "OnlyA")
    _register(m, SLAVE, 1, "T")
    _register(m, "127.0.0.1:20911", 0, "T", name="broker-b")
    route = m.pickup_route("T")
    assert [(b.broker_name, b.broker_addrs) for b in route.broker_datas] == [
        (NAME, {0: MASTER, 1: SLAVE}), ("broker-b", {0: "127.0.0.1:20911"})]
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
            for q in route.queue_datas] == [(NAME, 8, 8, 6), ("broker-b", 8, 8, 6)]
    assert [b.broker_name for b in m.pickup_route("OnlyA").broker_datas] == [NAME]
    assert m.pickup_route("Missing") is None
    assert m.topic_list() == ["OnlyA", "T"]
    assert m.cluster_info().cluster_addr_table == {CLUSTER: ["broker-a", "broker-b"]}


def test_scan_not_active_broker_drops_silent_brokers_only() -> None:
    clock = ManualClock()
    m = _manager(clock, expiry=120.0)
    chan_a, chan_b = object(), object()
    _register(m, MASTER, 0, "T", channel=chan_a)
    clock.advance(60)
    _register(m, "127.0.0.1:20911", 0, "T", name="broker-b", channel=chan_b)
    clock.advance(60)
    assert m.expire() == []  # exactly 120 s is not yet past
    clock.advance(1)
    assert m.expire() == [chan_a]
    assert [b.broker_name for b in m.pickup_route("T").broker_datas] == ["broker-b"]
    m.touch("127.0.0.1:20911")  # an unchanged QUERY_DATA_VERSION refreshes liveness
    clock.advance(119)
    assert m.expire() == []


def test_on_channel_destroy_drops_the_broker_of_that_connection() -> None:
    m = _manager()
    chan_master, chan_slave = object(), object()
    _register(m, MASTER, 0, "T", channel=chan_master)
    _register(m, SLAVE, 1, "T", channel=chan_slave)
    assert m.on_connection_closed(object()) is None
    assert m.on_connection_closed(chan_master) == MASTER
    assert m.pickup_route("T").broker_datas[0].broker_addrs == {1: SLAVE}
    # A later registration over a new connection: the old one closing changes nothing.
    chan_new = object()
    _register(m, SLAVE, 1, "T", channel=chan_new)
    assert m.on_connection_closed(chan_slave) is None
    assert m.on_connection_closed(chan_new) == SLAVE
    assert m.pickup_route("T") is None and m.topic_list() == []


def test_is_broker_topic_config_changed_and_queue_data_applied_on_change_only() -> None:
    m = _manager()
    assert m.is_topic_config_changed(MASTER, DataVersion(1000, 1))  # unknown broker
    _register(m, MASTER, 0, "T")
    assert not m.is_topic_config_changed(MASTER, DataVersion(1000, 1))
    assert m.is_topic_config_changed(MASTER, DataVersion(1000, 2))
    assert m.is_topic_config_changed(MASTER, DataVersion(1001, 1))
    # Same version, new table: not applied (the version says nothing changed).
    m.register(CLUSTER, MASTER, NAME, 0, MASTER, TopicConfigSerializeWrapper(
        DataVersion(1000, 1), {"New": TopicConfigData("New", 2, 2)}))
    assert m.pickup_route("New") is None
    # A new version is applied; topics missing from it are kept, as in RocketMQ.
    m.register(CLUSTER, MASTER, NAME, 0, MASTER, TopicConfigSerializeWrapper(
        DataVersion(1000, 2), {"New": TopicConfigData("New", 2, 2)}))
    assert m.pickup_route("New").queue_datas[0].write_queue_nums == 2
    assert m.pickup_route("T") is not None


def test_a_dropped_broker_is_down_until_it_registers_again() -> None:
    """The name server remembers whom it dropped, why and since when (wall clock), so
    ``txbroker status`` lists a dead member as down instead of forgetting it; registering
    again clears it."""
    wall = [1_000.0]
    clock = ManualClock()
    m = RouteInfoManager(clock=clock, expiry=120.0, wall=lambda: wall[0])
    master_conn, slave_conn = object(), object()
    _register(m, MASTER, 0, "T", channel=master_conn)
    _register(m, SLAVE, 1, "T", channel=slave_conn)
    assert m.brokers_down() == []
    wall[0] = 1_010.0
    assert m.on_connection_closed(master_conn) == MASTER
    [down] = m.brokers_down()
    assert down.to_json() == {"cluster": CLUSTER, "brokerName": NAME, "brokerId": 0,
                              "address": MASTER, "since": 1_010_000, "why": "connection closed"}
    clock.advance(121.0)
    wall[0] = 1_131.0
    m.expire()  # the slave fell silent too
    assert [(d.address, d.why) for d in m.brokers_down()] == [
        (MASTER, "connection closed"), (SLAVE, "silent for 121 s")]
    _register(m, MASTER, 0, "T")  # back: no longer down
    assert [d.address for d in m.brokers_down()] == [SLAVE]
    m.unregister(CLUSTER, MASTER, NAME, 0)
    assert [(d.address, d.why) for d in m.brokers_down()] == [
        (SLAVE, "silent for 121 s"), (MASTER, "stopped (unregistered)")]
    wall[0] += 24 * 3600 + 1  # remembered for a day
    assert m.brokers_down() == []


def test_brokers_remembered_as_down_are_bounded() -> None:
    m = _manager()
    for i in range(300):
        conn = object()
        _register(m, f"127.0.0.1:{20000 + i}", 0, "T", name=f"g{i}", channel=conn)
        m.on_connection_closed(conn)
    down = m.brokers_down()
    assert len(down) == 256 and down[0].address == "127.0.0.1:20044"


def _register_epoch(m: RouteInfoManager, addr: str, broker_id: int, epoch: int) -> object:
    wrapper = TopicConfigSerializeWrapper(DataVersion(1000, 1, epoch), {"T": TopicConfigData("T", 8, 8)})
    return m.register(CLUSTER, addr, NAME, broker_id, addr, wrapper, None)


def test_a_late_registration_of_a_demoted_master_does_not_replace_its_successor() -> None:
    """After a failover the old master's id-0 registration, sent before it learned of its
    demotion, arrives after the new master's: the newer epoch keeps id 0, and the old
    master's move to a slave id removes nothing of the new master's."""
    m = _manager()
    _register_epoch(m, MASTER, 0, 1)
    _register_epoch(m, SLAVE, 1, 1)
    _register_epoch(m, SLAVE, 0, 2)           # the slave is promoted under epoch 2
    _register_epoch(m, MASTER, 0, 1)          # late: the old master, still under epoch 1
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {0: SLAVE}
    _register_epoch(m, MASTER, 1, 2)          # it learned: a slave now
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {0: SLAVE, 1: MASTER}
    assert m.pickup_route("T").broker_datas[0].broker_addrs[0] == SLAVE
    # a newer epoch does take id 0 (the old master elected again), and equal epochs (classic
    # mode, or a broker that sends none) replace as RocketMQ 4 does
    _register_epoch(m, MASTER, 0, 3)
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs[0] == MASTER
    _register(m, SLAVE, 0, "T")
    _register(m, MASTER, 0, "T")
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs[0] == MASTER


def test_an_older_master_takes_id_0_once_the_holder_is_gone() -> None:
    clock = ManualClock()
    m = _manager(clock, expiry=10.0)
    _register_epoch(m, SLAVE, 0, 2)
    clock.advance(11.0)
    m.expire()
    _register_epoch(m, MASTER, 0, 1)
    assert m.cluster_info().broker_addr_table[NAME].broker_addrs == {0: MASTER}


def test_data_version_carries_the_state_version_without_changing_identity() -> None:
    v = DataVersion(1000, 7, 3)
    assert DataVersion.decode(v.encode()).state_version == 3
    assert v == DataVersion(1000, 7) and b"stateVersion" not in DataVersion(1000, 7).encode()
