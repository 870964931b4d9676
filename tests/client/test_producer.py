"""Producer against a real broker on port 0: sends, one-way, batches, retries, errors."""

from __future__ import annotations

import re

import pytest
from support.consuming import collect
from support.waiting import eventually

from txbroker.client import Consumer, Message, Producer, SendStatus
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientStateError, SendError
from txbroker.store.record import decode_offset_msg_id

HEX32 = re.compile(r"^[0-9A-F]{32}$")


async def test_send_then_consume_every_field(broker, namesrv) -> None:
    big = b"0123456789abcdef" * 1024  # 16 KiB: sent zlib-compressed
    async with Producer("PG_SEND", namesrv) as producer:
        r1 = await producer.send(Message("TSend", b"hello", tags="TagA", keys=["k1", "k2"],
                                         properties={"color": "red"}))
        r2 = await producer.send(Message("TSend", big, tags="TagB"))
    assert r1.send_status is SendStatus.SEND_OK
    assert HEX32.match(r1.msg_id) and r1.msg_id != r2.msg_id
    host, port, offset = decode_offset_msg_id(r1.offset_msg_id)
    assert f"{host}:{port}" == broker.broker_addr
    stored = broker.store.read(offset)
    assert stored.properties["UNIQ_KEY"] == r1.msg_id and stored.topic == "TSend"
    assert r1.queue_offset == 0 and r1.queue_id != r2.queue_id  # round robin over queues

    consumer = Consumer("CG_SEND", namesrv, from_where="first")
    consumer.subscribe("TSend")
    async with consumer:
        msgs = sorted(await collect(consumer, 2), key=lambda m: len(m.body))
    m1, m2 = msgs
    assert (m1.body, m1.tags, m1.keys, m1.key_list) == (b"hello", "TagA", "k1 k2", ["k1", "k2"])
    assert m1.properties["color"] == "red"
    assert (m1.msg_id, m1.offset_msg_id) == (r1.msg_id, r1.offset_msg_id)
    assert (m1.queue_id, m1.queue_offset, m1.commit_log_offset) == (r1.queue_id, r1.queue_offset, offset)
    assert m1.born_timestamp > 0 and m1.store_timestamp >= m1.born_timestamp - 1000
    assert m1.reconsume_times == 0 and m1.transaction_id is None
    assert m2.body == big and m2.tags == "TagB"  # decompressed


async def test_oneway_and_batch(broker, namesrv) -> None:
    async with Producer("PG_BATCH", namesrv) as producer:
        await producer.send_oneway(Message("TBatch", b"one-way"))
        result = await producer.send_batch([Message("TBatch", f"b{i}".encode(), keys=f"K{i}")
                                            for i in range(3)])
        with pytest.raises(ValueError, match="topic"):
            await producer.send_batch([Message("TBatch", b"x"), Message("Other", b"y")])
        with pytest.raises(ValueError, match="at least one"):
            await producer.send_batch([])
    ids = result.msg_id.split(",")
    assert len(ids) == 3 and all(HEX32.match(i) for i in ids)
    assert len(result.offset_msg_id.split(",")) == 3
    consumer = Consumer("CG_BATCH", namesrv, from_where="first")
    consumer.subscribe("TBatch")
    async with consumer:
        msgs = await collect(consumer, 4)
    assert sorted(m.body for m in msgs) == [b"b0", b"b1", b"b2", b"one-way"]
    batch = sorted((m for m in msgs if m.body != b"one-way"), key=lambda m: m.queue_offset)
    assert [m.msg_id for m in batch] == ids  # one queue, contiguous, in order
    assert len({m.queue_id for m in batch}) == 1


async def test_retry_on_another_queue_after_a_refusal(broker, namesrv) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TShrink", 8)
    async with Producer("PG_RETRY", namesrv) as producer:
        await producer.send(Message("TShrink", b"warm-up"))  # caches the 8-queue route
        async with AdminClient(namesrv) as admin:
            await admin.update_topic("TShrink", 1, force=True)
        # Whichever of the 8 cached queues is tried first, the broker refuses ids >= 1
        # (SYSTEM_ERROR); the retry refreshes the route and lands on queue 0.
        results = [await producer.send(Message("TShrink", f"m{i}".encode())) for i in range(4)]
    assert all(r.queue_id == 0 for r in results)


