"""JSON request and response bodies: heartbeat, routes, consumer lists, queue locks, tables.

One file past the usual size on purpose: it is a catalogue, one class per wire body, read by
looking a body up, and every class reads its fields through the same lenient readers at the
top (the two writers' forms, below); split by area, those readers would become a module of
their own that every body module imports, for no gain in what one file explains.

Two writers produce these bodies and they disagree (docs/protocol.md §4.9, §8.6):
Java writes enums by name, every set, numbers as numbers; the C++ client writes enums as
ordinals, leaves out empty sets and sends ``subVersion`` as a string.  Decoders here accept both.

The route body has one more quirk: fastjson writes the ``brokerAddrs`` map (brokerId -> address)
with *unquoted* numeric keys, ``{0:"127.0.0.1:10911"}``, which is not JSON.  Old clients get
exactly that by default; Java clients from 4.9.4 on (request version >= 401) or a request with
``acceptStandardJsonOnly`` get standard JSON.  :func:`wants_standard_json` makes that choice and
:meth:`TopicRouteData.decode` reads either form.

A body that cannot be read raises :class:`BodyError`, a :class:`HeaderError`, so the server
answers it with the error code and a remark saying what is wrong.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import orjson

from txbroker.remoting.codec import DEFAULT_MAX_FRAME_SIZE
from txbroker.remoting.codes import VERSION_STANDARD_JSON_ROUTE, ResponseCode
from txbroker.remoting.header_codec import HeaderError
from txbroker.remoting.kafka.compression import inflate, inflated_size

#: BrokerData.brokerAddrs key of the master (MixAll.MASTER_ID).
MASTER_ID = 0


def broker_label(broker_name: str, address: str) -> str:
    """``<broker name>@<address>``: one name for a broker process in logs and in ``txbroker
    status``, whatever its role or the id it registers under now (a name-server id changes
    at failover; the address does not)."""
    return f"{broker_name}@{address}"


class BodyError(HeaderError):
    """A request body the broker cannot read; carries the response code and a remark."""


class ConsumeType(IntEnum):
    CONSUME_ACTIVELY = 0   # pull
    CONSUME_PASSIVELY = 1  # push


class MessageModel(IntEnum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(IntEnum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


# --- lenient readers ---------------------------------------------------------------------------


def _load(body: bytes, what: str) -> dict[str, Any]:
    if not body:
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what} body is empty")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what} body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what} body must be a JSON object")
    return doc


def _str(doc: dict[str, Any], key: str, what: str, *, required: bool = False, default: str = "") -> str:
    value = doc.get(key)
    if value is None:
        if required:
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: missing '{key}'")
        return default
    if not isinstance(value, str):
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' must be a string")
    if required and not value:
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' is empty")
    return value


def _int(doc: dict[str, Any], key: str, what: str, default: int = 0) -> int:
    """An integer written as a number or (C++) as a decimal string."""
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' must be an integer, got {value!r}")


def _bool(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return bool(value)


def _enum(doc: dict[str, Any], key: str, kind: type[IntEnum], default: IntEnum, what: str) -> Any:
    """An enum written by name (Java) or by ordinal (C++)."""
    value = doc.get(key)
    if value is None:
        return default
    try:
        if isinstance(value, str):
            return kind[value] if not value.isdigit() else kind(int(value))
        if isinstance(value, int) and not isinstance(value, bool):
            return kind(value)
    except (KeyError, ValueError):
        pass
    raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' = {value!r} is not a {kind.__name__}")


def _list(doc: dict[str, Any], key: str, what: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' must be an array")
    return value


def _objects(doc: dict[str, Any], key: str, what: str) -> list[dict[str, Any]]:
    items = _list(doc, key, what)
    for item in items:
        if not isinstance(item, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: '{key}' entries must be objects")
    return items


# --- heartbeat ---------------------------------------------------------------------------------


@dataclass(slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SubscriptionData:
        what = "subscriptionData"
        tags = _list(doc, "tagsSet", what)
        codes = _list(doc, "codeSet", what)
        if not all(isinstance(t, str) for t in tags):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: 'tagsSet' must hold strings")
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: 'codeSet' must hold integers")
        return cls(topic=_str(doc, "topic", what, required=True),
                   sub_string=_str(doc, "subString", what, default="*"),
                   tags_set=tags, code_set=codes,
                   sub_version=_int(doc, "subVersion", what),
                   expression_type=_str(doc, "expressionType", what, default="TAG") or "TAG",
                   class_filter_mode=_bool(doc, "classFilterMode"))

    def to_json(self) -> dict[str, Any]:
        return {"classFilterMode": self.class_filter_mode, "codeSet": self.code_set,
                "expressionType": self.expression_type, "subString": self.sub_string,
                "subVersion": self.sub_version, "tagsSet": self.tags_set, "topic": self.topic}


@dataclass(slots=True)
class ConsumerData:
    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscription_data_set: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ConsumerData:
        what = "consumerData"
        return cls(
            group_name=_str(doc, "groupName", what, required=True),
            consume_type=_enum(doc, "consumeType", ConsumeType, ConsumeType.CONSUME_PASSIVELY, what),
            message_model=_enum(doc, "messageModel", MessageModel, MessageModel.CLUSTERING, what),
            consume_from_where=_enum(doc, "consumeFromWhere", ConsumeFromWhere,
                                     ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, what),
            subscription_data_set=[SubscriptionData.from_json(s)
                                   for s in _objects(doc, "subscriptionDataSet", what)],
            unit_mode=_bool(doc, "unitMode"),
        )

    def to_json(self) -> dict[str, Any]:
        return {"consumeFromWhere": self.consume_from_where.name,
                "consumeType": self.consume_type.name, "groupName": self.group_name,
                "messageModel": self.message_model.name,
                "subscriptionDataSet": [s.to_json() for s in self.subscription_data_set],
                "unitMode": self.unit_mode}


@dataclass(slots=True)
class ProducerData:
    group_name: str

    def to_json(self) -> dict[str, Any]:
        return {"groupName": self.group_name}


@dataclass(slots=True)
class HeartbeatData:
    """HEART_BEAT body: which producer and consumer groups this client (connection) serves."""

    client_id: str
    producer_data_set: list[ProducerData] = field(default_factory=list)
    consumer_data_set: list[ConsumerData] = field(default_factory=list)

    @classmethod
    def decode(cls, body: bytes) -> HeartbeatData:
        what = "heartbeat"
        doc = _load(body, what)
        producers = [ProducerData(_str(p, "groupName", "producerData", required=True))
                     for p in _objects(doc, "producerDataSet", what)]
        consumers = [ConsumerData.from_json(c) for c in _objects(doc, "consumerDataSet", what)]
        return cls(_str(doc, "clientID", what, required=True), producers, consumers)

    def encode(self) -> bytes:
        return orjson.dumps({"clientID": self.client_id,
                             "consumerDataSet": [c.to_json() for c in self.consumer_data_set],
                             "producerDataSet": [p.to_json() for p in self.producer_data_set]})


# --- routes and cluster ------------------------------------------------------------------------


def wants_standard_json(version: int, accept_standard_json_only: bool = False) -> bool:
    """Whether a route/cluster answer must be standard JSON rather than fastjson's default."""
    return accept_standard_json_only or version >= VERSION_STANDARD_JSON_ROUTE


