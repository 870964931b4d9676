"""The connection core (txbroker.remoting.connection) over real TCP on 127.0.0.1 port 0.

What the core adds over the transport tests: how answers reach the socket (one
``writelines`` per flush, a body in parts kept as its buffers) and an orderly shutdown that
waits on the running handler, then closes.  Writes are counted by a wrapper around the real
transport, so the protocol under test runs unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.waiting import eventually

from txbroker.config import BrokerConfig
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import FrameDecoder, encode, encode_parts
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.server import Connection, RemotingServer

T = 5.0
ECHO, PARTS, HOLD = 1, 2, 3
RECORDS = [b"first record " * 50, b"second" * 300, b"third record" * 2000]


class CountingTransport:
    """The real transport, with its write calls recorded."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self._inner = inner
        self.writelines_calls: list[list[bytes]] = []
        self.write_calls = 0

    def writelines(self, buffers: list[bytes]) -> None:
        self.writelines_calls.append(list(buffers))
        self._inner.writelines(buffers)

    def write(self, data: bytes) -> None:
        self.write_calls += 1
        self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Server:
    def __init__(self) -> None:
        self.server = RemotingServer(BrokerConfig())
        self.release = asyncio.Event()
        self.disconnected: list[Connection] = []
        self.server.register(ECHO, lambda conn, cmd: cmd.response(ext={"x": cmd.ext_fields["x"]}))
        self.server.register(PARTS, self.parts)
        self.server.register(HOLD, self.hold)
        self.server.on_disconnect(self.disconnected.append)

    @staticmethod
    async def parts(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        resp = cmd.response()
        resp.body_parts = list(RECORDS)
        return resp

    async def hold(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await self.release.wait()
        return cmd.response(ext={"held": "yes"})

    async def start(self) -> str:
        port = await self.server.start("127.0.0.1", 0)
        return f"127.0.0.1:{port}"

    def only_connection(self) -> Connection:
        (conn,) = self.server.connections
        return conn


@pytest.fixture
async def srv():
    s = Server()
    s.addr = await s.start()
    try:
        yield s
    finally:
        await s.server.close(1.0)


async def handler_running(srv: Server) -> Connection:
    await eventually(lambda: srv.server.connections and srv.only_connection()._tasks, T,
                     "handler started")
    return srv.only_connection()


async def connected(srv: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                          Connection, CountingTransport]:
    host, port = srv.addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    await eventually(lambda: srv.server.connections, T, "server sees the connection")
    conn = srv.only_connection()
    counting = CountingTransport(conn.transport)
    conn.transport = counting  # type: ignore[assignment]
    return reader, writer, conn, counting


async def read_commands(reader: asyncio.StreamReader, n: int) -> list[RemotingCommand]:
    dec = FrameDecoder()
    out: list[RemotingCommand] = []
    while len(out) < n:
        data = await asyncio.wait_for(reader.read(1 << 20), T)
        assert data, "connection closed early"
        out += dec.feed(data)
    return out


async def test_answers_to_one_read_leave_in_one_writelines(srv) -> None:
    reader, writer, conn, counting = await connected(srv)
    n = 40
    stream = b"".join(encode(RemotingCommand.request(ECHO, {"x": str(i)}, opaque=i)) for i in range(n))
    conn.data_received(stream)  # one read holding n requests, as the transport would deliver it
    answers = await read_commands(reader, n)
    assert [a.ext_fields["x"] for a in answers] == [str(i) for i in range(n)]
    assert [a.opaque for a in answers] == list(range(n))
    assert len(counting.writelines_calls) == 1 and counting.write_calls == 0
    assert len(counting.writelines_calls[0]) == n  # one small frame is one buffer
    writer.close()


async def test_body_parts_reach_the_transport_as_the_same_buffers(srv) -> None:
    reader, writer, conn, counting = await connected(srv)
    conn.data_received(encode(RemotingCommand.request(PARTS, opaque=7)))
    (answer,) = await read_commands(reader, 1)
    assert answer.opaque == 7 and answer.body == b"".join(RECORDS)
    (buffers,) = counting.writelines_calls
    assert [id(b) for b in buffers[1:]] == [id(r) for r in RECORDS]  # not copied, not joined
    writer.close()


async def test_shutdown_waits_for_the_running_handler_then_closes(srv) -> None:
    client = RemotingClient(srv.addr)
    held = asyncio.create_task(client.invoke(RemotingCommand.request(HOLD), T))
    conn = await handler_running(srv)
    shutdown = asyncio.create_task(conn.shutdown(grace=T))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not shutdown.done() and not held.done() and not conn.closed
    srv.release.set()
    await asyncio.wait_for(shutdown, T)
    assert (await held).ext_fields == {"held": "yes"}  # answered before the close
    assert conn.closed and srv.disconnected == [conn] and not srv.server.connections
    await client.close()


async def test_shutdown_cancels_a_handler_past_the_grace(srv) -> None:
    client = RemotingClient(srv.addr)
    held = asyncio.create_task(client.invoke(RemotingCommand.request(HOLD), T))
    conn = await handler_running(srv)
    await asyncio.wait_for(conn.shutdown(grace=0.05), T)
    assert not conn._tasks and srv.disconnected == [conn]
    with pytest.raises(ConnectionError):
        await held
    await client.close()


async def test_client_handler_with_a_bad_result_is_answered_as_an_error(srv) -> None:
    client = RemotingClient(srv.addr)
    client.register(40, lambda cmd: "not a command")
    await client.invoke(RemotingCommand.request(ECHO, {"x": "1"}), T)
    answer = await srv.only_connection().request(RemotingCommand.request(40), T)
    assert answer.code == ResponseCode.SYSTEM_ERROR
    await client.close()


def test_encode_parts_is_encode_without_copying_the_body() -> None:
    joined = RemotingCommand(code=0, opaque=3, flag=1, body=b"".join(RECORDS))
    parted = RemotingCommand(code=0, opaque=3, flag=1, body_parts=list(RECORDS))
    parts = encode_parts(parted)
    assert b"".join(parts) == encode(joined) == encode(parted)
    assert all(a is b for a, b in zip(parts[1:], RECORDS, strict=True))
    big = RemotingCommand(code=0, body=b"z" * 100_000)
    assert encode_parts(big)[-1] is big.body
    small = RemotingCommand(code=0, body=b"small")
    assert encode_parts(small) == [encode(small)]
