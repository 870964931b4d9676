"""RECALL_MESSAGE (370, RocketMQ 5.3): cancel a timer message before its delivery by the recall
handle its send returned.  The timer service does the work and says why a recall fails (an
invalid handle, another topic or broker, too late, no such pending timer) with RocketMQ's
ILLEGAL_OPERATION; this handler only decodes the header and checks the topic exists."""

from __future__ import annotations

from typing import Any

from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import (
    RecallMessageRequestHeader,
    RecallMessageResponseHeader,
)
from txbroker.service.timer import TimerService
from txbroker.service.topics import TopicManager


def recall_handlers(timer: TimerService, topics: TopicManager) -> dict[int, Any]:
    """Request code -> handler, for ``RemotingServer.register``."""

    async def recall(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = RecallMessageRequestHeader.from_ext(cmd.ext_fields)
        if topics.get(h.topic) is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST,
                          f"recall failed, the topic[{h.topic}] not exist")
        msg_id = await timer.recall(h.topic, h.recall_handle)
        return cmd.response(ResponseCode.SUCCESS, None,
                            ext=RecallMessageResponseHeader(msg_id=msg_id).to_ext())

    return {RequestCode.RECALL_MESSAGE: recall}
