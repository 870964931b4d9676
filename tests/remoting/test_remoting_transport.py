"""Server and client over real TCP on 127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from support.waiting import eventually

from txbroker.config import BrokerConfig
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import FrameDecoder, encode
from txbroker.remoting.codes import FLAG_ONEWAY, ResponseCode, SerializeType
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import HeaderError
from txbroker.remoting.server import Connection, RemotingServer, new_event_loop

T = 5.0  # generous per-call timeout: the machine is shared
ECHO, SLEEP, FAIL, REFUSE, BIG, BLOCK, CALLBACK = 1, 2, 3, 4, 5, 6, 7


class Fixture:
    def __init__(self, **config) -> None:
        self.config = BrokerConfig(**config)
        self.server = RemotingServer(self.config)
        self.calls: list[RemotingCommand] = []
        self.running = 0
        self.max_running = 0
        self.slept = 0  # SLEEP handlers that finished (their answer is written next)
        self.release = asyncio.Event()
        self.disconnected: list[Connection] = []
        s = self.server
        s.register(ECHO, self.echo)
        s.register(SLEEP, self.sleep)
        s.register(FAIL, self.fail)
        s.register(REFUSE, self.refuse)
        s.register(BIG, self.big)
        s.register(BLOCK, self.block)
        s.on_disconnect(self.disconnected.append)
        self.clients: list[RemotingClient] = []

    async def echo(self, conn, cmd):
        self.calls.append(cmd)
        return cmd.response(ext={"echo": cmd.ext_fields.get("x", "")}, body=cmd.body)

    async def sleep(self, conn, cmd):
        await asyncio.sleep(float(cmd.ext_fields["s"]))
        self.slept += 1
        return cmd.response(ext={"x": cmd.ext_fields.get("x", "")})

    async def fail(self, conn, cmd):
        await asyncio.sleep(0)
        raise ValueError("boom")

    def refuse(self, conn, cmd):  # a plain function works too
        raise HeaderError(ResponseCode.TOPIC_NOT_EXIST, "topic 'X' does not exist")

    async def big(self, conn, cmd):
        self.calls.append(cmd)
        return cmd.response(body=b"z" * int(cmd.ext_fields["n"]))

    async def block(self, conn, cmd):
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return cmd.response()

    async def start(self) -> str:
        port = await self.server.start("127.0.0.1", 0)
        self.addr = f"127.0.0.1:{port}"
        return self.addr

    async def client(self, **kw) -> RemotingClient:
        c = RemotingClient(self.addr, **kw)
        await c.connect()
        self.clients.append(c)
        return c

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
        await self.server.close(1.0)


@pytest.fixture
async def fx():
    f = Fixture(max_inflight_per_connection=64)
    await f.start()
    try:
        yield f
    finally:
        await f.close()


def req(code, ext=None, body=b"", **kw) -> RemotingCommand:
    return RemotingCommand.request(code, ext, body, **kw)


async def raw_connect(addr: str):
    host, port = addr.split(":")
    return await asyncio.open_connection(host, int(port))


async def read_frame(reader: asyncio.StreamReader, dec: FrameDecoder) -> RemotingCommand:
    while True:
        data = await asyncio.wait_for(reader.read(65536), T)
        if not data:
            raise ConnectionError("closed")
        out = dec.feed(data)
        if out:
            assert len(out) == 1
            return out[0]


# --- request/response ------------------------------------------------------------------------


async def test_concurrent_requests_answered_out_of_order(fx) -> None:
    c = await fx.client()
    # the first request sleeps longest, so answers come back in reverse order
    tasks = [asyncio.create_task(c.invoke(req(SLEEP, {"s": str(0.05 * (10 - i)), "x": str(i)}), T))
             for i in range(10)]
    order = []
    for fut in asyncio.as_completed(tasks):
        order.append((await fut).ext_fields["x"])
    assert order == [str(i) for i in reversed(range(10))]
    assert [t.result().ext_fields["x"] for t in tasks] == [str(i) for i in range(10)]


async def test_many_in_flight_with_bodies(fx) -> None:
    c = await fx.client()
    bodies = [bytes([i % 256]) * (i * 37) for i in range(300)]
    resps = await asyncio.gather(*(c.invoke(req(ECHO, {"x": str(i)}, b), T) for i, b in enumerate(bodies)))
    assert [r.body for r in resps] == bodies
    assert [r.ext_fields["echo"] for r in resps] == [str(i) for i in range(300)]
    assert all(r.code == ResponseCode.SUCCESS and r.is_response for r in resps)


async def test_binary_request_gets_binary_answer(fx) -> None:
    reader, writer = await raw_connect(fx.addr)
    try:
        writer.write(encode(req(ECHO, {"x": "bin"}, b"abc", serialize_type=SerializeType.ROCKETMQ, opaque=5)))
        resp = await read_frame(reader, FrameDecoder())
        assert resp.serialize_type == SerializeType.ROCKETMQ and resp.opaque == 5
        assert resp.ext_fields == {"echo": "bin"} and resp.body == b"abc"
    finally:
        writer.close()


async def test_oneway_request_is_handled_but_not_answered(fx) -> None:
    reader, writer = await raw_connect(fx.addr)
    try:
        writer.write(encode(req(ECHO, {"x": "one"}, oneway=True, opaque=1)))
        writer.write(encode(req(ECHO, {"x": "two"}, opaque=2)))
        dec = FrameDecoder()
        resp = await read_frame(reader, dec)
        assert resp.opaque == 2 and resp.ext_fields["echo"] == "two"
        assert [c.ext_fields["x"] for c in fx.calls] == ["one", "two"]
        assert fx.calls[0].flag & FLAG_ONEWAY
        # answers leave in the order their requests were handled: the next frame is the
        # answer to a third request, not a late one to the first
        writer.write(encode(req(ECHO, {"x": "three"}, opaque=3)))
        assert (await read_frame(reader, dec)).opaque == 3
        assert dec.buffered == 0
    finally:
        writer.close()


async def test_unknown_code_and_errors_keep_the_connection(fx) -> None:
    c = await fx.client()
    resp = await c.invoke(req(777), T)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert resp.remark == " request type 777 not supported"
    resp = await c.invoke(req(FAIL), T)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "ValueError: boom" in resp.remark
    resp = await c.invoke(req(REFUSE), T)
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST and resp.remark == "topic 'X' does not exist"
    resp = await c.invoke(req(ECHO, {"x": "still here"}), T)
    assert resp.ext_fields["echo"] == "still here"
    assert c.reconnects == 0 and len(fx.server.connections) == 1


async def test_default_handler_catches_unregistered_codes() -> None:
    async def fallback(conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, f"fallback {cmd.code}")

    server = RemotingServer(BrokerConfig(), default_handler=fallback)
    port = await server.start("127.0.0.1", 0)
    c = RemotingClient(f"127.0.0.1:{port}")
    try:
        assert (await c.invoke(req(4242), T)).remark == "fallback 4242"
    finally:
        await c.close()
        await server.close(1.0)


# --- garbage and limits ----------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                       # a "length" far beyond the limit
    struct.pack(">ii", 12, 8) + b'{"code":1}',                  # header not JSON-complete
    struct.pack(">ii", 10, 6) + b"[1, 2]",                      # header not an object
    struct.pack(">i", 2),                                        # length below minimum
    struct.pack(">i", 17 * 1024 * 1024) + b"\x00" * 4,          # oversize frame
])
async def test_malformed_frame_closes_only_that_connection(fx, garbage: bytes) -> None:
    good = await fx.client()
    assert (await good.invoke(req(ECHO, {"x": "1"}), T)).code == 0
    reader, writer = await raw_connect(fx.addr)
    await eventually(lambda: len(fx.server.connections) == 2)
    writer.write(garbage)
    assert await asyncio.wait_for(reader.read(), T) == b""  # closed by the server, no answer
    writer.close()
    await eventually(lambda: len(fx.server.connections) == 1)
    assert (await good.invoke(req(ECHO, {"x": "2"}), T)).ext_fields["echo"] == "2"
    assert good.reconnects == 0 and fx.server.protocol_errors == 1


async def test_max_connections() -> None:
    f = Fixture(max_connections=2)
    await f.start()
    try:
        a, b = await f.client(), await f.client()
        extra = RemotingClient(f.addr, reconnect=False)
        f.clients.append(extra)
        await extra.connect()  # TCP accepts, then the server closes it at once
        with pytest.raises(ConnectionError):
            await extra.invoke(req(ECHO), T)
        assert (await a.invoke(req(ECHO, {"x": "a"}), T)).ext_fields["echo"] == "a"
        assert (await b.invoke(req(ECHO, {"x": "b"}), T)).ext_fields["echo"] == "b"
        assert len(f.server.connections) == 2
    finally:
        await f.close()


async def test_inflight_limit_stops_reading() -> None:
    f = Fixture(max_inflight_per_connection=3)
    await f.start()
    try:
        c = await f.client()
        tasks = [asyncio.create_task(c.invoke(req(BLOCK), T)) for _ in range(12)]
        await eventually(lambda: f.running == 3)
        conn = next(iter(f.server.connections))
        await eventually(lambda: conn.inflight == 12)  # 3 running, 9 read and waiting
        await asyncio.sleep(0.1)  # the behaviour under test: no fourth handler starts meanwhile
        assert f.running == 3 and conn._reading_paused
        # a cheap request on the same connection waits behind the limit too
        echo = asyncio.create_task(c.invoke(req(ECHO), T))
        await asyncio.sleep(0.05)  # the behaviour under test: it stays unanswered meanwhile
        assert not echo.done()
        f.release.set()
        resps = await asyncio.gather(*tasks, echo)
        assert all(r.code == 0 for r in resps)
        assert f.max_running == 3 and conn.inflight == 0 and not conn._reading_paused
    finally:
        await f.close()


async def test_slow_reader_is_bounded_by_back_pressure() -> None:
    f = Fixture(max_inflight_per_connection=4)
    await f.start()
    size, count = 256 * 1024, 100           # 25 MiB of answers if nobody pushed back
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", f.server.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(b"".join(encode(req(BIG, {"n": str(size)}, opaque=i)) for i in range(count)))
        await eventually(lambda: f.server.connections
                         and next(iter(f.server.connections))._reading_paused)
        conn = next(iter(f.server.connections))
        # the behaviour under test: nothing more is handled over a while the client does not read
        stable = len(f.calls)
        await asyncio.sleep(0.3)
        assert len(f.calls) == stable < count
        assert conn.transport.get_write_buffer_size() <= (conn._max_inflight + 2) * (size + 512)
        # now read everything: every request is answered, in order of opaque
        dec, got = FrameDecoder(), []
        while len(got) < count:
            data = await asyncio.wait_for(reader.read(1 << 20), T)
            assert data
            got += dec.feed(data)
        assert [r.opaque for r in got] == list(range(count))
        assert all(len(r.body) == size for r in got)
    finally:
        writer.close()
        await f.close()


# --- client behaviour ------------------------------------------------------------------------


async def test_client_timeout_fails_one_call_only(fx) -> None:
    c = await fx.client()
    with pytest.raises(TimeoutError, match="no answer"):
        await c.invoke(req(SLEEP, {"s": "0.5"}), 0.05)
    resp = await c.invoke(req(ECHO, {"x": "after"}), T)
    assert resp.ext_fields["echo"] == "after"
    await eventually(lambda: fx.slept == 1, T, "the timed-out request answered late")
    # this answer follows the late one on the connection, which was dropped quietly
    assert (await c.invoke(req(ECHO, {"x": "again"}), T)).ext_fields["echo"] == "again"
    assert c.reconnects == 0 and len(fx.server.connections) == 1


async def test_drop_fails_pending_then_reconnects(fx) -> None:
    c = await fx.client()
    pending = asyncio.create_task(c.invoke(req(SLEEP, {"s": "5"}), T))
    await eventually(lambda: len(fx.server.connections) == 1 and
                     next(iter(fx.server.connections))._inflight == 1)
    conn = next(iter(fx.server.connections))
    conn.abort()
    with pytest.raises(ConnectionError, match="closed"):
        await pending
    await eventually(lambda: fx.disconnected == [conn])
    assert (await c.invoke(req(ECHO, {"x": "back"}), T)).ext_fields["echo"] == "back"
    assert c.reconnects == 1 and not c.closed


async def test_reconnect_backs_off_when_server_is_gone() -> None:
    f = Fixture()
    await f.start()
    c = await f.client()
    await f.server.close(0.1)
    await eventually(lambda: not c.connected)
    with pytest.raises(ConnectionError, match="cannot connect"):
        await c.invoke(req(ECHO), T)
    with pytest.raises(ConnectionError, match="failed recently"):
        await c.invoke(req(ECHO), T)
    await c.close()
    with pytest.raises(ConnectionError, match="is closed"):
        await c.invoke(req(ECHO), T)


async def test_close_fails_pending_calls(fx) -> None:
    c = await fx.client()
    pending = asyncio.create_task(c.invoke(req(SLEEP, {"s": "5"}), T))
    await eventually(lambda: any(conn.inflight == 1 for conn in fx.server.connections))  # being handled
    await c.close()
    with pytest.raises(ConnectionError):
        await pending
    assert c.closed


async def test_server_to_client_request_and_oneway(fx) -> None:
    c = await fx.client()
    seen: list[RemotingCommand] = []

    async def on_check(cmd):
        seen.append(cmd)
        return cmd.response(ext={"state": "commit", "echo": cmd.ext_fields.get("q", "")})

    c.register(39, on_check)
    await c.invoke(req(ECHO), T)  # make sure the server side connection exists
    conn = next(iter(fx.server.connections))
    answers = await asyncio.gather(*(conn.request(req(39, {"q": str(i)}), T) for i in range(5)))
    assert [a.ext_fields["echo"] for a in answers] == [str(i) for i in range(5)]
    conn.send_oneway(req(39, {"q": "oneway"}))
    await eventually(lambda: len(seen) == 6)
    assert seen[-1].is_oneway
    # no handler on the client for this code: it says so
    resp = await conn.request(req(4000), T)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    # a request to a client that does not answer times out without hurting the connection
    c.register(41, lambda cmd: None)
    with pytest.raises(asyncio.TimeoutError):
        await conn.request(req(41), 0.1)
    assert (await c.invoke(req(ECHO, {"x": "ok"}), T)).ext_fields["echo"] == "ok"


async def test_client_does_not_answer_oneway_server_requests() -> None:
    """A raw server sends a one-way request and then a normal one: only the second is answered."""
    got = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        writer.write(encode(req(40, {"consumerGroup": "G"}, oneway=True, opaque=100)))
        writer.write(encode(req(40, {"consumerGroup": "H"}, opaque=101)))
        got.set_result(await read_frame(reader, FrameDecoder()))
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    c = RemotingClient(f"127.0.0.1:{port}")
    groups = []
    c.register(40, lambda cmd: (groups.append(cmd.ext_fields["consumerGroup"]), cmd.response())[1])
    try:
        await c.connect()
        resp = await asyncio.wait_for(got, T)
        assert resp.opaque == 101 and resp.is_response and groups == ["G", "H"]
    finally:
        await c.close()
        srv.close()


async def test_send_oneway_to_closed_connection_raises(fx) -> None:
    c = await fx.client()
    await c.invoke(req(ECHO), T)
    conn = next(iter(fx.server.connections))
    await c.close()
    await eventually(lambda: conn.closed)
    with pytest.raises(ConnectionError):
        conn.send_oneway(req(40))
    with pytest.raises(ConnectionError):
        await conn.request(req(39), T)


async def test_invoke_oneway_reaches_handler(fx) -> None:
    c = await fx.client()
    await c.invoke_oneway(req(ECHO, {"x": "fire"}))
    await eventually(lambda: len(fx.calls) == 1)
    assert fx.calls[0].is_oneway
    assert (await c.invoke(req(ECHO, {"x": "next"}), T)).ext_fields["echo"] == "next"


# --- shutdown --------------------------------------------------------------------------------


async def test_graceful_close_finishes_in_flight_then_refuses() -> None:
    f = Fixture()
    await f.start()
    c = await f.client()
    slow = asyncio.create_task(c.invoke(req(SLEEP, {"s": "0.3", "x": "done"}), T))
    await eventually(lambda: f.server.connections and next(iter(f.server.connections))._inflight == 1)
    await f.server.close(grace=5.0)
    assert (await slow).ext_fields["x"] == "done"
    assert not f.server.connections
    with pytest.raises(ConnectionError):
        await RemotingClient(f.addr, connect_timeout=1.0).connect()
    await c.close()


async def test_close_cancels_handlers_past_the_grace() -> None:
    f = Fixture()
    await f.start()
    c = await f.client()
    stuck = asyncio.create_task(c.invoke(req(BLOCK), T))
    await eventually(lambda: f.running == 1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await f.server.close(grace=0.2)
    assert loop.time() - t0 < 3.0
    with pytest.raises(ConnectionError):
        await stuck
    assert f.running == 0
    await c.close()


def test_runs_on_uvloop() -> None:
    async def main():
        f = Fixture()
        await f.start()
        try:
            c = await f.client()
            resps = await asyncio.gather(*(c.invoke(req(ECHO, {"x": str(i)}), T) for i in range(50)))
            assert [r.ext_fields["echo"] for r in resps] == [str(i) for i in range(50)]
            assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        finally:
            await f.close()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())


async def test_handlers_that_wait_in_many_ways() -> None:
    """The inline first step hands over to a task correctly, whatever the handler awaits."""
    f = Fixture()

    class GroupRefusal(Refusal):  # the service layer's own refusals derive from Refusal
        def __init__(self) -> None:
            super().__init__(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "no such group")

    async def winding(conn, cmd):
        await asyncio.sleep(0)                       # bare yield
        await asyncio.sleep(0.01)                    # a timer future
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, "v")
        value = await fut
        try:
            await asyncio.wait_for(asyncio.sleep(5), 0.01)   # a time-out inside the handler
        except TimeoutError:
            value += "+timeout"
        mode = cmd.ext_fields.get("mode")
        if mode == "header":
            raise HeaderError(ResponseCode.MESSAGE_ILLEGAL, "late refusal")
        if mode == "service":
            raise GroupRefusal()
        if mode == "bug":
            raise KeyError("late bug")
        return cmd.response(ext={"v": value})

    f.server.register(50, winding)
    await f.start()
    try:
        c = await f.client()
        ok, header, service, bug = await asyncio.gather(*(
            c.invoke(req(50, {"mode": m}), T) for m in ("ok", "header", "service", "bug")))
        assert ok.ext_fields == {"v": "v+timeout"}
        assert (header.code, header.remark) == (ResponseCode.MESSAGE_ILLEGAL, "late refusal")
        assert (service.code, service.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "no such group")
        assert bug.code == ResponseCode.SYSTEM_ERROR and "late bug" in bug.remark
        conn = next(iter(f.server.connections))
        assert conn.handler_errors == 1 and conn.requests == 4 and not conn._tasks
    finally:
        await f.close()


async def test_sync_handler_results_and_bad_results() -> None:
    f = Fixture()
    f.server.register(60, lambda conn, cmd: cmd.response(ext={"sync": "yes"}))
    f.server.register(61, lambda conn, cmd: "not a command")
    f.server.register(62, lambda conn, cmd: None)  # no answer, like a Java processor returning null
    await f.start()
    try:
        c = await f.client()
        assert (await c.invoke(req(60), T)).ext_fields == {"sync": "yes"}
        bad = await c.invoke(req(61), T)
        assert bad.code == ResponseCode.SYSTEM_ERROR
        with pytest.raises(TimeoutError):
            await c.invoke(req(62), 0.1)
        assert (await c.invoke(req(60), T)).code == 0
    finally:
        await f.close()


async def test_pending_server_request_fails_when_client_goes(fx) -> None:
    c = await fx.client()
    hold = asyncio.Event()

    async def slow_check(cmd):
        await hold.wait()
        return cmd.response()

    c.register(39, slow_check)
    await c.invoke(req(ECHO), T)
    conn = next(iter(fx.server.connections))
    pending = asyncio.create_task(conn.request(req(39), T))
    await eventually(lambda: conn._pending)  # sent, its answer awaited
    await c.close()
    with pytest.raises(ConnectionError, match="closed before the answer"):
        await pending
    assert fx.disconnected == [conn] and not conn._pending


async def test_partial_frames_and_many_frames_per_read(fx) -> None:
    """Byte-at-a-time and many-at-once input both decode (the decoder's two buffer paths)."""
    reader, writer = await raw_connect(fx.addr)
    try:
        stream = b"".join(encode(req(ECHO, {"x": str(i)}, b"b" * i, opaque=i)) for i in range(20))
        for i in range(200):  # the first bytes one at a time
            writer.write(stream[i:i + 1])
            await writer.drain()
        writer.write(stream[200:])
        dec, got = FrameDecoder(), []
        while len(got) < 20:
            data = await asyncio.wait_for(reader.read(65536), T)
            assert data
            got += dec.feed(data)
        assert sorted(r.opaque for r in got) == list(range(20))
        assert all(r.ext_fields["echo"] == str(r.opaque) and len(r.body) == r.opaque for r in got)
    finally:
        writer.close()


async def test_configured_max_frame_size() -> None:
    f = Fixture(max_frame_size=4096)
    await f.start()
    try:
        c = await f.client()
        assert len((await c.invoke(req(ECHO, body=b"x" * 3500), T)).body) == 3500
        with pytest.raises(ConnectionError):
            await c.invoke(req(ECHO, body=b"x" * 5000), T)   # over the limit: connection closed
        assert f.server.protocol_errors == 1
        assert (await c.invoke(req(ECHO, body=b"ok"), T)).body == b"ok"  # reconnects
        assert c.reconnects == 1
    finally:
        await f.close()


async def test_random_garbage_never_hurts_the_server(fx, caplog) -> None:
    import random

    rng = random.Random(1234)
    good = await fx.client()
    valid = encode(req(ECHO, {"x": "v"}, b"body"))
    for _ in range(30):
        reader, writer = await raw_connect(fx.addr)
        junk = bytearray(valid * 2)
        for _ in range(rng.randint(1, 8)):
            junk[rng.randrange(len(junk))] = rng.randrange(256)
        writer.write(bytes(junk) + rng.randbytes(rng.randint(0, 64)))
        writer.write_eof()
        # whatever the server made of it, it answers or closes; it never stalls or dies
        await asyncio.wait_for(reader.read(), T)
        writer.close()
    assert (await good.invoke(req(ECHO, {"x": "alive"}), T)).ext_fields["echo"] == "alive"
    await eventually(lambda: len(fx.server.connections) == 1)
    assert good.reconnects == 0
    assert fx.server.protocol_errors >= 10 and "protocol error" in caplog.text


async def test_many_clients_mixed_fast_and_waiting_handlers(fx) -> None:
    """20 connections x 40 requests, half answered at once and half after a short wait."""
    import random

    rng = random.Random(7)
    clients = [await fx.client() for _ in range(20)]

    async def one(c: RemotingClient, i: int) -> tuple[str, str]:
        if i % 2:
            r = await c.invoke(req(SLEEP, {"s": f"{rng.random() * 0.005:.4f}", "x": str(i)}), T)
            return r.ext_fields["x"], str(i)
        r = await c.invoke(req(ECHO, {"x": str(i)}, str(i).encode()), T)
        assert r.body == str(i).encode()
        return r.ext_fields["echo"], str(i)

    results = await asyncio.gather(*(one(c, i) for c in clients for i in range(40)))
    assert all(got == want for got, want in results) and len(results) == 800
    assert all(c.reconnects == 0 for c in clients)
    assert sum(conn.requests for conn in fx.server.connections) == 800