async def test_final_error_names_each_attempt_and_the_broker_code(broker, namesrv) -> None:
    async with Producer("PG_ERR", namesrv, retries=2) as producer:
        with pytest.raises(SendError) as info:
            await producer.send(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"forged"))
        err = info.value
        assert err.code == 16 and "forbidden" in err.remark  # NO_PERMISSION is not retried
        assert len(err.attempts) == 1 and "NO_PERMISSION (16)" in str(err)
        with pytest.raises(ValueError):
            await producer.send(Message("bad topic!", b"x"))
        await producer.send(Message("TErr", b"ok"))  # caches the route
        await broker.stop()  # now every attempt fails
        with pytest.raises(SendError) as info:
            await producer.send(Message("TErr", b"lost"))
        assert len(info.value.attempts) == 3
        assert "failed after 3 attempt(s)" in str(info.value)


async def test_lifecycle_errors(broker, namesrv) -> None:
    producer = Producer("PG_LIFE", namesrv)
    with pytest.raises(ClientStateError, match="start"):
        await producer.send(Message("T", b"x"))
    await producer.start()
    with pytest.raises(ClientStateError):
        await producer.start()
    await producer.shutdown()
    await producer.shutdown()  # idempotent
    with pytest.raises(ClientStateError):
        await producer.send(Message("T", b"x"))
    for bad in ({"group": ""}, {"group": "bad group"}, {"retries": -1}, {"send_timeout": 0},
                {"namesrv": "nohost"}):
        kwargs = {"group": "G", "namesrv": namesrv, **bad}
        with pytest.raises(ValueError):
            Producer(**kwargs)


async def test_unreachable_name_server_is_a_clear_error(tmp_path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    producer = Producer("PG_NONE", f"127.0.0.1:{port}")
    with pytest.raises(Exception, match="name server") as info:
        await producer.start()
    assert "127.0.0.1" in str(info.value)


async def test_heartbeat_registers_the_group_before_any_send(broker, namesrv) -> None:
    async with Producer("PG_HB", namesrv, heartbeat_interval=0.2):
        assert "PG_HB" in broker.registry.producer_groups()  # start() heartbeated already
        for conn in list(broker.server.connections):
            conn.close()  # the broker forgets the group; the periodic heartbeat restores it
        await eventually(lambda: "PG_HB" in broker.registry.producer_groups(), msg="producer registered")


async def test_periodic_heartbeat_restores_a_group_the_broker_forgot(broker, namesrv) -> None:
    """The broker drops both groups while their connections stay open (what its expiry of silent
    producers does): nothing reconnects, so only the periodic heartbeat can bring a group back.
    The producer heartbeating every 0.2 s is known again within a few intervals; the one with
    the 30 s default stays unknown meanwhile."""
    interval = 0.2

    def forget(group: str) -> None:
        for conn in broker.registry.producer_connections(group):
            broker.registry.unregister(conn, "", group, None)
        assert group not in broker.registry.producer_groups()

    async with Producer("PG_HB_FAST", namesrv, heartbeat_interval=interval), \
            Producer("PG_HB_SLOW", namesrv):
        known = broker.registry.producer_groups()
        assert "PG_HB_FAST" in known and "PG_HB_SLOW" in known
        connections = set(broker.server.connections)
        forget("PG_HB_FAST")
        forget("PG_HB_SLOW")
        await eventually(lambda: "PG_HB_FAST" in broker.registry.producer_groups(),
                         timeout=5 * interval, msg="fast producer heartbeated again")
        for _ in range(3):  # a few more fast intervals, in case the fast one came back early
            forget("PG_HB_FAST")
            await eventually(lambda: "PG_HB_FAST" in broker.registry.producer_groups(),
                             timeout=5 * interval, msg="fast producer heartbeated again")
        assert "PG_HB_SLOW" not in broker.registry.producer_groups()
        assert set(broker.server.connections) == connections  # nothing reconnected


async def test_delay_level_defers_delivery(broker, namesrv) -> None:
    consumer = Consumer("CG_DELAY", namesrv, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("TDelay")
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TDelay", 4)
    async with consumer, Producer("PG_DELAY", namesrv) as producer:
        await producer.send(Message("TDelay", b"later", delay_level=1))  # level 1 = 1 s
        await producer.send(Message("TDelay", b"now"))
        [first] = await collect(consumer, 1)
        assert first.body == b"now"
        [second] = await collect(consumer, 1)
        assert second.body == b"later"
        assert second.store_timestamp - second.born_timestamp >= 900
