"""QueryRoute: the queues of a topic, each pointing at this broker's gRPC endpoint.

5.x clients pick queues from the route themselves: producers round-robin over the writable
ones (FIFO messages by message group), consumers over the readable ones, and the Java load
balancers keep only queues whose broker id is 0 (the master) and whose permission they need.
Every queue accepts every message type the endpoint serves (the proxy answers so for a topic
of the ``MIXED`` type): txbroker topics carry no message type.
"""

from __future__ import annotations

import ipaddress

from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.service.topics import PERM_READ, PERM_WRITE, TopicConfig

#: The types every queue takes (LITE and PRIORITY are not served).
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)


def endpoints(host: str, port: int) -> pb.Endpoints:
    """``host:port`` as 5.x clients want it: the scheme says whether host is an address."""
    try:
        scheme = pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


def queue_permission(tc: TopicConfig, queue_id: int) -> int:
    read = bool(tc.perm & PERM_READ) and queue_id < tc.read_queue_nums
    write = bool(tc.perm & PERM_WRITE) and queue_id < tc.write_queue_nums
    if read and write:
        return pb.READ_WRITE
    if read:
        return pb.READ
    return pb.WRITE if write else pb.NONE


def message_queues(tc: TopicConfig, broker_name: str, here: pb.Endpoints,
                   namespace: str = "") -> list[pb.MessageQueue]:
    broker = pb.Broker(name=broker_name, id=0, endpoints=here)
    topic = pb.Resource(resource_namespace=namespace, name=tc.name)
    return [pb.MessageQueue(topic=topic, id=qid, permission=queue_permission(tc, qid),
                            broker=broker, accept_message_types=ACCEPTED_TYPES)
            for qid in range(max(tc.read_queue_nums, tc.write_queue_nums))]
