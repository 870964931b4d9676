"""The controller's state machine (``txbroker.cluster.replicas``), mirroring RocketMQ's
``ReplicasInfoManagerTest``: registration, the first election by request, elections when a
master's lease runs out (epoch, then offset, then priority and id), all replicas down and one
back, the in-sync set's fencing, and the persisted form.  Time is a manual clock."""

from __future__ import annotations

import pytest
from support.clock import ManualClock

from txbroker.cluster.replicas import (
    BrokerIdInvalid,
    BrokerNotAlive,
    ElectMasterFailed,
    FencedMasterEpoch,
    FencedSyncStateSetEpoch,
    InvalidMaster,
    InvalidReplicas,
    MasterStillExist,
    ReplicasInfo,
)
from txbroker.remoting.codes import ResponseCode

LEASE = 3.0
NAME = "broker-a"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def state(clock: ManualClock) -> ReplicasInfo:
    return ReplicasInfo(lease=LEASE, clock=clock)


def register(state: ReplicasInfo, *ids: int) -> None:
    for i in ids:
        state.register("DefaultCluster", NAME, i, f"127.0.0.1:{10911 + 10 * i}",
                       f"127.0.0.1:{10912 + 10 * i}")


def group_of_three(state: ReplicasInfo) -> None:
    """0 is master (epoch 1), 1 and 2 in the in-sync set."""
    register(state, 0, 1, 2)
    state.elect(NAME, 0)
    state.alter_sync_state_set(NAME, 0, 1, {0, 1, 2}, 1)


def test_register_creates_the_group_without_a_master(state: ReplicasInfo) -> None:
    register(state, 0, 1)
    view = state.replica_info(NAME)
    assert view.master_broker_id is None and view.master_epoch == 0
    assert view.sync_state_set == frozenset() and view.sync_state_set_epoch == 0
    assert state.replicas(NAME) == {0: ("127.0.0.1:10911", "127.0.0.1:10912"),
                                    1: ("127.0.0.1:10921", "127.0.0.1:10922")}
    with pytest.raises(InvalidReplicas) as err:
        state.register("OtherCluster", NAME, 2, "h:1", "h:2")
    assert err.value.code == ResponseCode.CONTROLLER_INVALID_REPLICAS


def test_first_election_is_won_by_the_asking_broker(state: ReplicasInfo) -> None:
    register(state, 0, 1)
    view = state.elect(NAME, 0)
    assert (view.master_broker_id, view.master_address, view.master_ha_address) == \
        (0, "127.0.0.1:10911", "127.0.0.1:10912")
    assert view.master_epoch == 1 and view.sync_state_set == {0} and view.sync_state_set_epoch == 1


def test_no_scan_election_before_the_first_one(state: ReplicasInfo, clock: ManualClock) -> None:
    """A slave alone never becomes master of a group nobody started as master."""
    register(state, 1)
    clock.advance(LEASE * 2)
    assert state.scan() == []
    assert state.replica_info(NAME).master_epoch == 0


def test_elect_master_old_master_still_alive(state: ReplicasInfo, clock: ManualClock) -> None:
    group_of_three(state)
    for _ in range(5):
        clock.advance(LEASE / 2)
        for i in (0, 1, 2):
            state.heartbeat(NAME, i, epoch=1)
        assert state.scan() == []
    with pytest.raises(MasterStillExist) as err:
        state.elect(NAME, 1)
    assert err.value.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    assert err.value.view.master_broker_id == 0
    assert state.replica_info(NAME).master_epoch == 1


def expire_master(state: ReplicasInfo, clock: ManualClock, beats: dict[int, dict]) -> None:
    """The master goes silent; the others heartbeat with ``beats[id]`` until its lease ends."""
    clock.advance(LEASE / 2)
    for i, values in beats.items():
        state.heartbeat(NAME, i, **values)
    clock.advance(LEASE / 2 + 0.01)
    for i, values in beats.items():
        state.heartbeat(NAME, i, **values)


def test_elect_master_prefer_higher_epoch(state: ReplicasInfo, clock: ManualClock) -> None:
    group_of_three(state)
    expire_master(state, clock, {1: {"epoch": 1, "max_offset": 100},
                                 2: {"epoch": 2, "max_offset": 50}})
    [view] = state.scan()
    assert view.master_broker_id == 2
    assert view.master_epoch == 2 and view.sync_state_set == {2} and view.sync_state_set_epoch == 3


def test_elect_master_prefer_higher_offset_when_epoch_equals(state: ReplicasInfo,
                                                             clock: ManualClock) -> None:
    group_of_three(state)
    expire_master(state, clock, {1: {"epoch": 1, "max_offset": 100},
                                 2: {"epoch": 1, "max_offset": 150}})
    [view] = state.scan()
    assert view.master_broker_id == 2


