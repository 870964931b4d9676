"""The classic consumer-group state machine (GroupCoordinator) driven directly, with a manual
clock: deadlines are applied by ``tick()`` after the clock is moved, nothing sleeps."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.groups import (
    COMPLETING,
    DEAD,
    EMPTY,
    PREPARING,
    STABLE,
    GroupCoordinator,
)
from txbroker.service.metrics import BrokerMetrics

G = "orders"
SESSION_MS = 10_000
REBALANCE_MS = 20_000
DELAY = 3.0          # the default initial rebalance delay


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> BrokerMetrics:
    return BrokerMetrics()


@pytest.fixture
def coord(broker_config: BrokerConfig, clock: Clock, metrics: BrokerMetrics) -> GroupCoordinator:
    return GroupCoordinator(broker_config, metrics, clock=clock)


def join(coord: GroupCoordinator, member_id: str = "", *, group: str = G, version: int = 5,
         protocols=(("range", b"m-range"),), session_ms: int = SESSION_MS,
         rebalance_ms: int = REBALANCE_MS, protocol_type: str = "consumer",
         client_id: str = "cli") -> asyncio.Task:
    return asyncio.ensure_future(coord.join(
        group, member_id, client_id=client_id, api_version=version,
        session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
        protocol_type=protocol_type, protocols=list(protocols)))


async def answer(task: asyncio.Task) -> dict:
    return await asyncio.wait_for(task, 2)


async def parked(task: asyncio.Task) -> None:
    """Let the task run up to its parking point and check it is parked."""
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()


async def new_member(coord: GroupCoordinator, **kw) -> tuple[str, asyncio.Task]:
    """A v5 member: MEMBER_ID_REQUIRED, then the rejoin with the given id (parked)."""
    first = await answer(join(coord, **kw))
    assert first["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
    task = join(coord, first["member_id"], **kw)
    await parked(task)
    return first["member_id"], task


async def stable_group(coord: GroupCoordinator, clock: Clock, n: int) -> list[str]:
    """A group of ``n`` members at generation 1, synced (Stable)."""
    joined = [await new_member(coord) for _ in range(n)]
    clock.now += DELAY
    coord.tick()
    answers = [await answer(t) for _, t in joined]
    leader = answers[0]["leader"]
    syncs = [asyncio.ensure_future(coord.sync(G, 1, mid, [] if mid != leader else
                                              [(m, m.encode()) for m, _ in joined]))
             for mid, _ in joined]
    for s in syncs:
        assert (await answer(s))["error_code"] == ErrorCode.NONE
    assert coord.groups[G].state == STABLE
    return [mid for mid, _ in joined]


# --- JoinGroup validation --------------------------------------------------------------------
async def test_empty_group_id_is_invalid(coord):
    assert (await answer(join(coord, group="")))["error_code"] == ErrorCode.INVALID_GROUP_ID


@pytest.mark.parametrize("session_ms", [5999, 1_800_001])
async def test_session_timeout_outside_bounds(coord, session_ms):
    got = await answer(join(coord, session_ms=session_ms))
    assert got["error_code"] == ErrorCode.INVALID_SESSION_TIMEOUT
    assert G not in coord.groups or not coord.groups[G].members


async def test_inconsistent_protocol_type_or_protocols(coord, clock):
    await stable_group(coord, clock, 1)
    wrong_type = await answer(join(coord, "", protocol_type="connect"))
    assert wrong_type["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    disjoint = await answer(join(coord, "", protocols=[("sticky", b"")]))
    assert disjoint["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    no_protocols = await answer(join(coord, "", group="other", protocols=[]))
    assert no_protocols["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


async def test_v4_empty_member_id_gets_member_id_required(coord):
    got = await answer(join(coord, client_id="app-1"))
    assert got["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
    assert got["member_id"].startswith("app-1-") and len(got["member_id"]) == len("app-1-") + 36
    group = coord.groups[G]
    assert got["member_id"] in group.pending and not group.members and group.state == EMPTY


async def test_pending_member_id_lapses_after_session_timeout(coord, clock):
    mid = (await answer(join(coord)))["member_id"]
    clock.now += SESSION_MS / 1000
    coord.tick()
    assert G not in coord.groups  # only a handed-out id, never used: nothing is kept
    got = await answer(join(coord, mid))
    assert got["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID


async def test_v3_empty_member_id_joins_directly(coord, clock):
    task = join(coord, version=3, client_id="old")
    await parked(task)
    clock.now += DELAY
    coord.tick()
    got = await answer(task)
    assert got["error_code"] == ErrorCode.NONE and got["member_id"].startswith("old-")
    assert got["generation_id"] == 1 and got["leader"] == got["member_id"]


async def test_unknown_member_id_is_refused(coord):
    got = await answer(join(coord, "nobody"))
    assert got["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID


# --- the first rebalance ---------------------------------------------------------------------
async def test_new_group_waits_the_initial_delay_then_answers_everyone(coord, clock):
    a, ta = await new_member(coord, protocols=[("range", b"A")])
    clock.now += 1.0
    coord.tick()
    assert not ta.done()                    # still inside the initial delay
    b, tb = await new_member(coord, protocols=[("range", b"B")])
    clock.now += DELAY - 0.5                # past a's delay, inside the one b extended
    coord.tick()
    assert not ta.done() and coord.groups[G].state == PREPARING
    clock.now += 0.5
    coord.tick()
    ra, rb = await answer(ta), await answer(tb)
    assert ra["generation_id"] == rb["generation_id"] == 1
    assert ra["leader"] == rb["leader"] == a and ra["protocol_name"] == "range"
    assert ra["members"] == [{"member_id": a, "group_instance_id": None, "metadata": b"A"},
                             {"member_id": b, "group_instance_id": None, "metadata": b"B"}]
    assert rb["members"] == []              # only the leader sees the members
    assert coord.groups[G].state == COMPLETING


async def test_protocol_is_the_common_one_most_members_prefer(coord, clock):
    prefs = [[("range", b""), ("roundrobin", b""), ("sticky", b"")],
             [("roundrobin", b""), ("range", b"")],
             [("sticky", b""), ("roundrobin", b""), ("range", b"")],
             [("roundrobin", b""), ("range", b"")]]
    tasks = [(await new_member(coord, protocols=p))[1] for p in prefs]
    clock.now += DELAY
    coord.tick()
    # common = {range, roundrobin}; first choices among them: range, rr, rr, rr
    assert {(await answer(t))["protocol_name"] for t in tasks} == {"roundrobin"}


# --- SyncGroup -------------------------------------------------------------------------------
async def test_followers_wait_for_the_leaders_assignment(coord, clock):
    (a, ta), (b, tb) = await new_member(coord), await new_member(coord)
    clock.now += DELAY
    coord.tick()
    gen = (await answer(ta))["generation_id"]
    await answer(tb)
    follower = asyncio.ensure_future(coord.sync(G, gen, b, []))
    await parked(follower)
    assert coord.heartbeat(G, gen, b) == ErrorCode.NONE     # CompletingRebalance -> NONE
    leader = await answer(asyncio.ensure_future(
        coord.sync(G, gen, a, [(a, b"for-a"), (b, b"for-b")])))
    assert leader == {"error_code": ErrorCode.NONE, "assignment": b"for-a"}
    assert await answer(follower) == {"error_code": ErrorCode.NONE, "assignment": b"for-b"}
    assert coord.groups[G].state == STABLE
    again = await answer(asyncio.ensure_future(coord.sync(G, gen, b, [])))
    assert again["assignment"] == b"for-b"


async def test_sync_errors(coord, clock):
    a, b = await stable_group(coord, clock, 2)
    sync = coord.sync
    assert (await sync("nogroup", 1, a, []))["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
    assert (await sync(G, 1, "stranger", []))["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
    assert (await sync(G, 7, a, []))["error_code"] == ErrorCode.ILLEGAL_GENERATION
    rejoin = join(coord, a)                                     # the leader rejoins
    await parked(rejoin)
    assert coord.groups[G].state == PREPARING
    assert (await sync(G, 1, b, []))["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS


async def test_parked_sync_learns_of_a_new_rebalance(coord, clock):
    (a, ta), (b, tb) = await new_member(coord), await new_member(coord)
    clock.now += DELAY
    coord.tick()
    await answer(ta), await answer(tb)
    follower = asyncio.ensure_future(coord.sync(G, 1, b, []))
    await parked(follower)
    assert coord.leave(G, a) == ErrorCode.NONE                  # the leader leaves first
    assert (await answer(follower))["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS


# --- Heartbeat -------------------------------------------------------------------------------
async def test_heartbeat_by_state(coord, clock):
    assert coord.heartbeat("nogroup", 0, "x") == ErrorCode.UNKNOWN_MEMBER_ID
    a, b = await stable_group(coord, clock, 2)
    assert coord.heartbeat(G, 1, a) == ErrorCode.NONE                   # Stable
    assert coord.heartbeat(G, 1, "x") == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(G, 2, a) == ErrorCode.ILLEGAL_GENERATION
    c, tc = await new_member(coord)                                     # a third member
    assert coord.groups[G].state == PREPARING
    assert coord.heartbeat(G, 1, a) == ErrorCode.REBALANCE_IN_PROGRESS
    for mid in (a, b, c):
        assert coord.leave(G, mid) == ErrorCode.NONE
    assert coord.groups[G].state == EMPTY
    assert coord.heartbeat(G, coord.groups[G].generation, a) == ErrorCode.UNKNOWN_MEMBER_ID
    # when a and b had left, c alone had rejoined: its join completed before it left too
    assert (await answer(tc))["generation_id"] == 2


# --- later rebalances ------------------------------------------------------------------------
async def test_rebalance_completes_once_every_member_rejoined(coord, clock):
    a, b = await stable_group(coord, clock, 2)
    c, tc = await new_member(coord)
    ta = join(coord, a)
    await parked(ta)
    assert not tc.done()                    # b has not rejoined yet
    tb = join(coord, b)                     # no clock move: completes on the last rejoin
    got = [await answer(t) for t in (ta, tb, tc)]
    assert {r["generation_id"] for r in got} == {2}
    assert got[0]["leader"] == a and [m["member_id"] for m in got[0]["members"]] == [a, b, c]


async def test_members_that_do_not_rejoin_are_dropped_at_the_rebalance_timeout(coord, clock):
    a, b = await stable_group(coord, clock, 2)
    ta = join(coord, a)                     # the leader rejoins: a rebalance
    await parked(ta)
    clock.now += 9.0
    assert coord.heartbeat(G, 1, b) == ErrorCode.REBALANCE_IN_PROGRESS   # b stays alive ...
    clock.now += REBALANCE_MS / 1000 - 9.0
    coord.tick()                                                        # ... but never rejoins
    got = await answer(ta)
    assert got["generation_id"] == 2 and got["leader"] == a
    assert [m["member_id"] for m in got["members"]] == [a]
    assert coord.heartbeat(G, 2, b) == ErrorCode.UNKNOWN_MEMBER_ID


async def test_stable_follower_rejoin_is_answered_from_the_current_generation(coord, clock):
    _a, b = await stable_group(coord, clock, 2)
    got = await answer(join(coord, b))
    assert got["generation_id"] == 1 and got["members"] == []
    assert coord.groups[G].state == STABLE


async def test_silent_member_expires_and_the_survivor_rebalances(coord, clock, metrics):
    a, _b = await stable_group(coord, clock, 2)
    assert metrics.kafka_groups._value.get() == 1
    for _ in range(2):
        clock.now += 4.0
        assert coord.heartbeat(G, 1, a) == ErrorCode.NONE
        coord.tick()
    assert len(coord.groups[G].members) == 2
    clock.now += 4.0                        # b silent for 12 s > its 10 s session
    assert coord.heartbeat(G, 1, a) == ErrorCode.NONE
    coord.tick()
    group = coord.groups[G]
    assert list(group.members) == [a] and group.state == PREPARING
    assert coord.heartbeat(G, 1, a) == ErrorCode.REBALANCE_IN_PROGRESS
    got = await answer(join(coord, a))      # the only member left: completes at once
    assert got["generation_id"] == 2 and got["leader"] == a


async def test_leave(coord, clock, metrics):
    assert coord.leave("nogroup", "x") == ErrorCode.UNKNOWN_MEMBER_ID
    a, b = await stable_group(coord, clock, 2)
    assert coord.leave(G, "x") == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.leave(G, b) == ErrorCode.NONE
    assert coord.groups[G].state == PREPARING and list(coord.groups[G].members) == [a]
    assert coord.leave(G, a) == ErrorCode.NONE
    group = coord.groups[G]
    assert group.state == EMPTY and not group.members and group.generation == 2
    assert metrics.kafka_groups._value.get() == 0
    pending = (await answer(join(coord)))["member_id"]
    assert coord.leave(G, pending) == ErrorCode.NONE and not group.pending


async def test_empty_group_rejoins_with_the_initial_delay(coord, clock):
    a, = await stable_group(coord, clock, 1)
    coord.leave(G, a)
    _b, tb = await new_member(coord)
    assert coord.groups[G].state == PREPARING
    clock.now += DELAY
    coord.tick()
    assert (await answer(tb))["generation_id"] == 3


# --- offset commit validation ----------------------------------------------------------------
async def test_validate_commit(coord, clock):
    v = coord.validate_commit
    assert v("nogroup", -1, "") == ErrorCode.NONE              # simple commit, no group
    assert v("nogroup", 3, "m") == ErrorCode.ILLEGAL_GENERATION
    a, b = await stable_group(coord, clock, 2)
    assert v(G, 1, a) == ErrorCode.NONE
    assert v(G, -1, "") == ErrorCode.UNKNOWN_MEMBER_ID          # members present: not simple
    assert v(G, 1, "x") == ErrorCode.UNKNOWN_MEMBER_ID
    assert v(G, 0, a) == ErrorCode.ILLEGAL_GENERATION
    ta = join(coord, a)
    await parked(ta)
    assert v(G, 1, b) == ErrorCode.NONE                        # PreparingRebalance: allowed
    tb = join(coord, b)
    await answer(ta), await answer(tb)
    assert coord.groups[G].state == COMPLETING
    assert v(G, 2, b) == ErrorCode.REBALANCE_IN_PROGRESS
    coord.leave(G, a), coord.leave(G, b)
    assert v(G, -1, "") == ErrorCode.NONE                      # Empty again


# --- closing, and the timer task -------------------------------------------------------------
async def test_close_answers_parked_requests(coord, clock):
    a, ta = await new_member(coord)
    await coord.close()
    got = await answer(ta)
    assert got["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert coord.groups[G].state == DEAD
    assert coord.heartbeat(G, 0, a) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert coord.validate_commit(G, -1, "") == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert (await answer(join(coord)))["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_started_coordinator_applies_its_deadlines_itself(broker_config, metrics):
    coord = GroupCoordinator(broker_config.replace(kafka_group_initial_rebalance_delay=0.05),
                             metrics)
    await coord.start()
    try:
        first = await answer(join(coord))
        got = await asyncio.wait_for(join(coord, first["member_id"]), 10)
        assert got["error_code"] == ErrorCode.NONE and got["generation_id"] == 1
    finally:
        await coord.close()


# --- the handlers over a real store (body dicts as the codec gives them) ---------------------
@pytest.fixture
async def api(broker_config, coord):
    from txbroker.service.kafka.group_api import group_handlers
    from txbroker.service.topics import TopicConfig, TopicManager
    from txbroker.store.message_store import MessageStore

    store = MessageStore(broker_config)
    store.open()
    topics = TopicManager(broker_config)
    await topics.create_or_update(TopicConfig("T", 2, 2))
    try:
        yield group_handlers(coord, store, topics, lambda group: ()), store
    finally:
        await store.close()


def ctx(api_key: int, version: int, client_id: str = "app"):
    from txbroker.service.kafka.context import KafkaRequestContext

    return KafkaRequestContext(api_key, version, 1, client_id, "127.0.0.1:1", 1)


def commit_body(group: str, partitions: list[dict], *, generation: int = -1,
                member: str = "", topic: str = "T") -> dict:
    return {"group_id": group, "generation_id_or_member_epoch": generation,
            "member_id": member, "retention_time_ms": -1,
            "topics": [{"name": topic, "partitions": partitions}]}


def errors(answer: dict) -> list[int]:
    return [p["error_code"] for t in answer["topics"] for p in t["partitions"]]


async def test_offset_commit_and_fetch_handlers(api):
    handlers, store = api
    commit, fetch = handlers[8], handlers[9]
    got = await commit(ctx(8, 3), commit_body("g", [
        {"partition_index": 0, "committed_offset": 7, "committed_metadata": "kept? no"},
        {"partition_index": 1, "committed_offset": 2, "committed_metadata": "x" * 4097},
        {"partition_index": 2, "committed_offset": 1, "committed_metadata": None},
    ]))
    assert errors(got) == [ErrorCode.NONE, ErrorCode.OFFSET_METADATA_TOO_LARGE,
                           ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert store.offsets.get("g", "T", 0) == 7 and store.offsets.get("g", "T", 1) is None
    got = await commit(ctx(8, 3), commit_body("g", [
        {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}], topic="nope"))
    assert errors(got) == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    got = await commit(ctx(8, 3), commit_body("g", [
        {"partition_index": 1, "committed_offset": -1, "committed_metadata": ""}]))
    assert errors(got) == [ErrorCode.INVALID_REQUEST]
    got = await commit(ctx(8, 3), commit_body("", [
        {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]))
    assert errors(got) == [ErrorCode.INVALID_GROUP_ID]
    got = await commit(ctx(8, 3), commit_body("g", [
        {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}], generation=4,
        member="m"))
    assert errors(got) == [ErrorCode.ILLEGAL_GENERATION]

    got = await fetch(ctx(9, 3), {"group_id": "g", "topics": [
        {"name": "T", "partition_indexes": [0, 1]}, {"name": "nope", "partition_indexes": [0]}]})
    assert got["error_code"] == ErrorCode.NONE
    assert [(t["name"], p["partition_index"], p["committed_offset"], p["metadata"])
            for t in got["topics"] for p in t["partitions"]] == [
        ("T", 0, 7, "kept? no"), ("T", 1, -1, ""), ("nope", 0, -1, "")]
    every = await fetch(ctx(9, 3), {"group_id": "g", "topics": None})
    assert every["topics"] == [{"name": "T", "partitions": [
        {"partition_index": 0, "committed_offset": 7, "metadata": "kept? no", "error_code": 0}]}]
    bad = await fetch(ctx(9, 3), {"group_id": "", "topics": None})
    assert bad["error_code"] == ErrorCode.INVALID_GROUP_ID


async def test_group_handlers_drive_the_coordinator(api, clock, coord):
    handlers, _ = api
    base = {"group_id": G, "session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": REBALANCE_MS,
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"meta"}]}
    first = await handlers[11](ctx(11, 5, "svc"), {**base, "member_id": ""})
    assert first["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
    assert first["member_id"].startswith("svc-")
    mid = first["member_id"]
    task = asyncio.ensure_future(handlers[11](ctx(11, 5, "svc"), {**base, "member_id": mid}))
    await parked(task)
    clock.now += DELAY
    coord.tick()
    joined = await answer(task)
    assert joined["members"] == [{"member_id": mid, "group_instance_id": None,
                                  "metadata": b"meta"}]
    synced = await handlers[14](ctx(14, 3), {"group_id": G, "generation_id": 1, "member_id": mid,
                                             "group_instance_id": None,
                                             "assignments": [{"member_id": mid,
                                                              "assignment": b"as"}]})
    assert synced == {"error_code": ErrorCode.NONE, "assignment": b"as"}
    beat = {"group_id": G, "generation_id": 1, "member_id": mid, "group_instance_id": None}
    assert await handlers[12](ctx(12, 3), beat) == {"error_code": ErrorCode.NONE}
    left = await handlers[13](ctx(13, 1), {"group_id": G, "member_id": mid})
    assert left == {"error_code": ErrorCode.NONE}
    assert await handlers[12](ctx(12, 3), beat) == {"error_code": ErrorCode.UNKNOWN_MEMBER_ID}


async def test_old_versions_reach_the_handlers_complete():
    """JoinGroup v0 and OffsetCommit v0 bodies get the fields they lack as Kafka reads them,
    before anything (the cluster routing, the handlers) looks at them; other versions pass
    untouched."""
    from txbroker.service.kafka.group_api import complete_old_versions

    seen: list[tuple[int, int, dict]] = []

    async def record(c, body):
        seen.append((c.api_key, c.api_version, body))
        return {}

    wrapped = complete_old_versions({11: record, 8: record, 14: record})
    join0 = {"group_id": G, "session_timeout_ms": 7000, "member_id": "", "protocol_type": "consumer",
             "protocols": []}
    await wrapped[11](ctx(11, 0), join0)
    await wrapped[11](ctx(11, 1), {**join0, "rebalance_timeout_ms": 9000})
    commit0 = {"group_id": G, "topics": []}
    await wrapped[8](ctx(8, 0), commit0)
    await wrapped[8](ctx(8, 1), {**commit0, "generation_id_or_member_epoch": 3, "member_id": "m"})
    assert wrapped[14] is record
    assert [(k, v, b.get("rebalance_timeout_ms"), b.get("generation_id_or_member_epoch"),
             b.get("member_id")) for k, v, b in seen] == [
        (11, 0, 7000, None, ""), (11, 1, 9000, None, ""), (8, 0, None, -1, ""), (8, 1, None, 3, "m")]
    assert "rebalance_timeout_ms" not in join0      # the caller's dict is left alone
