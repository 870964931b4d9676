"""The typed request and response headers of the RocketMQ 4.x codes txbroker speaks: one
keyword-only dataclass per wire header, grouped by area (send, pull, offsets, consumers,
transactions, routes, topics, txbroker's operator codes).

Each class only declares its fields (wire name, type, default, range, allowed values) with the
``h_*`` declarations of ``header_codec.py``, which holds the conversion rules and the one
generic ``from_ext``/``to_ext``; processors and the SDK both build and read headers through
these classes, so every field name exists once.

A catalogue, kept as one file on purpose: it is read by looking a header up, and one module
per area would scatter the shared constants (the V2 short-key map, the transaction types) and
give the reader several files to search for one name.
"""

from __future__ import annotations

from collections.abc import Mapping

from txbroker.remoting.codes import RequestCode
from txbroker.remoting.header_codec import (
    Header,
    HeaderError,
    h_bool,
    h_int,
    h_long,
    h_str,
    wire_header,
)

#: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE short keys (SendMessageRequestHeaderV2, docs/protocol.md §4.1).
SEND_V2_KEYS: dict[str, str] = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
    "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
    "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "bname",
}
SEND_V1_KEYS: dict[str, str] = {long: short for short, long in SEND_V2_KEYS.items()}

#: The topic RocketMQ clients name as the auto-create template.
DEFAULT_TOPIC = "TBW102"

#: END_TRANSACTION commitOrRollback values (MessageSysFlag, docs/protocol.md §5.1).
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC

#: Operator decisions accepted by TXN_DECIDE.
TXN_DECISIONS = ("commit", "rollback", "resume")
#: Which half messages TXN_LIST lists.
TXN_LIST_STATES = ("pending", "discarded", "all")


# --- send --------------------------------------------------------------------------------------


@wire_header
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (long names) and, via :meth:`from_ext_v2`, SEND_MESSAGE_V2/SEND_BATCH_MESSAGE.

    ``queue_id`` may be negative: the broker then picks a queue.  ``batch`` is also set for
    SEND_BATCH_MESSAGE by :meth:`from_command`, so processors see one type for all three codes.
    """

    producer_group: str = h_str("producerGroup")
    topic: str = h_str("topic")
    default_topic: str = h_str("defaultTopic", DEFAULT_TOPIC)
    #: Queues for an auto-created topic, capped by the broker's default; None or 0 = the
    #: broker's default (the topic table applies the cap).
    default_topic_queue_nums: int | None = h_int("defaultTopicQueueNums", None, lo=0, hi=1024)
    queue_id: int = h_int("queueId")
    sys_flag: int = h_int("sysFlag", lo=0)
    born_timestamp: int = h_long("bornTimestamp", lo=0)
    flag: int = h_int("flag")
    properties: str | None = h_str("properties", None, allow_empty=True)
    reconsume_times: int = h_int("reconsumeTimes", 0, lo=0)
    unit_mode: bool = h_bool("unitMode", False)
    #: Honoured for %RETRY% topics from client version V3_4_9 on.  Java clients send 16 for
    #: their "-1 = default", so a negative value is refused rather than read as "DLQ now".
    max_reconsume_times: int | None = h_int("maxReconsumeTimes", None, lo=0)
    batch: bool = h_bool("batch", False)
    bname: str | None = h_str("bname", None)

    @classmethod
    def from_ext_v2(cls, ext: Mapping[str, str]) -> SendMessageRequestHeader:
        """Decode the short-name (a..n) form of SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE.

        Remarks name the key the client actually sent with its long meaning, ``'b' (topic)``.
        """
        return cls._decode_keyed(ext, SEND_V1_KEYS)

    def to_ext_v2(self) -> dict[str, str]:
        return self._encode_keyed(SEND_V1_KEYS)

    @classmethod
    def from_command(cls, code: int, ext: Mapping[str, str]) -> SendMessageRequestHeader:
        """Decode the header of any of the three send codes into one type."""
        if code == RequestCode.SEND_MESSAGE:
            return cls.from_ext(ext)
        header = cls.from_ext_v2(ext)
        if code == RequestCode.SEND_BATCH_MESSAGE:
            header.batch = True
        return header


@wire_header
class SendMessageResponseHeader(Header):
    """Send result; ``msg_id`` is the offsetMsgId (a transaction's END uses it to find the half)."""

    msg_id: str = h_str("msgId")
    queue_id: int = h_int("queueId", lo=0)
    queue_offset: int = h_long("queueOffset", lo=0)
    transaction_id: str | None = h_str("transactionId", None)
    msg_region: str = h_str("MSG_REGION", "DefaultRegion")
    trace_on: bool = h_bool("TRACE_ON", False)
    #: A timer message's recall handle (RocketMQ 5.3), absent for other sends.
    recall_handle: str | None = h_str("recallHandle", None)


@wire_header
class RecallMessageRequestHeader(Header):
    """RECALL_MESSAGE (370): cancel the timer message ``recall_handle`` names."""

    producer_group: str | None = h_str("producerGroup", None)
    topic: str = h_str("topic")
    recall_handle: str = h_str("recallHandle")


@wire_header
class RecallMessageResponseHeader(Header):
    """The recalled message's id (its UNIQ_KEY)."""

    msg_id: str = h_str("msgId")


# --- pull and offsets --------------------------------------------------------------------------

#: PullSysFlag bits (docs/protocol.md §4.5).
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10


@wire_header
class PullMessageRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)
    queue_offset: int = h_long("queueOffset", lo=0)
    max_msg_nums: int = h_int("maxMsgNums", lo=1)
    sys_flag: int = h_int("sysFlag", lo=0)
    #: -1 until the consumer has committed anything (observed); any negative value means
    #: "nothing to commit", as in RocketMQ, so it is not range-checked.
    commit_offset: int = h_long("commitOffset", -1)
    suspend_timeout_millis: int = h_long("suspendTimeoutMillis", 0, lo=0)
    subscription: str | None = h_str("subscription", None, allow_empty=True)
    sub_version: int = h_long("subVersion", 0)
    expression_type: str | None = h_str("expressionType", None)

    @property
    def commit_offset_enabled(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_COMMIT_OFFSET)

    @property
    def suspend(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUBSCRIPTION)