@pytest.mark.parametrize(("priorities", "winner"), [({}, 1), ({2: 1}, 2), ({1: 5, 2: 5}, 1)])
def test_elect_master_prefer_priority_then_lower_id(state: ReplicasInfo, clock: ManualClock,
                                                    priorities: dict[int, int], winner: int) -> None:
    """Same epoch and offset: the lower election priority wins, then the lower broker id."""
    group_of_three(state)
    expire_master(state, clock, {i: {"epoch": 1, "max_offset": 100,
                                     "priority": priorities.get(i)} for i in (1, 2)})
    assert state.scan()[0].master_broker_id == winner


def test_a_slave_outside_the_sync_state_set_is_never_elected(state: ReplicasInfo,
                                                             clock: ManualClock) -> None:
    register(state, 0, 1)
    state.elect(NAME, 0)  # set = {0}: slave 1 never caught up
    expire_master(state, clock, {1: {"epoch": 1, "max_offset": 10**6}})
    assert state.scan() == []  # nobody to elect: nothing changes
    with pytest.raises(ElectMasterFailed):
        state.elect(NAME, 1)
    view = state.replica_info(NAME)
    assert (view.master_broker_id, view.master_epoch, view.sync_state_set) == (0, 1, {0})


def test_an_election_with_no_candidate_changes_nothing(state: ReplicasInfo,
                                                        clock: ManualClock) -> None:
    """The controller cut off from every broker: leases run out, nobody can be elected, so
    the master keeps its id and epoch and its next heartbeat simply renews it."""
    group_of_three(state)
    before = state.replica_info(NAME)
    for _ in range(3):
        clock.advance(LEASE)
        assert state.scan() == []
    assert state.replica_info(NAME) == before
    state.heartbeat(NAME, 0, epoch=1)  # the cut heals: not fenced, alive again
    state.heartbeat(NAME, 1, epoch=1)
    assert state.scan() == [] and state.replica_info(NAME) == before
    assert state.is_alive(NAME, 0)


def test_all_replicas_shutdown_and_restart(state: ReplicasInfo, clock: ManualClock) -> None:
    group_of_three(state)
    clock.advance(LEASE + 0.01)  # everybody silent
    assert state.scan() == []
    view = state.replica_info(NAME)
    assert view.master_broker_id == 0 and view.master_epoch == 1
    assert view.sync_state_set == {0, 1, 2}
    # a replica that is not in the set comes back first: nothing happens
    state.register("DefaultCluster", NAME, 3, "h:3", "h:4")
    assert state.scan() == []
    # a set member other than the master comes back: it is elected
    state.heartbeat(NAME, 1, epoch=1)
    [view] = state.scan()
    assert view.master_broker_id == 1 and view.master_epoch == 2 and view.sync_state_set == {1}


def test_old_master_back_is_told_the_new_master_and_fenced(state: ReplicasInfo,
                                                           clock: ManualClock) -> None:
    group_of_three(state)
    expire_master(state, clock, {1: {"epoch": 1}, 2: {"epoch": 1}})
    assert state.scan()[0].master_broker_id == 1
    view = state.register("DefaultCluster", NAME, 0, "127.0.0.1:10911", "127.0.0.1:10912")
    assert view.master_broker_id == 1 and view.master_epoch == 2
    with pytest.raises(FencedMasterEpoch) as err:
        state.heartbeat(NAME, 0, epoch=1)
    assert err.value.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
    assert err.value.view.master_broker_id == 1
    with pytest.raises(FencedMasterEpoch):
        state.alter_sync_state_set(NAME, 0, 1, {0}, 1)
    assert state.heartbeat(NAME, 0, epoch=2).master_broker_id == 1


def test_alter_sync_state_set_fencing(state: ReplicasInfo, clock: ManualClock) -> None:
    register(state, 0, 1, 2)
    state.elect(NAME, 0)
    assert state.alter_sync_state_set(NAME, 0, 1, {0, 1}, 1) == 2
    with pytest.raises(FencedSyncStateSetEpoch) as err:
        state.alter_sync_state_set(NAME, 0, 1, {0, 1, 2}, 1)  # built on the old set
    assert err.value.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    with pytest.raises(FencedMasterEpoch):
        state.alter_sync_state_set(NAME, 0, 0, {0, 1, 2}, 2)
    with pytest.raises(InvalidMaster) as err:
        state.alter_sync_state_set(NAME, 1, 1, {0, 1, 2}, 2)
    assert err.value.code == ResponseCode.CONTROLLER_INVALID_MASTER
    with pytest.raises(InvalidReplicas):
        state.alter_sync_state_set(NAME, 0, 1, {1, 2}, 2)  # omits the master
    with pytest.raises(InvalidReplicas):
        state.alter_sync_state_set(NAME, 0, 1, {0, 7}, 2)  # not registered
    clock.advance(LEASE / 2)
    state.heartbeat(NAME, 0, epoch=1)
    state.heartbeat(NAME, 1, epoch=1)
    clock.advance(LEASE / 2 + 0.01)
    with pytest.raises(BrokerNotAlive) as err:
        state.alter_sync_state_set(NAME, 0, 1, {0, 1, 2}, 2)  # 2 is silent
    assert err.value.code == ResponseCode.CONTROLLER_BROKER_NOT_ALIVE
    view = state.replica_info(NAME)
    assert view.sync_state_set == {0, 1} and view.sync_state_set_epoch == 2


