"""The POP service on an in-process broker: receive/ack by receipt handle, redelivery with the
attempt + 1, change of invisibility, dead letters, FIFO locks, handles refused, bounds, long
polling, the POP/pull rule, and the state rebuilt from the POP log after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.client import Consumer
from txbroker.service.pop import PopError, PopErrorKind
from txbroker.service.pop.handles import Handle
from txbroker.store.record import PROPERTY_TAGS, Message
from txbroker.store.results import Fence

G = "GID_POP"
#: Short invisible times: the service allows down to this in these tests.
FAST = {"pop_min_invisible_ms": 100}


async def put(broker, topic: str, bodies: list[bytes], queue_id: int = 0,
              tag: str | None = None) -> None:
    await broker.topics.get_or_create(topic)
    props = {PROPERTY_TAGS: tag} if tag else {}
    for body in bodies:
        assert (await broker.store.put(Message(topic, queue_id, body, properties=props))).ok


async def pop_until(broker, want: int, timeout: float = 10.0, **kw) -> list:
    """Receive (long polling) until ``want`` messages came, bounded in time."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += await broker.pop.pop(G, poll_ms=500, **kw)
    return got


@pytest.fixture
async def fast_broker(broker_config):
    b = Broker(broker_config.replace(**FAST))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def test_pop_then_ack_each_message_once(broker) -> None:
    await put(broker, "TPop", [b"a", b"b", b"c"])
    got = await broker.pop.pop(G, "TPop", batch_size=10, invisible_ms=60_000)
    assert [p.message.body for p in got] == [b"a", b"b", b"c"]
    assert [p.attempt for p in got] == [1, 1, 1]
    assert len({p.handle for p in got}) == 3
    # In flight: nothing more to receive, and the consumer offset waits for the acks.
    assert await broker.pop.pop(G, "TPop", batch_size=10, invisible_ms=60_000) == []
    assert broker.store.offsets.get(G, "TPop", 0) == 0
    for p in got:
        await broker.pop.ack(G, p.handle, "TPop")
    assert broker.store.offsets.get(G, "TPop", 0) == 3
    assert broker.pop.state.inflight(G) == 0


async def test_unacked_message_comes_back_with_the_next_attempt(fast_broker) -> None:
    b = fast_broker
    await put(b, "TRedo", [b"x"])
    [first] = await b.pop.pop(G, "TRedo", invisible_ms=300)
    assert await b.pop.pop(G, "TRedo", invisible_ms=300) == []   # invisible now
    [again] = await pop_until(b, 1, topic="TRedo", invisible_ms=60_000)
    assert again.message.body == b"x" and again.attempt == 2
    with pytest.raises(PopError, match="stale") as exc:
        await b.pop.ack(G, first.handle)
    assert exc.value.kind is PopErrorKind.INVALID_HANDLE
    await b.pop.ack(G, again.handle)


async def test_change_invisible_gives_a_new_handle_and_moves_the_redelivery(fast_broker) -> None:
    b = fast_broker
    await put(b, "TCid", [b"y"])
    [p] = await b.pop.pop(G, "TCid", invisible_ms=300)
    longer = await b.pop.change_invisible(G, p.handle, 60_000)
    assert longer.handle != p.handle and longer.attempt == 1
    with pytest.raises(PopError, match="stale"):
        await b.pop.ack(G, p.handle)
    # Past the first invisible time: still invisible under the new one.
    assert await b.pop.pop(G, "TCid", invisible_ms=300, poll_ms=800) == []
    shorter = await b.pop.change_invisible(G, longer.handle, 200)
    [again] = await pop_until(b, 1, topic="TCid", invisible_ms=60_000)
    assert again.attempt == 2
    with pytest.raises(PopError, match="stale"):
        await b.pop.change_invisible(G, shorter.handle, 1000)
    await b.pop.ack(G, again.handle)


async def test_message_goes_to_the_dead_letter_topic_after_max_attempts(broker_config) -> None:
    b = Broker(broker_config.replace(max_reconsume_times=1, **FAST))  # 2 deliveries
    await b.start()
    try:
        await put(b, "TDead", [b"poison", b"fine"])
        got = await b.pop.pop(G, "TDead", batch_size=2, invisible_ms=200)
        await b.pop.ack(G, got[1].handle)
        [second] = await pop_until(b, 1, topic="TDead", invisible_ms=200)
        assert second.attempt == 2
        dlq = "%DLQ%" + G
        await eventually(lambda: b.store.max_offset(dlq, 0) == 1, msg="message in the DLQ")
        [dead] = b.store.get(dlq, 0, 0, 10).messages()
        assert dead.body == b"poison" and dead.properties["RETRY_TOPIC"] == "TDead"
        assert b.topics.get(dlq) is not None
        assert await b.pop.pop(G, "TDead", invisible_ms=200, poll_ms=500) == []
        with pytest.raises(PopError, match="not in flight"):
            await b.pop.ack(G, second.handle)
        assert b.store.offsets.get(G, "TDead", 0) == 2
    finally:
        await b.stop()


