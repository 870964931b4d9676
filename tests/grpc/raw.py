"""A raw 5.x client for tests: txbroker's own stubs over a grpc.aio channel, for requests the
official clients never send (malformed, hostile, abandoned)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import time
import uuid

import grpc

from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.grpc import service_pb2_grpc as rpc

SERVICE = "/apache.rocketmq.v2.MessagingService/"


def client_metadata(client_id: str = "raw-client") -> tuple[tuple[str, str], ...]:
    return (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"))


def signed_metadata(access_key: str, secret_key: str, client_id: str = "raw-client", *,
                    date_time: str | None = None, upper: bool = False
                    ) -> tuple[tuple[str, str], ...]:
    """:func:`client_metadata` signed as 5.x clients sign a call: ``x-mq-date-time`` (now, UTC)
    and ``authorization: MQv2-HMAC-SHA1 Credential=..., SignedHeaders=x-mq-date-time,
    Signature=<hex HMAC-SHA1 of the date keyed by the secret>``; ``upper``: the hex in upper
    case, as the Node.js client writes it."""
    date_time = date_time or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    signature = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    if upper:
        signature = signature.upper()
    authorization = (f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
                     f"Signature={signature}")
    return client_metadata(client_id) + (("x-mq-date-time", date_time),
                                         ("authorization", authorization))


def message(topic: str, body: bytes = b"x", **system: object) -> pb.Message:
    sp = pb.SystemProperties(message_id=system.pop("message_id", uuid.uuid4().hex.upper()),
                             message_type=system.pop("message_type", pb.NORMAL), **system)
    return pb.Message(topic=pb.Resource(name=topic), system_properties=sp, body=body)


@contextlib.asynccontextmanager
async def stub(endpoint: str):
    async with grpc.aio.insecure_channel(endpoint) as channel:
        yield rpc.MessagingServiceStub(channel), channel


async def send(s, *messages: pb.Message, client_id: str = "raw-client",
               metadata: tuple[tuple[str, str], ...] | None = None) -> spb.SendMessageResponse:
    return await s.SendMessage(spb.SendMessageRequest(messages=list(messages)),
                               metadata=metadata or client_metadata(client_id), timeout=10)