def test_requests_for_unknown_brokers_are_refused(state: ReplicasInfo) -> None:
    for call in (lambda: state.replica_info("nope"), lambda: state.heartbeat(NAME, 0),
                 lambda: state.elect(NAME, 0)):
        with pytest.raises(InvalidReplicas):
            call()
    register(state, 0)
    with pytest.raises(InvalidReplicas, match="id 5 is not registered"):
        state.heartbeat(NAME, 5)


def test_designated_election(state: ReplicasInfo, clock: ManualClock) -> None:
    """A designated replica is elected only once the master's lease has run out: promoted
    at once, it would take writes while the old master still may (two masters)."""
    group_of_three(state)
    with pytest.raises(MasterStillExist):
        state.elect(NAME, 0, designate=True)
    with pytest.raises(MasterStillExist, match="master id 0 is alive"):
        state.elect(NAME, 2, designate=True)
    assert state.replica_info(NAME).master_broker_id == 0
    clock.advance(LEASE * 1.01)
    state.heartbeat(NAME, 1, epoch=1)
    state.heartbeat(NAME, 2, epoch=1)
    view = state.elect(NAME, 2, designate=True)  # not 1, whom the scan would have chosen
    assert view.master_broker_id == 2 and view.master_epoch == 2


def test_a_longer_heartbeat_timeout_extends_that_broker_s_lease(state: ReplicasInfo,
                                                               clock: ManualClock) -> None:
    group_of_three(state)
    state.heartbeat(NAME, 0, epoch=1, timeout=LEASE * 3)
    clock.advance(LEASE * 2)
    state.heartbeat(NAME, 1, epoch=1)
    assert state.scan() == []
    clock.advance(LEASE * 1.01)
    state.heartbeat(NAME, 1, epoch=1)
    assert state.scan()[0].master_broker_id == 1


def test_serialize_round_trip(state: ReplicasInfo, clock: ManualClock) -> None:
    group_of_three(state)
    state.register("DefaultCluster", "broker-b", 0, "h:1", "")
    doc = state.to_json()
    loaded = ReplicasInfo.from_json(doc, lease=LEASE, clock=clock)
    assert loaded.to_json() == doc
    assert loaded.replica_info(NAME) == state.replica_info(NAME)
    # every loaded replica has one lease of grace, no more
    assert loaded.is_alive(NAME, 0)
    clock.advance(LEASE + 0.01)
    assert loaded.scan() == []  # every replica silent: nobody to elect, nothing changes
    with pytest.raises(ValueError, match="version"):
        ReplicasInfo.from_json({"version": 99, "groups": []})
    with pytest.raises(ValueError, match="malformed"):
        ReplicasInfo.from_json({"version": 1, "groups": [{"brokerName": "x"}]})


def test_an_identity_held_by_a_live_address_is_refused(state: ReplicasInfo,
                                                        clock: ManualClock) -> None:
    register(state, 0, 1)
    state.elect(NAME, 0)
    with pytest.raises(BrokerIdInvalid) as err:
        state.register("DefaultCluster", NAME, 0, "127.0.0.1:20911", "127.0.0.1:20912")
    assert err.value.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
    assert "127.0.0.1:10911" in err.value.remark
    with pytest.raises(BrokerIdInvalid):  # its heartbeats renew nothing either
        state.heartbeat(NAME, 0, epoch=1, address="127.0.0.1:20911")
    assert state.replicas(NAME)[0] == ("127.0.0.1:10911", "127.0.0.1:10912")
    # the holder's restart on its own address is accepted
    state.register("DefaultCluster", NAME, 0, "127.0.0.1:10911", "127.0.0.1:10912")
    # once the holder's lease ran out the id may move (the broker came back elsewhere)
    clock.advance(LEASE + 0.01)
    with pytest.raises(InvalidReplicas):
        state.heartbeat(NAME, 0, epoch=1, address="127.0.0.1:20911")
    state.register("DefaultCluster", NAME, 0, "127.0.0.1:20911", "127.0.0.1:20912")
    assert state.replicas(NAME)[0] == ("127.0.0.1:20911", "127.0.0.1:20912")