async def test_fifo_locks_the_queue_until_ack_and_redelivers_in_order(fast_broker) -> None:
    b = fast_broker
    await put(b, "TFifo", [b"m0", b"m1", b"m2", b"m3"])
    [m0] = await b.pop.pop(G, "TFifo", invisible_ms=60_000, fifo=True)
    assert m0.message.body == b"m0"
    # Locked: another consumer gets nothing, however long it waits ...
    assert await b.pop.pop(G, "TFifo", invisible_ms=60_000, fifo=True, poll_ms=300) == []
    # ... until the ack, which wakes a held FIFO receive.
    waiting = asyncio.create_task(b.pop.pop(G, "TFifo", batch_size=2, invisible_ms=300,
                                            fifo=True, poll_ms=10_000))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await b.pop.ack(G, m0.handle)
    batch = await asyncio.wait_for(waiting, 5)
    assert [p.message.body for p in batch] == [b"m1", b"m2"]
    # Not acked: the same two come back first, in order, with attempt 2; m3 only after them.
    again = await pop_until(b, 3, topic="TFifo", batch_size=3, invisible_ms=60_000, fifo=True)
    assert [(p.message.body, p.attempt) for p in again] == [(b"m1", 2), (b"m2", 2), (b"m3", 1)]


async def test_fifo_receive_retried_with_its_attempt_id_gets_the_same_messages(broker) -> None:
    await put(broker, "TAttempt", [b"a", b"b"])
    first = await broker.pop.pop(G, "TAttempt", batch_size=2, invisible_ms=60_000, fifo=True,
                                 attempt_id="try-1")
    retried = await broker.pop.pop(G, "TAttempt", batch_size=2, invisible_ms=60_000, fifo=True,
                                   attempt_id="try-1")
    assert [p.handle for p in retried] == [p.handle for p in first]
    assert await broker.pop.pop(G, "TAttempt", batch_size=2, invisible_ms=60_000, fifo=True,
                                attempt_id="try-2") == []


async def test_forged_stale_and_acked_handles_are_refused(broker) -> None:
    await put(broker, "THandle", [b"h"])
    [p] = await broker.pop.pop(G, "THandle", invisible_ms=60_000)
    h = p.handle.split(" ")
    cases = {
        "": "empty",
        "garbage": "not a receipt handle of this broker",
        "p1 zz 0 0 THandle": "malformed",
        Handle("THandle", 0, int(h[3]), 12345).encode(): "stale",
        Handle("THandle", 0, 99, 12345).encode(): "not in flight",
        Handle("TOther", 0, 0, 1).encode(): "not in flight",
    }
    for handle, reason in cases.items():
        with pytest.raises(PopError, match=reason) as exc:
            await broker.pop.ack(G, handle)
        assert exc.value.kind is PopErrorKind.INVALID_HANDLE
    with pytest.raises(PopError, match="not in flight"):
        await broker.pop.ack("GID_OTHER", p.handle)   # another group's handle
    with pytest.raises(PopError, match="for topic THandle"):
        await broker.pop.ack(G, p.handle, "TElse")
    await broker.pop.ack(G, p.handle)
    with pytest.raises(PopError, match="already acknowledged"):
        await broker.pop.ack(G, p.handle)
    with pytest.raises(PopError, match="already acknowledged"):
        await broker.pop.change_invisible(G, p.handle, 5000)


