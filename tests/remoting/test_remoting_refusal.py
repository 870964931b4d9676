"""A :class:`Refusal` that escapes a handler is answered by the transport, once, as it is.

Real server on 127.0.0.1 port 0, read with a raw socket so that every frame the server writes
is seen: a refusal becomes exactly one response with its code and remark, a one-way refusal
none, and an exception that merely *looks* like a refusal (``code``/``remark`` attributes) is
a handler bug answered with SYSTEM_ERROR: refusals are recognised by type only.
"""

from __future__ import annotations

import asyncio

from txbroker.config import BrokerConfig
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import FrameDecoder, encode
from txbroker.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.server import RemotingServer

T = 5.0  # generous per-read timeout: the machine is shared
ECHO, REFUSE_NOW, REFUSE_LATER, LOOKALIKE, GATED = 1, 2, 3, 4, 5


class GroupRefusal(Refusal):
    """A refusal class of the service layer's kind: code and remark fixed by the class."""

    def __init__(self, group: str) -> None:
        super().__init__(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"group {group} does not exist")


class LookAlike(Exception):
    """Carries ``code`` and ``remark`` but is no Refusal."""

    code = ResponseCode.TOPIC_NOT_EXIST
    remark = "not a refusal"


def refuse_now(conn, cmd):
    raise GroupRefusal("now")


async def refuse_later(conn, cmd):
    await asyncio.sleep(0.01)
    raise GroupRefusal("later")


async def lookalike(conn, cmd):
    raise LookAlike()


def client_refuses(cmd):
    raise GroupRefusal("now")


def client_fails(cmd):
    raise LookAlike()


async def echo(conn, cmd):
    return cmd.response(ext={"echo": "yes"})


def gate(conn, cmd) -> None:
    if cmd.code == GATED:
        raise GroupRefusal("gated")


async def start() -> tuple[RemotingServer, asyncio.StreamReader, asyncio.StreamWriter]:
    server = RemotingServer(BrokerConfig(), before_request=gate)
    for code, handler in ((ECHO, echo), (REFUSE_NOW, refuse_now), (REFUSE_LATER, refuse_later),
                          (LOOKALIKE, lookalike), (GATED, echo)):
        server.register(code, handler)
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return server, reader, writer


async def answers_until_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             cmds: list[RemotingCommand]) -> list[RemotingCommand]:
    """Send ``cmds`` then an ECHO; every frame the server writes until the ECHO's answer.

    The ECHO goes last and its handler finishes at once, but answers go out in the order
    handlers finish: frames are collected until the ECHO's and a short quiet period after it.
    """
    for opaque, cmd in enumerate(cmds, start=1):
        cmd.opaque = opaque
    fence = RemotingCommand.request(ECHO)
    fence.opaque = 999
    writer.write(b"".join(encode(c) for c in [*cmds, fence]))
    dec = FrameDecoder()
    frames: list[RemotingCommand] = []
    while not any(f.opaque == fence.opaque for f in frames):
        data = await asyncio.wait_for(reader.read(65536), T)
        assert data, "server closed the connection"
        frames.extend(dec.feed(data))
    try:  # anything written after the fence (a late refusal answered twice would show here)
        while data := await asyncio.wait_for(reader.read(65536), 0.2):
            frames.extend(dec.feed(data))
    except TimeoutError:
        pass
    return [f for f in frames if f.opaque != fence.opaque]


async def test_a_refusal_becomes_exactly_one_response_with_its_code_and_remark() -> None:
    server, reader, writer = await start()
    try:
        frames = await answers_until_echo(reader, writer, [
            RemotingCommand.request(REFUSE_NOW), RemotingCommand.request(REFUSE_LATER),
            RemotingCommand.request(GATED)])
        by_opaque = {f.opaque: f for f in frames}
        assert len(frames) == len(by_opaque) == 3
        expected = {1: "group now does not exist", 2: "group later does not exist",
                    3: "group gated does not exist"}
        for opaque, remark in expected.items():
            f = by_opaque[opaque]
            assert (f.code, f.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, remark)
            assert f.flag & FLAG_RESPONSE and not f.ext_fields and not f.body
        conn = next(iter(server.connections))
        assert conn.handler_errors == 0  # refusals are not handler failures
    finally:
        writer.close()
        await server.close(1.0)


async def test_a_one_way_refusal_is_not_answered() -> None:
    server, reader, writer = await start()
    try:
        oneway = [RemotingCommand.request(code) for code in (REFUSE_NOW, REFUSE_LATER, GATED)]
        for cmd in oneway:
            cmd.flag |= FLAG_ONEWAY
        assert await answers_until_echo(reader, writer, oneway) == []
    finally:
        writer.close()
        await server.close(1.0)


async def test_code_and_remark_attributes_alone_are_a_handler_failure() -> None:
    server, reader, writer = await start()
    try:
        [f] = await answers_until_echo(reader, writer, [RemotingCommand.request(LOOKALIKE)])
        assert f.code == ResponseCode.SYSTEM_ERROR and f.remark.startswith("LookAlike")
        assert next(iter(server.connections)).handler_errors == 1
    finally:
        writer.close()
        await server.close(1.0)


async def test_the_client_answers_a_refusal_of_its_handler_too() -> None:
    """A server-to-client request (a check-back) whose client handler refuses."""
    server = RemotingServer(BrokerConfig())
    port = await server.start("127.0.0.1", 0)
    client = RemotingClient(f"127.0.0.1:{port}")
    client.register(REFUSE_NOW, client_refuses)
    client.register(LOOKALIKE, client_fails)
    try:
        await client.connect()
        await client.invoke(RemotingCommand.request(ECHO), T)  # the server now has the connection
        conn = next(iter(server.connections))
        refused = await conn.request(RemotingCommand.request(REFUSE_NOW), T)
        assert (refused.code, refused.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                                  "group now does not exist")
        failed = await conn.request(RemotingCommand.request(LOOKALIKE), T)
        assert failed.code == ResponseCode.SYSTEM_ERROR and failed.remark.startswith("LookAlike")
    finally:
        await client.close()
        await server.close(1.0)
