"""A transactional message with a delivery time over gRPC, which the official 5.x clients
refuse to build: this driver sends the raw protobuf requests with txbroker's generated stubs, in
its own process (the stubs' protobuf names cannot be loaded twice in one process).

``raw_tx_timer.py ENDPOINT TOPIC DELIVER_MS``: two TRANSACTION messages due at DELIVER_MS
(epoch ms), the first committed and the second rolled back by EndTransaction; prints one JSON
object per step and ``{"done": true}`` last.
"""

from __future__ import annotations

import json
import sys
import uuid

import grpc

from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.grpc import service_pb2_grpc as rpc

TIMEOUT_S = 10.0


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> int:
    endpoint, topic, deliver_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
    metadata = (("x-mq-client-id", f"raw-tx-timer-{uuid.uuid4().hex[:8]}"),)
    with grpc.insecure_channel(endpoint) as channel:
        stub = rpc.MessagingServiceStub(channel)
        for body, resolution in ((b"committed", pb.COMMIT), (b"rolled-back", pb.ROLLBACK)):
            message = pb.Message(topic=pb.Resource(name=topic), body=body)
            sp = message.system_properties
            sp.message_id = uuid.uuid4().hex.upper()
            sp.message_type = pb.TRANSACTION
            sp.body_encoding = pb.IDENTITY
            sp.delivery_timestamp.FromMilliseconds(deliver_ms)
            sent = stub.SendMessage(spb.SendMessageRequest(messages=[message]),
                                    metadata=metadata, timeout=TIMEOUT_S)
            entry = sent.entries[0]
            emit(sent=entry.message_id, code=sent.status.code, message=sent.status.message,
                 transaction_id=entry.transaction_id, recall_handle=entry.recall_handle)
            ended = stub.EndTransaction(spb.EndTransactionRequest(
                topic=pb.Resource(name=topic), message_id=entry.message_id,
                transaction_id=entry.transaction_id, resolution=resolution,
                source=pb.SOURCE_CLIENT), metadata=metadata, timeout=TIMEOUT_S)
            emit(ended=entry.message_id, code=ended.status.code, message=ended.status.message,
                 how=pb.TransactionResolution.Name(resolution))
    emit(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