async def test_what_a_peer_may_ask_is_bounded(broker_config) -> None:
    b = Broker(broker_config.replace(pop_max_waiters=1, pop_max_inflight=2))
    await b.start()
    try:
        await put(b, "TBound", [b"1", b"2", b"3"])
        for kw, reason in (({"batch_size": 0}, "batch size 0"), ({"batch_size": 33}, "batch size 33"),
                           ({"invisible_ms": 10}, "invisible time 10 ms"),
                           ({"invisible_ms": 13 * 3600_000}, "is not in"),
                           ({"queue_id": 99}, "queue 99")):
            args = {"batch_size": 1, "invisible_ms": 60_000, **kw}
            with pytest.raises(PopError, match=reason) as exc:
                await b.pop.pop(G, "TBound", **args)
            assert exc.value.kind is PopErrorKind.BAD_REQUEST
        with pytest.raises(PopError, match="does not exist") as exc:
            await b.pop.pop(G, "TMissing", invisible_ms=60_000)
        assert exc.value.kind is PopErrorKind.TOPIC_NOT_FOUND
        with pytest.raises(PopError, match="system topic"):
            await b.pop.pop(G, "RMQ_SYS_POP_LOG", invisible_ms=60_000)
        got = await b.pop.pop(G, "TBound", batch_size=3, invisible_ms=60_000)
        assert len(got) == 2                      # the group's in-flight bound
        with pytest.raises(PopError, match="2 messages in flight") as exc:
            await b.pop.pop(G, "TBound", invisible_ms=60_000)
        assert exc.value.kind is PopErrorKind.TOO_MANY
        await b.pop.ack(G, got[0].handle)
        # One held receive at most: the second is refused while the first waits.
        await put(b, "TEmpty", [])
        held = asyncio.create_task(b.pop.pop("GID_W", "TEmpty", invisible_ms=60_000,
                                             poll_ms=10_000))
        await eventually(lambda: b.pop.held() == 1, msg="one receive held")
        with pytest.raises(PopError, match="already waiting") as exc:
            await b.pop.pop("GID_W2", "TEmpty", invisible_ms=60_000, poll_ms=10_000)
        assert exc.value.kind is PopErrorKind.TOO_MANY
        await put(b, "TEmpty", [b"wake"])
        assert [p.message.body for p in await asyncio.wait_for(held, 5)] == [b"wake"]
    finally:
        await b.stop()


async def test_long_polling_returns_when_a_message_arrives(broker) -> None:
    await put(broker, "TPoll", [])
    t0 = time.monotonic()
    waiting = asyncio.create_task(broker.pop.pop(G, "TPoll", invisible_ms=60_000,
                                                 poll_ms=20_000))
    await eventually(lambda: broker.pop.held() == 1, msg="receive held")
    await put(broker, "TPoll", [b"late"], queue_id=2)
    got = await asyncio.wait_for(waiting, 10)
    assert [p.message.body for p in got] == [b"late"] and time.monotonic() - t0 < 10
    # Nothing arrives: an empty answer at the end of the (short) poll.
    assert await broker.pop.pop(G, "TPoll", invisible_ms=60_000, poll_ms=200) == []


async def test_tag_filter_selects_messages(broker) -> None:
    await put(broker, "TTags", [b"a1"], tag="A")
    await put(broker, "TTags", [b"b1"], tag="B")
    await put(broker, "TTags", [b"a2"], tag="A")
    got = await broker.pop.pop(G, "TTags", batch_size=5, invisible_ms=60_000,
                               tags=frozenset({"A"}))
    assert [p.message.body for p in got] == [b"a1", b"a2"]


async def test_a_group_with_4x_pull_consumers_cannot_pop(broker) -> None:
    await put(broker, "TMixed", [b"m"])
    consumer = Consumer("GID_MIXED", broker.namesrv_addr, from_where="first",
                        long_poll_timeout=1.0, rebalance_interval=0.5)
    consumer.subscribe("TMixed")
    async with consumer:
        await eventually(lambda: broker.registry.consumer_ids("GID_MIXED"), msg="heartbeat")
        with pytest.raises(PopError, match="either by POP or by pull") as exc:
            await broker.pop.pop("GID_MIXED", "TMixed", invisible_ms=60_000)
        assert exc.value.kind is PopErrorKind.BAD_REQUEST


async def test_state_survives_a_restart_from_the_log_and_a_snapshot(broker_config) -> None:
    cfg = broker_config.replace(**FAST)
    b = Broker(cfg)
    await b.start()
    try:
        await put(b, "TKeep", [b"k0", b"k1", b"k2", b"k3"])
        got = await b.pop.pop(G, "TKeep", batch_size=2, invisible_ms=60_000)
        await b.pop.ack(G, got[0].handle)
        assert await b.pop.log.snapshot(b.pop.state)        # k1 in flight, cursor 2
        more = await b.pop.pop(G, "TKeep", batch_size=2, invisible_ms=60_000)   # after it
        await b.pop.ack(G, more[1].handle)                   # k3 acked, k2 in flight
        handles = {p.message.body: p.handle for p in got + more}
    finally:
        await b.stop()
    b = Broker(cfg)
    await b.start()
    try:
        # The handles of the messages in flight still work; the acked ones stay acked.
        assert await b.pop.pop(G, "TKeep", batch_size=4, invisible_ms=60_000) == []
        with pytest.raises(PopError, match="already acknowledged"):
            await b.pop.ack(G, handles[b"k3"])
        longer = await b.pop.change_invisible(G, handles[b"k1"], 200)
        [again] = await pop_until(b, 1, topic="TKeep", invisible_ms=60_000)
        assert (again.message.body, again.attempt) == (b"k1", 2)
        await b.pop.ack(G, again.handle)
        await b.pop.ack(G, handles[b"k2"])
        assert b.store.offsets.get(G, "TKeep", 0) == 4
        with pytest.raises(PopError, match="already acknowledged"):
            await b.pop.ack(G, longer.handle)
    finally:
        await b.stop()


