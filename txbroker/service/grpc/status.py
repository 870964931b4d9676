"""gRPC status codes as 5.x clients read them, and the refusals the broker's services raise
mapped onto them.

Every RocketMQ 5.x response carries a ``Status {code, message}`` beside the payload; clients
branch on the code (``definition.proto`` ``Code``), not on the gRPC status of the call, which
stays OK.  A remoting :class:`~txbroker.remoting.errors.Refusal` (the store, the topic table,
the transaction service speak in RocketMQ 4.x response codes) keeps its remark and gets the
5.x code a client reacts to in the same way: retry elsewhere, give up, or fix the request.
"""

from __future__ import annotations

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.errors import Refusal
from txbroker.remoting.grpc import definition_pb2 as pb

Code = pb.Code


class GrpcError(Exception):
    """A request refused with a 5.x ``code`` and a one-line ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: RocketMQ 4.x response code -> the 5.x code with the same meaning to a client (the proxy's
#: ``ResponseCodeMapping`` where it has one).
_FROM_REMOTING = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    ResponseCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
}


def status(code: int = Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def from_refusal(exc: Refusal) -> GrpcError:
    """The 5.x error for a refusal of the broker's services (INTERNAL_ERROR if unmapped)."""
    return GrpcError(_FROM_REMOTING.get(exc.code, Code.INTERNAL_ERROR), exc.remark)
