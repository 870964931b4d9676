"""Request, response, language and serialization codes of the RocketMQ 4.x remoting protocol.

Values follow RocketMQ's ``RequestCode``/``ResponseCode`` (docs/protocol.md §3).  txbroker's own admin
requests live in a private range, 9001-9099, far from any RocketMQ code so that a RocketMQ
broker answers them with REQUEST_CODE_NOT_SUPPORTED instead of misreading them.
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_ALL_CONSUMER_OFFSET = 43
    #: Not served by txbroker; named because RocketMQ's ACL makes it admin-only.
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    #: Not served by txbroker; named because RocketMQ's ACL makes them admin-only.
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    DELETE_SUBSCRIPTIONGROUP = 207
    DELETE_TOPIC_IN_BROKER = 215
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    #: RocketMQ 5.3: cancel a timer message before its delivery, by its recall handle.
    RECALL_MESSAGE = 370
    # --- controller (RocketMQ 5.x controller mode, docs/cluster.md) ---
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    # --- txbroker admin (private range) ---
    #: List pending (or discarded) half messages; JSON body.
    TXN_LIST = 9001
    #: One half message by id (UNIQ_KEY or offsetMsgId); JSON body.
    TXN_SHOW = 9002
    #: Operator decision on a half: commit, rollback or resume (re-check a discarded one).
    TXN_DECIDE = 9003
    #: Topics, queue offsets, consumer groups, pending halves and key metrics as JSON.
    BROKER_STATUS = 9004
    #: Kafka transactions the coordinator knows (or only the hanging ones); JSON body.
    #: A Kafka transactional id is also answered by TXN_SHOW.
    KAFKA_TXN_LIST = 9005
    #: Operator abort of a Kafka transaction: the producer's epoch is fenced.
    KAFKA_TXN_ABORT = 9006
    #: Name server: the brokers it dropped (connection closed, silent past the expiry,
    #: unregistered) and since when, until they register again; JSON body.
    BROKERS_DOWN = 9007


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_MESSAGE = 208
    FLOW_CONTROL = 215
    #: RocketMQ 5.3's answer to a recall it cannot carry out (bad handle, too late).
    ILLEGAL_OPERATION = 604
    # --- controller mode ---
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_BROKER_ID_INVALID = 2014


class LanguageCode(IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


#: Flag bits (RemotingCommand): bit 0 = response, bit 1 = one-way request.
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

#: What txbroker reports as its version: RocketMQ 4.9.8's ordinal, so Java clients get the
#: standard-JSON route format they ask for.
VERSION_4_9_8 = 409
#: At or above this request version the name server answers standard JSON (V4_9_4).
VERSION_STANDARD_JSON_ROUTE = 401