async def test_a_receive_that_finds_nothing_leaves_no_state(broker) -> None:
    await put(broker, "TNothing", [])
    for i in range(50):
        assert await broker.pop.pop(f"GID_MADE_UP_{i}", "TNothing", invisible_ms=60_000) == []
    assert broker.pop.state.queues == {}
    assert all(broker.store.offsets.get(f"GID_MADE_UP_{i}", "TNothing", q) is None
               for i in range(50) for q in range(4))


async def test_invisibility_is_renewed_while_its_consumer_is_connected(fast_broker) -> None:
    b = fast_broker
    b.pop.owner_alive = lambda client_id: client_id == "connected"
    await put(b, "TRenew", [b"kept"], queue_id=0)
    await put(b, "TRenew", [b"back"], queue_id=1)
    [kept] = await b.pop.pop(G, "TRenew", queue_id=0, invisible_ms=300, renew_ms=20_000,
                             owner="connected")
    [back] = await b.pop.pop(G, "TRenew", queue_id=1, invisible_ms=300, renew_ms=20_000,
                             owner="gone")
    # Past several of its invisible times, the connected consumer's message stays away; the
    # other one, whose consumer left, comes back.
    got: list = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        got += await b.pop.pop(G, "TRenew", batch_size=2, invisible_ms=60_000, poll_ms=300)
    assert [(p.message.body, p.attempt) for p in got] == [(b"back", 2)]
    await b.pop.ack(G, kept.handle)          # the renewal kept its handle
    with pytest.raises(PopError, match="stale"):
        await b.pop.ack(G, back.handle)


async def test_a_change_of_invisibility_to_zero_gives_the_message_back_at_once(broker) -> None:
    """0 ms is a nack (the Node.js PushConsumer's for a failed message): the message is
    delivered again right away with attempt 2, while a receive still may not ask for 0."""
    await put(broker, "TNack", [b"again"])
    [p] = await broker.pop.pop(G, "TNack", invisible_ms=60_000)
    await broker.pop.change_invisible(G, p.handle, 0)
    [again] = await pop_until(broker, 1, topic="TNack", invisible_ms=60_000)
    assert (again.message.body, again.attempt) == (b"again", 2)
    with pytest.raises(PopError, match="invisible time 0 ms"):
        await broker.pop.pop(G, "TNack", invisible_ms=0)
    with pytest.raises(PopError, match="invisible time"):
        await broker.pop.change_invisible(G, again.handle, -1)


async def test_a_dead_letter_answered_outcome_unknown_is_not_put_there_again(broker_config) -> None:
    # The put to the dead-letter topic is stored, but its answer leaves after the write gate
    # went up (a lapsed lease): OUTCOME_UNKNOWN.  Counted as not stored, the message stayed in
    # flight and the client's retry put it in the dead-letter topic a second time.
    b = Broker(broker_config.replace(flush_mode="sync", **FAST))
    await b.start()
    try:
        await put(b, "TDlqOnce", [b"poison"])
        [msg] = await b.pop.pop(G, "TDlqOnce", invisible_ms=60_000)
        dlq = "%DLQ%" + G
        lifted: list[bool] = []

        def gate() -> Fence | None:
            if lifted or b.store.max_offset(dlq, 0) < 1:
                return None
            return Fence.LEASE_NOT_VALID

        b.store.set_write_gate(gate)
        with pytest.raises(PopError):  # not acknowledged: the client retries
            await b.pop.to_dead_letters(G, msg.handle)
        assert b.store.max_offset(dlq, 0) == 1
        lifted.append(True)
        with contextlib.suppress(PopError):  # the retry (refused: the message has left)
            await b.pop.to_dead_letters(G, msg.handle)
        assert b.store.max_offset(dlq, 0) == 1
    finally:
        b.store.set_write_gate(None)
        await b.stop()