# A JSON string (left alone) or an unquoted integer object key (to be quoted).
_NUMERIC_KEY = re.compile(r'("(?:[^"\\]|\\.)*")|([{,]\s*)(-?\d+)(\s*:)')


def _quote_numeric_keys(text: str) -> str:
    return _NUMERIC_KEY.sub(lambda m: m.group(1) or f'{m.group(2)}"{m.group(3)}"{m.group(4)}', text)


def _load_fastjson(body: bytes, what: str) -> dict[str, Any]:
    """Parse standard JSON, or fastjson output with unquoted numeric map keys."""
    try:
        return _load(body, what)
    except BodyError:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what} body is not UTF-8") from None
        return _load(_quote_numeric_keys(text).encode(), what)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = 6
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "perm": self.perm,
                "readQueueNums": self.read_queue_nums, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> QueueData:
        what = "queueData"
        return cls(_str(doc, "brokerName", what, required=True),
                   _int(doc, "readQueueNums", what), _int(doc, "writeQueueNums", what),
                   _int(doc, "perm", what, 6), _int(doc, "topicSysFlag", what))


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def to_text(self, standard_json: bool) -> str:
        """JSON text; fastjson form writes the brokerId keys unquoted."""
        ids = sorted(self.broker_addrs)
        if standard_json:
            addrs = ",".join(f'"{i}":{_dumps(self.broker_addrs[i])}' for i in ids)
        else:
            addrs = ",".join(f"{i}:{_dumps(self.broker_addrs[i])}" for i in ids)
        return (f'{{"brokerAddrs":{{{addrs}}},"brokerName":{_dumps(self.broker_name)},'
                f'"cluster":{_dumps(self.cluster)}}}')

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BrokerData:
        what = "brokerData"
        raw = doc.get("brokerAddrs") or {}
        if not isinstance(raw, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: 'brokerAddrs' must be an object")
        addrs: dict[int, str] = {}
        for key, addr in raw.items():
            try:
                broker_id = int(key)
            except ValueError:
                raise BodyError(ResponseCode.SYSTEM_ERROR,
                                f"{what}: brokerAddrs key {key!r} is not a broker id") from None
            if not isinstance(addr, str):
                raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: brokerAddrs values must be strings")
            addrs[broker_id] = addr
        return cls(_str(doc, "cluster", what), _str(doc, "brokerName", what, required=True), addrs)


@dataclass(slots=True)
class TopicRouteData:
    """GET_ROUTEINFO_BY_TOPIC answer: which brokers serve a topic with how many queues."""

    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    order_topic_conf: str | None = None
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)

    def encode(self, *, standard_json: bool = False) -> bytes:
        """Sorted keys as fastjson writes them; see :func:`wants_standard_json`."""
        brokers = ",".join(b.to_text(standard_json) for b in self.broker_datas)
        parts = [f'"brokerDatas":[{brokers}]',
                 f'"filterServerTable":{_dumps(self.filter_server_table)}']
        if self.order_topic_conf is not None:
            parts.append(f'"orderTopicConf":{_dumps(self.order_topic_conf)}')
        parts.append(f'"queueDatas":{_dumps([q.to_json() for q in self.queue_datas])}')
        return ("{" + ",".join(parts) + "}").encode()

    @classmethod
    def decode(cls, body: bytes) -> TopicRouteData:
        what = "topic route"
        doc = _load_fastjson(body, what)
        table = doc.get("filterServerTable") or {}
        if not isinstance(table, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: 'filterServerTable' must be an object")
        order = doc.get("orderTopicConf")
        return cls([QueueData.from_json(q) for q in _objects(doc, "queueDatas", what)],
                   [BrokerData.from_json(b) for b in _objects(doc, "brokerDatas", what)],
                   order if isinstance(order, str) else None,
                   {str(k): list(v) if isinstance(v, list) else [] for k, v in table.items()})


@dataclass(slots=True)
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO answer."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = field(default_factory=dict)

    def encode(self, *, standard_json: bool = False) -> bytes:
        brokers = ",".join(f"{_dumps(name)}:{self.broker_addr_table[name].to_text(standard_json)}"
                           for name in sorted(self.broker_addr_table))
        clusters = _dumps({k: sorted(v) for k, v in sorted(self.cluster_addr_table.items())})
        return f'{{"brokerAddrTable":{{{brokers}}},"clusterAddrTable":{clusters}}}'.encode()

    @classmethod
    def decode(cls, body: bytes) -> ClusterInfo:
        what = "cluster info"
        doc = _load_fastjson(body, what)
        brokers = doc.get("brokerAddrTable") or {}
        clusters = doc.get("clusterAddrTable") or {}
        if not isinstance(brokers, dict) or not isinstance(clusters, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: tables must be objects")
        for value in brokers.values():
            if not isinstance(value, dict):
                raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: broker entries must be objects")
        return cls({name: BrokerData.from_json(b) for name, b in brokers.items()},
                   {name: [str(n) for n in v] if isinstance(v, list) else []
                    for name, v in clusters.items()})


# --- consumer list, queue locks, KV table ------------------------------------------------------


@dataclass(slots=True)
class ConsumerListBody:
    """GET_CONSUMER_LIST_BY_GROUP answer: the client ids a consumer rebalances across."""

    consumer_id_list: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        return orjson.dumps({"consumerIdList": self.consumer_id_list})

    @classmethod
    def decode(cls, body: bytes) -> ConsumerListBody:
        ids = _list(_load(body, "consumer list"), "consumerIdList", "consumer list")
        if not all(isinstance(i, str) for i in ids):
            raise BodyError(ResponseCode.SYSTEM_ERROR, "consumer list: ids must be strings")
        return cls(ids)


@dataclass(frozen=True, slots=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MessageQueue:
        what = "messageQueue"
        queue_id = _int(doc, "queueId", what, -1)
        if queue_id < 0:
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: 'queueId' missing or negative")
        return cls(_str(doc, "topic", what, required=True),
                   _str(doc, "brokerName", what, required=True), queue_id)


def _mq_set(doc: dict[str, Any], key: str, what: str) -> list[MessageQueue]:
    seen: dict[MessageQueue, None] = {}
    for item in _objects(doc, key, what):
        seen[MessageQueue.from_json(item)] = None
    return list(seen)


@dataclass(slots=True)
class LockBatchRequestBody:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ request (orderly consumption)."""

    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = field(default_factory=list)
    only_this_broker: bool = False

    def encode(self) -> bytes:
        return orjson.dumps({"clientId": self.client_id, "consumerGroup": self.consumer_group,
                             "mqSet": [q.to_json() for q in self.mq_set],
                             "onlyThisBroker": self.only_this_broker})

    @classmethod
    def decode(cls, body: bytes) -> LockBatchRequestBody:
        what = "lock batch request"
        doc = _load(body, what)
        return cls(_str(doc, "consumerGroup", what, required=True),
                   _str(doc, "clientId", what, required=True),
                   _mq_set(doc, "mqSet", what), _bool(doc, "onlyThisBroker"))


UnlockBatchRequestBody = LockBatchRequestBody


@dataclass(slots=True)
class LockBatchResponseBody:
    lock_ok_mq_set: list[MessageQueue] = field(default_factory=list)

    def encode(self) -> bytes:
        return orjson.dumps({"lockOKMQSet": [q.to_json() for q in self.lock_ok_mq_set]})

    @classmethod
    def decode(cls, body: bytes) -> LockBatchResponseBody:
        what = "lock batch response"
        return cls(_mq_set(_load(body, what), "lockOKMQSet", what))


@dataclass(slots=True)
class KVTable:
    """GET_BROKER_RUNTIME_INFO answer: string keys to string values."""

    table: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return orjson.dumps({"table": {k: str(v) for k, v in self.table.items()}},
                            option=orjson.OPT_SORT_KEYS)

    @classmethod
    def decode(cls, body: bytes) -> KVTable:
        doc = _load(body, "kv table")
        table = doc.get("table") or {}
        if not isinstance(table, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, "kv table: 'table' must be an object")
        return cls({str(k): v if isinstance(v, str) else _dumps(v) for k, v in table.items()})


# --- broker registration (docs/cluster.md, "Name servers and membership") ----------------------

#: The first client version whose REGISTER_BROKER carries a RegisterBrokerBody (V3_0_11); older
#: requests carry a bare TopicConfigSerializeWrapper.
VERSION_REGISTER_BODY = 37


def body_crc32(body: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32``: CRC32 masked to 31 bits (``bodyCrc32``; 0 = not checked)."""
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(slots=True)
class DataVersion:
    """A topic table's version: equal only when both timestamp and counter are.

    ``state_version`` is RocketMQ 5's ``stateVersion``: a controller-mode broker's master
    epoch, by which a name server orders id-0 registrations (docs/cluster.md); it is not part
    of the table's identity, and is written only when set (RocketMQ 4 has no such field)."""

    timestamp: int = 0
    counter: int = 0
    state_version: int = field(default=0, compare=False)

    def to_json(self) -> dict[str, Any]:
        doc = {"counter": self.counter, "timestamp": self.timestamp}
        if self.state_version:
            doc["stateVersion"] = self.state_version
        return doc

    def encode(self) -> bytes:
        return orjson.dumps(self.to_json())

    @classmethod
    def from_json(cls, doc: Any) -> DataVersion:
        what = "dataVersion"
        if not isinstance(doc, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what} must be a JSON object")
        return cls(_int(doc, "timestamp", what), _int(doc, "counter", what),
                   _int(doc, "stateVersion", what))

    @classmethod
    def decode(cls, body: bytes) -> DataVersion:
        return cls.from_json(_load(body, "data version"))


@dataclass(frozen=True, slots=True)
class TopicConfigData:
    """RocketMQ's ``TopicConfig`` as registrations carry it.  Field names match the broker's
    own ``TopicConfig`` so either can be encoded."""

    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = 6
    topic_sys_flag: int = 0
    order: bool = False

    @classmethod
    def of(cls, tc: Any) -> TopicConfigData:
        """From anything with the same attributes (the broker's TopicConfig)."""
        return cls(tc.name, tc.read_queue_nums, tc.write_queue_nums, tc.perm,
                   getattr(tc, "topic_sys_flag", 0), getattr(tc, "order", False))

    def to_json(self) -> dict[str, Any]:
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicFilterType": "SINGLE_TAG", "topicName": self.name,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TopicConfigData:
        what = "topicConfig"
        return cls(_str(doc, "topicName", what, required=True), _int(doc, "readQueueNums", what),
                   _int(doc, "writeQueueNums", what), _int(doc, "perm", what, 6),
                   _int(doc, "topicSysFlag", what), _bool(doc, "order"))

    def to_text(self) -> str:
        """``TopicConfig.encode()``: the compressed form, five space-separated fields (the
        system flag and the order flag are not carried)."""
        return f"{self.name} {self.read_queue_nums} {self.write_queue_nums} {self.perm} SINGLE_TAG"

    @classmethod
    def from_text(cls, text: str) -> TopicConfigData:
        parts = text.split(" ")
        if len(parts) < 5 or not all(p.lstrip("-").isdigit() for p in parts[1:4]):
            raise BodyError(ResponseCode.SYSTEM_ERROR,
                            f"register body: topic config {text[:80]!r} is not "
                            "'name readQueueNums writeQueueNums perm filterType'")
        return cls(parts[0], int(parts[1]), int(parts[2]), int(parts[3]))


@dataclass(slots=True)
class TopicConfigSerializeWrapper:
    """A broker's topic table with its version (a REGISTER_BROKER body from old brokers)."""

    data_version: DataVersion = field(default_factory=DataVersion)
    topic_config_table: dict[str, TopicConfigData] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"dataVersion": self.data_version.to_json(),
                "topicConfigTable": {name: tc.to_json()
                                     for name, tc in sorted(self.topic_config_table.items())}}

    @classmethod
    def from_json(cls, doc: Any) -> TopicConfigSerializeWrapper:
        what = "topicConfigSerializeWrapper"
        if not isinstance(doc, dict):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what} must be a JSON object")
        table = doc.get("topicConfigTable") or {}
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"{what}: 'topicConfigTable' must map "
                                                       "topic names to objects")
        version = doc.get("dataVersion")
        return cls(DataVersion.from_json(version) if version is not None else DataVersion(),
                   {str(name): TopicConfigData.from_json(tc) for name, tc in table.items()})

    def encode(self) -> bytes:
        return orjson.dumps(self.to_json())

    @classmethod
    def decode(cls, body: bytes) -> TopicConfigSerializeWrapper:
        return cls.from_json(_load(body, "topic config wrapper"))


