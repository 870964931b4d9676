"""A raw 5.x client for tests: txbroker's own stubs over a grpc.aio channel, for requests the
official clients never send (malformed, hostile, abandoned)."""

from __future__ import annotations

import contextlib
import uuid

import grpc

from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.grpc import service_pb2_grpc as rpc

SERVICE = "/apache.rocketmq.v2.MessagingService/"


def client_metadata(client_id: str = "raw-client") -> tuple[tuple[str, str], ...]:
    return (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"))


def message(topic: str, body: bytes = b"x", **system: object) -> pb.Message:
    sp = pb.SystemProperties(message_id=system.pop("message_id", uuid.uuid4().hex.upper()),
                             message_type=system.pop("message_type", pb.NORMAL), **system)
    return pb.Message(topic=pb.Resource(name=topic), system_properties=sp, body=body)


@contextlib.asynccontextmanager
async def stub(endpoint: str):
    async with grpc.aio.insecure_channel(endpoint) as channel:
        yield rpc.MessagingServiceStub(channel), channel


async def send(s, *messages: pb.Message, client_id: str = "raw-client") -> spb.SendMessageResponse:
    return await s.SendMessage(spb.SendMessageRequest(messages=list(messages)),
                               metadata=client_metadata(client_id), timeout=10)
