"""RecallMessage: a 5.x producer cancels a timer message before its delivery with the
``recall_handle`` its SendMessage entry carried (docs/grpc.md, "Timer messages").

The timer service does the work, as for the remoting RECALL_MESSAGE; its refusals (a handle
that is not one, another topic or broker, too late, no such pending timer: RocketMQ's
ILLEGAL_OPERATION) become BAD_REQUEST with the same message, which a client does not retry,
and a slave's SLAVE_NOT_AVAILABLE becomes HA_NOT_AVAILABLE.
"""

from __future__ import annotations

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.grpc.status import Code, GrpcError, from_refusal, status
from txbroker.service.timer import TimerRefusal, TimerService
from txbroker.service.topics import TopicManager


class RecallHandlers:
    """The servicer's ``recall`` handler object."""

    def __init__(self, timer: TimerService, topics: TopicManager) -> None:
        self.timer = timer
        self.topics = topics

    async def recall(self, request: spb.RecallMessageRequest, context) -> spb.RecallMessageResponse:
        topic = request.topic.name
        if not topic or self.topics.get(topic) is None:
            raise GrpcError(Code.TOPIC_NOT_FOUND, f"recall failed: topic {topic!r} does not exist")
        if not request.recall_handle:
            raise GrpcError(Code.BAD_REQUEST, "recall failed: recall_handle is empty")
        try:
            message_id = await self.timer.recall(topic, request.recall_handle)
        except TimerRefusal as exc:
            if exc.code == ResponseCode.ILLEGAL_OPERATION:
                raise GrpcError(Code.BAD_REQUEST, exc.remark) from None
            raise from_refusal(exc) from None
        return spb.RecallMessageResponse(status=status(), message_id=message_id)