@wire_header
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int = h_long("suggestWhichBrokerId", 0)
    next_begin_offset: int = h_long("nextBeginOffset", lo=0)
    min_offset: int = h_long("minOffset", lo=0)
    max_offset: int = h_long("maxOffset", lo=0)


@wire_header
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)
    #: RocketMQ 5: false = answer QUERY_NOT_FOUND for a group with no offset here, instead of
    #: offset 0 for a queue that still holds its first message (absent: true, as before).
    set_zero_if_not_found: bool = h_bool("setZeroIfNotFound", True)


@wire_header
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)
    commit_offset: int = h_long("commitOffset", lo=0)


@wire_header
class GetMaxOffsetRequestHeader(Header):
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)


@wire_header
class GetMinOffsetRequestHeader(Header):
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)


@wire_header
class SearchOffsetRequestHeader(Header):
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)
    timestamp: int = h_long("timestamp", lo=0)


@wire_header
class OffsetResponseHeader(Header):
    """The ``offset`` answer of GET_MAX/MIN_OFFSET, SEARCH_OFFSET and QUERY_CONSUMER_OFFSET."""

    offset: int = h_long("offset", lo=0)


QueryConsumerOffsetResponseHeader = OffsetResponseHeader


@wire_header
class ViewMessageByIdRequestHeader(Header):
    #: Commitlog offset of the record.
    offset: int = h_long("offset", lo=0)


# --- clients -----------------------------------------------------------------------------------


@wire_header
class UnregisterClientRequestHeader(Header):
    client_id: str = h_str("clientID")
    producer_group: str | None = h_str("producerGroup", None, allow_empty=True)
    consumer_group: str | None = h_str("consumerGroup", None, allow_empty=True)


@wire_header
class ConsumerSendMsgBackRequestHeader(Header):
    #: The failed message's commitlog offset.
    offset: int = h_long("offset", lo=0)
    group: str = h_str("group")
    #: 0 = the broker picks (3 + reconsume times); any negative value = straight to the DLQ.
    delay_level: int = h_int("delayLevel")
    origin_msg_id: str | None = h_str("originMsgId", None)
    origin_topic: str | None = h_str("originTopic", None)
    unit_mode: bool = h_bool("unitMode", False)
    max_reconsume_times: int | None = h_int("maxReconsumeTimes", None, lo=0)


@wire_header
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")


@wire_header
class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")


# --- transactions ------------------------------------------------------------------------------


@wire_header
class EndTransactionRequestHeader(Header):
    producer_group: str = h_str("producerGroup")
    #: The half message's queue offset (the send response's queueOffset).
    tran_state_table_offset: int = h_long("tranStateTableOffset", lo=0)
    #: The half message's commitlog offset (decoded from the send response's msgId).
    commit_log_offset: int = h_long("commitLogOffset", lo=0)
    commit_or_rollback: int = h_int("commitOrRollback")
    from_transaction_check: bool = h_bool("fromTransactionCheck", False)
    msg_id: str = h_str("msgId")
    transaction_id: str | None = h_str("transactionId", None)
    bname: str | None = h_str("bname", None)

    def __post_init__(self) -> None:
        if self.commit_or_rollback not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE,
                                           TRANSACTION_ROLLBACK_TYPE):
            raise HeaderError(self.ERROR_CODE,
                              f"header field 'commitOrRollback' = {self.commit_or_rollback} must "
                              f"be 0 (unknown), 8 (commit) or 12 (rollback)")


@wire_header
class CheckTransactionStateRequestHeader(Header):
    """Broker-to-producer check-back; the body is the half message record."""

    tran_state_table_offset: int = h_long("tranStateTableOffset", lo=0)
    commit_log_offset: int = h_long("commitLogOffset", lo=0)
    msg_id: str | None = h_str("msgId", None)
    transaction_id: str | None = h_str("transactionId", None)
    offset_msg_id: str | None = h_str("offsetMsgId", None)
    bname: str | None = h_str("bname", None)


