"""What a store status becomes on the wire: tables keyed by the store's enums.

RocketMQ's SendMessageProcessor and PullMessageProcessor translate ``PutMessageStatus`` and
``GetMessageStatus`` into response codes with one switch each; these tables are that switch,
in one place for every processor.  Being keyed by the enum members (not their names), a status
added to the store without a row here fails ``tests/service/test_statuses.py`` instead of
being answered by some fallback.
"""

from __future__ import annotations

from txbroker.remoting.codes import ResponseCode
from txbroker.store.message_store import GetStatus, PutStatus

#: Put status -> (response code, remark when the store gave no reason).  OK, FLUSH_DISK_TIMEOUT,
#: FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE are stored messages (the flush happens later, RocketMQ counts it a
#: success): they are answered with the send result; the others are refusals.
PUT_ANSWERS: dict[PutStatus, tuple[ResponseCode, str | None]] = {
    PutStatus.OK: (ResponseCode.SUCCESS, None),
    PutStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, "flush to disk timed out"),
    PutStatus.FLUSH_SLAVE_TIMEOUT: (ResponseCode.FLUSH_SLAVE_TIMEOUT,
                                    "replication to the slave timed out"),
    PutStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, "no slave available"),
    PutStatus.MESSAGE_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL,
                                "message refused by the store: MESSAGE_ILLEGAL"),
    PutStatus.PROPERTIES_SIZE_EXCEEDED: (ResponseCode.MESSAGE_ILLEGAL,
                                         "message refused by the store: PROPERTIES_SIZE_EXCEEDED"),
    PutStatus.SERVICE_NOT_AVAILABLE: (ResponseCode.SERVICE_NOT_AVAILABLE,
                                      "store not available: SERVICE_NOT_AVAILABLE"),
    # Stored but not acknowledged (docs/cluster.md, "Fencing"): SYSTEM_ERROR is not a send
    # result to RocketMQ clients, who retry it (MQBrokerException, retryResponseCodes).
    PutStatus.OUTCOME_UNKNOWN: (ResponseCode.SYSTEM_ERROR,
                                "the message may or may not be delivered: OUTCOME_UNKNOWN"),
}

#: Get status -> (response code, remark) of a PULL_MESSAGE answer.  The remark is the status's
#: name, as RocketMQ sends it; a consumer reacts to the code only: PULL_NOT_FOUND waits (or
#: holds the pull), PULL_OFFSET_MOVED corrects its offset, PULL_RETRY_IMMEDIATELY pulls again
#: from ``nextBeginOffset`` (nothing matched the filter, or a hole in the queue).
GET_ANSWERS: dict[GetStatus, tuple[ResponseCode, str | None]] = {
    GetStatus.FOUND: (ResponseCode.SUCCESS, None),
    GetStatus.NO_MESSAGE_IN_QUEUE: (ResponseCode.PULL_NOT_FOUND, "NO_MESSAGE_IN_QUEUE"),
    GetStatus.OFFSET_OVERFLOW_ONE: (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE"),
    GetStatus.NO_MATCHED_LOGIC_QUEUE: (ResponseCode.PULL_NOT_FOUND, "NO_MATCHED_LOGIC_QUEUE"),
    GetStatus.OFFSET_TOO_SMALL: (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL"),
    GetStatus.OFFSET_OVERFLOW_BADLY: (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY"),
    GetStatus.NO_MATCHED_MESSAGE: (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE"),
    GetStatus.OFFSET_FOUND_NULL: (ResponseCode.PULL_RETRY_IMMEDIATELY, "OFFSET_FOUND_NULL"),
}
