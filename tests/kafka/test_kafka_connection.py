"""The Kafka listener on the connection core, over real sockets on 127.0.0.1 port 0.

The listener is real (:class:`KafkaListener`, its connections, the codec); its Produce handler
is the test's own, so the test decides when a request finishes.  What is pinned down: a
dropped connection lets its running handler finish (it used to be cancelled, which is how a
produce could be stored but not recorded), the per-connection limits pause reading rather than
disconnect, and a stop waits for running handlers, a dropped connection's included, within
the grace period.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from support.waiting import eventually

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.kafka.context import KafkaRequestContext
from txbroker.service.kafka.listener import KafkaConnection, KafkaListener
from txbroker.service.metrics import BrokerMetrics

T = 10.0
#: Big enough that one read of the socket holds at most two requests.
RECORDS = b"r" * 200_000


class Gated:
    """A Produce handler that holds every request until ``gate`` is set, then answers its
    correlation id as the base offset."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started: list[int] = []
        self.finished: list[int] = []
        self.cancelled: list[int] = []

    async def __call__(self, ctx: KafkaRequestContext, body: dict) -> dict:
        self.started.append(ctx.correlation_id)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(ctx.correlation_id)
            raise
        self.finished.append(ctx.correlation_id)
        return {"responses": [{"name": "t", "partition_responses": [
            {"index": 0, "error_code": 0, "base_offset": ctx.correlation_id}]}]}


def produce(corr: int, records: bytes = b"x") -> bytes:
    return encode_request(ApiKey.PRODUCE, 7, corr, "conn-test", {
        "transactional_id": None, "acks": -1, "timeout_ms": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}]})


async def read_answer(reader: asyncio.StreamReader) -> int:
    """The base offset (= correlation id) of the next Produce answer."""
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), T), "big")
    corr, body = decode_response(ApiKey.PRODUCE, 7, await asyncio.wait_for(reader.readexactly(size), T))
    assert body["responses"][0]["partition_responses"][0]["base_offset"] == corr
    return corr


@pytest.fixture
async def served():
    """Start a listener with a :class:`Gated` Produce handler: ``await served(**config)``."""
    made: list[KafkaListener] = []

    async def start(**settings) -> tuple[KafkaListener, Gated, int]:
        handler = Gated()
        listener = KafkaListener(BrokerConfig().replace(**settings), {ApiKey.PRODUCE: handler},
                                 BrokerMetrics())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        await listener.start(sock)
        made.append(listener)
        return listener, handler, port

    yield start
    for listener in made:
        await listener.close(0.5)


def only_connection(listener: KafkaListener) -> KafkaConnection:
    assert len(listener.connections) == 1
    return next(iter(listener.connections))


async def test_a_dropped_connection_lets_its_running_handler_finish(served) -> None:
    listener, handler, port = await served()
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(produce(1))
    await eventually(lambda: handler.started == [1], T, "the handler started")
    writer.close()
    await eventually(lambda: not listener.connections, T, "the listener saw the connection go")
    handler.gate.set()
    await eventually(lambda: handler.finished == [1], T,
                     lambda: f"the handler finished (cancelled: {handler.cancelled})")
    assert handler.cancelled == []
    await eventually(lambda: not listener.lingering, T, "the lost connection forgotten")


@pytest.mark.parametrize("limit", [{"kafka_max_inflight_per_connection": 4},
                                   {"kafka_max_queued_bytes": 500_000}])
async def test_reading_pauses_at_the_connection_limits_and_every_request_is_answered(
        served, limit) -> None:
    listener, handler, port = await served(**limit)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    count = 30
    writer.write(b"".join(produce(i, RECORDS) for i in range(count)))  # ~6 MB, not drained
    await eventually(lambda: handler.started == [0], T, "the first request started")
    conn = only_connection(listener)
    await eventually(lambda: conn._reading_paused, T, "reading paused")
    # One read of the socket may complete a frame or two past the limit; never more.
    if "kafka_max_inflight_per_connection" in limit:
        assert conn.inflight <= 4 + 2
    else:
        assert conn.queued_bytes <= 500_000 + 2 * (len(RECORDS) + 1024)
    assert conn.inflight < count  # the rest waits in the sockets' buffers
    handler.gate.set()
    answers = [await read_answer(reader) for _ in range(count)]
    assert answers == list(range(count))  # in request order, and the connection stayed up
    writer.write(produce(99))
    assert await read_answer(reader) == 99
    writer.close()


async def test_stop_lets_running_handlers_finish_and_answer_within_the_grace(served) -> None:
    listener, handler, port = await served()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    _dropped_reader, dropped = await asyncio.open_connection("127.0.0.1", port)
    writer.write(produce(1))
    dropped.write(produce(2))
    await eventually(lambda: sorted(handler.started) == [1, 2], T, "both handlers started")
    dropped.close()
    await eventually(lambda: len(listener.connections) == 1, T, "one connection dropped")
    stop = asyncio.ensure_future(listener.close(grace=T))
    await asyncio.sleep(0)
    assert not stop.done()
    handler.gate.set()
    assert await read_answer(reader) == 1  # answered before the connection closed
    await asyncio.wait_for(stop, T)
    assert sorted(handler.finished) == [1, 2] and handler.cancelled == []
    assert await asyncio.wait_for(reader.read(), T) == b""  # then closed
    writer.close()


async def test_stop_cancels_a_handler_still_running_after_the_grace(served) -> None:
    listener, handler, port = await served()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(produce(1))
    await eventually(lambda: handler.started == [1], T, "the handler started")
    await asyncio.wait_for(listener.close(grace=0.2), T)
    assert handler.cancelled == [1] and handler.finished == []
    assert await asyncio.wait_for(reader.read(), T) == b""
    writer.close()