@wire_header
class ResumeCheckHalfMessageRequestHeader(Header):
    msg_id: str = h_str("msgId")


# --- name server and admin ---------------------------------------------------------------------


@wire_header
class GetRouteInfoRequestHeader(Header):
    topic: str = h_str("topic")
    accept_standard_json_only: bool = h_bool("acceptStandardJsonOnly", False)


#: PermName bits (docs/protocol.md §4.9).
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1


@wire_header
class CreateTopicRequestHeader(Header):
    """UPDATE_AND_CREATE_TOPIC."""

    topic: str = h_str("topic")
    default_topic: str = h_str("defaultTopic", DEFAULT_TOPIC)
    #: Java marks both @CFNotNull; txbroker's own tools may leave them out, and the broker then
    #: uses its default queue count (read) and the read count (write).
    read_queue_nums: int | None = h_int("readQueueNums", None, lo=1, hi=1024)
    write_queue_nums: int | None = h_int("writeQueueNums", None, lo=1, hi=1024)
    perm: int = h_int("perm", PERM_READ | PERM_WRITE, lo=0, hi=0xF)
    topic_filter_type: str = h_str("topicFilterType", "SINGLE_TAG",
                                   choices=("SINGLE_TAG", "MULTI_TAG"))
    topic_sys_flag: int = h_int("topicSysFlag", 0, lo=0)
    order: bool = h_bool("order", False)


@wire_header
class DeleteTopicRequestHeader(Header):
    """DELETE_TOPIC_IN_BROKER (215)."""

    topic: str = h_str("topic")


@wire_header
class TxnListRequestHeader(Header):
    """TXN_LIST (txbroker admin): which half messages to list, at most ``limit`` of them."""

    state: str = h_str("state", "pending", choices=TXN_LIST_STATES)
    limit: int = h_int("limit", 1000, lo=1, hi=100_000)
    topic: str | None = h_str("topic", None)
    producer_group: str | None = h_str("producerGroup", None)


@wire_header
class TxnShowRequestHeader(Header):
    """TXN_SHOW (txbroker admin): one half message by UNIQ_KEY or offsetMsgId."""

    id: str = h_str("id")


@wire_header
class TxnDecideRequestHeader(Header):
    """TXN_DECIDE (txbroker admin): an operator's commit/rollback/resume, recorded with who."""

    id: str = h_str("id")
    decision: str = h_str("decision", choices=TXN_DECISIONS)
    operator: str = h_str("operator")
    reason: str | None = h_str("reason", None, allow_empty=True)


@wire_header
class KafkaTxnListRequestHeader(Header):
    """KAFKA_TXN_LIST (txbroker admin): every Kafka transactional id, only the open ones, or
    only those open past their timeout (``hanging``)."""

    open_only: bool = h_bool("openOnly", False)
    hanging: bool = h_bool("hanging", False)


@wire_header
class KafkaTxnAbortRequestHeader(Header):
    """KAFKA_TXN_ABORT (txbroker admin): an operator's abort of a Kafka transaction."""

    transactional_id: str = h_str("transactionalId")
    operator: str = h_str("operator")


# --- broker registration (docs/cluster.md, "Name servers and membership") ----------------------


@wire_header
class RegisterBrokerRequestHeader(Header):
    """REGISTER_BROKER: who the broker is; the body holds its topic table.  ``broker_id`` 0 is
    the group's master.  ``body_crc32`` 0 = not checked."""

    broker_name: str = h_str("brokerName")
    broker_addr: str = h_str("brokerAddr")
    cluster_name: str = h_str("clusterName")
    ha_server_addr: str = h_str("haServerAddr")
    broker_id: int = h_long("brokerId", lo=0)
    compressed: bool = h_bool("compressed", False)
    body_crc32: int = h_int("bodyCrc32", 0)


@wire_header
class RegisterBrokerResponseHeader(Header):
    """Filled for a slave's registration only, once its group's master is registered."""

    ha_server_addr: str | None = h_str("haServerAddr", None)
    master_addr: str | None = h_str("masterAddr", None)


@wire_header
class UnRegisterBrokerRequestHeader(Header):
    broker_name: str = h_str("brokerName")
    broker_addr: str = h_str("brokerAddr")
    cluster_name: str = h_str("clusterName")
    broker_id: int = h_long("brokerId", lo=0)


@wire_header
class QueryDataVersionRequestHeader(Header):
    """QUERY_DATA_VERSION: the body is the broker's DataVersion JSON."""

    broker_name: str = h_str("brokerName")
    broker_addr: str = h_str("brokerAddr")
    cluster_name: str = h_str("clusterName")
    broker_id: int = h_long("brokerId", lo=0)


@wire_header
class QueryDataVersionResponseHeader(Header):
    changed: bool = h_bool("changed", False)