@dataclass(slots=True)
class RegisterBrokerBody:
    """REGISTER_BROKER's body: JSON, or (``compressed=true``) one zlib stream of big-endian
    int32-length-prefixed items: the DataVersion JSON, the topic count then each topic's
    :meth:`TopicConfigData.to_text`, the filter-server list JSON."""

    topic_config_wrapper: TopicConfigSerializeWrapper = field(
        default_factory=TopicConfigSerializeWrapper)
    filter_server_list: list[str] = field(default_factory=list)

    def encode(self, *, compressed: bool = False) -> bytes:
        if not compressed:
            return orjson.dumps({"filterServerList": self.filter_server_list,
                                 "topicConfigSerializeWrapper": self.topic_config_wrapper.to_json()})
        wrapper = self.topic_config_wrapper
        items = [wrapper.data_version.encode()]
        topics = [tc.to_text().encode() for _, tc in sorted(wrapper.topic_config_table.items())]
        out = bytearray(_item(items[0]))
        out += struct.pack(">i", len(topics))
        for text in topics:
            out += _item(text)
        out += _item(orjson.dumps(self.filter_server_list))
        return zlib.compress(bytes(out), 9)

    @classmethod
    def decode(cls, body: bytes, *, compressed: bool = False,
               limit: int = DEFAULT_MAX_FRAME_SIZE) -> RegisterBrokerBody:
        """``limit`` bounds the inflated form of a compressed body (the name server passes
        its ``max_frame_size``: the JSON form would have had to fit one frame)."""
        if not compressed:
            doc = _load(body, "register body")
            filters = _list(doc, "filterServerList", "register body")
            return cls(TopicConfigSerializeWrapper.from_json(
                doc.get("topicConfigSerializeWrapper") or {}), [str(f) for f in filters])
        try:
            # Measured before it is inflated: the limit is a whole frame, and a few KiB that
            # claim that much must not cost it.
            raw = inflate(body, limit) if inflated_size(body, limit) is not None else None
        except zlib.error as exc:
            raise BodyError(ResponseCode.SYSTEM_ERROR,
                            f"register body: compressed body is not a zlib stream: {exc}") from None
        if raw is None:
            raise BodyError(ResponseCode.SYSTEM_ERROR,
                            f"register body: compressed body inflates past {limit} bytes")
        reader = _Items(raw)
        version = DataVersion.decode(reader.item())
        table: dict[str, TopicConfigData] = {}
        for _ in range(reader.count()):
            tc = TopicConfigData.from_text(reader.item().decode("utf-8", "replace"))
            table[tc.name] = tc
        filters = orjson.loads(reader.item()) if reader.more() else []
        if not isinstance(filters, list):
            raise BodyError(ResponseCode.SYSTEM_ERROR, "register body: filter list must be an array")
        return cls(TopicConfigSerializeWrapper(version, table), [str(f) for f in filters])


def _item(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


class _Items:
    """Reads the compressed register body's length-prefixed items; a short stream is a
    :class:`BodyError` naming where it ended."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.pos = 0

    def more(self) -> bool:
        return self.pos < len(self.raw)

    def count(self) -> int:
        if self.pos + 4 > len(self.raw):
            raise BodyError(ResponseCode.SYSTEM_ERROR,
                            f"register body: truncated at byte {self.pos} (expected a count)")
        (n,) = struct.unpack_from(">i", self.raw, self.pos)
        self.pos += 4
        if n < 0:
            raise BodyError(ResponseCode.SYSTEM_ERROR, f"register body: negative length {n}")
        return n

    def item(self) -> bytes:
        n = self.count()
        if self.pos + n > len(self.raw):
            raise BodyError(ResponseCode.SYSTEM_ERROR,
                            f"register body: truncated at byte {self.pos} (item of {n} bytes)")
        data = self.raw[self.pos:self.pos + n]
        self.pos += n
        return data
