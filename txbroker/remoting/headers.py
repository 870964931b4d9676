"""Typed request and response headers: extFields (string -> string) in, dataclasses out.

RocketMQ flattens each "custom header" object into extFields by field name and converts the
strings back by declared type (docs/protocol.md §2.5).  Here every header is a dataclass whose fields
declare their wire name, type, whether they are required and their valid range; one generic
``from_ext``/``to_ext`` pair does the conversion, so processors receive typed, validated values
and never parse strings themselves.  ``from_ext`` runs a per-class decoder compiled once from
the field declarations (one converter per field), because SEND decodes a header per message.

Field checks live here (presence, type, range, allowed values); checks against broker state
(does the topic exist, is the queue id below the topic's queue count, permissions) stay in the
processors.

Conversions follow Java's rules with the leniency real clients need:

* integers are int32 (``Integer``) or int64 (``Long``), range-checked;
* booleans are ``true``/``false`` or ``1``/``0`` in any case, because the C++ client sends
  ``"0"``/``"1"`` where Java's ``Boolean.parseBoolean`` would read ``"1"`` as false
  (docs/protocol.md §8.2: a Java broker silently ignores C++ batches); any other text is an
  ill-typed field and refused, like a non-numeric integer;
* a required field that is missing, empty or ill-typed raises :class:`HeaderError` carrying the
  response code to answer with and a remark that names the field.

Response headers and broker-to-client requests are encoded with ``to_ext``, which writes
strings only: the C++ client ignores values that are JSON numbers (docs/protocol.md §8.3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.errors import Refusal

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)

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


class HeaderError(Refusal):
    """A header or body the broker refuses: answer with ``code`` and ``remark``.

    This is the peer's mistake, not ours: a :class:`Refusal`, so the server turns it into an
    error response and keeps the connection.
    """


# --- field declarations ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spec:
    """How one dataclass field maps to one extFields entry."""

    attr: str
    wire: str
    kind: str  # "str" | "int" | "long" | "bool"
    required: bool
    lo: int | None
    hi: int | None
    choices: tuple[str, ...] | None
    allow_empty: bool


def _field(wire: str, kind: str, default: Any, *, lo: int | None = None, hi: int | None = None,
           choices: tuple[str, ...] | None = None, allow_empty: bool = False) -> Any:
    meta = {"wire": wire, "kind": kind, "lo": lo, "hi": hi, "choices": choices,
            "allow_empty": allow_empty}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def h_str(wire: str, default: Any = MISSING, *, choices: tuple[str, ...] | None = None,
          allow_empty: bool = False) -> Any:
    """A String field; required (and non-empty unless ``allow_empty``) without a default."""
    return _field(wire, "str", default, choices=choices, allow_empty=allow_empty)


def h_int(wire: str, default: Any = MISSING, *, lo: int | None = None, hi: int | None = None) -> Any:
    """An Integer (int32) field."""
    return _field(wire, "int", default, lo=lo, hi=hi)


def h_long(wire: str, default: Any = MISSING, *, lo: int | None = None, hi: int | None = None) -> Any:
    """A Long (int64) field."""
    return _field(wire, "long", default, lo=lo, hi=hi)


def h_bool(wire: str, default: Any = MISSING) -> Any:
    """A boolean field: true/1 (any case) is true, anything else false."""
    return _field(wire, "bool", default)


_SPECS: dict[type, tuple[_Spec, ...]] = {}
_BOUNDS = {"int": INT32, "long": INT64}

#: Accepted boolean spellings (after strip/lower): Java writes true/false, the C++ client 1/0.
_BOOLS = {"true": True, "false": False, "1": True, "0": False}

H = TypeVar("H", bound="Header")

#: One step of a compiled decoder: (attribute, wire key, fallback key or None, converter or
#: None for a plain string, required, allow_empty, the field's name as remarks spell it).
_Step = tuple[str, str, str | None, Callable[[str], Any] | None, bool, bool, str]


class Header:
    """Base of all typed headers; subclasses are keyword-only dataclasses using ``h_*`` fields."""

    __slots__ = ()

    #: Response code for a refused header of this kind.
    ERROR_CODE: ClassVar[int] = ResponseCode.SYSTEM_ERROR

    @classmethod
    def _specs(cls) -> tuple[_Spec, ...]:
        specs = _SPECS.get(cls)
        if specs is None:
            specs = tuple(
                _Spec(f.name, f.metadata["wire"], f.metadata["kind"],
                      f.default is MISSING and f.default_factory is MISSING,
                      f.metadata["lo"], f.metadata["hi"], f.metadata["choices"],
                      f.metadata["allow_empty"])
                for f in fields(cls)  # type: ignore[arg-type]
                if "wire" in f.metadata
            )
            _SPECS[cls] = specs
        return specs

    @classmethod
    def _plan(cls, keys: Mapping[str, str] | None = None) -> tuple[_Step, ...]:
        """The decoder for this class, compiled once (per key map) and cached.

        ``keys`` renames wire keys (SEND_MESSAGE_V2's one-letter keys); the long name stays
        readable as a fallback and remarks name both, e.g. ``'b' (topic)``.
        """
        cache_key = (cls, id(keys))
        plan = _PLANS.get(cache_key)
        if plan is None:
            steps = []
            for spec in cls._specs():
                short = keys.get(spec.wire) if keys else None
                wire, fallback = (short, spec.wire) if short else (spec.wire, None)
                name = f"'{short}' ({spec.wire})" if short else f"'{spec.wire}'"
                steps.append((spec.attr, wire, fallback, _converter(cls, spec, name),
                              spec.required, spec.allow_empty, name))
            plan = _PLANS[cache_key] = tuple(steps)
        return plan

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        """Decode and validate; raises :class:`HeaderError` naming the offending field."""
        return cls._decode(ext, cls._plan())

    @classmethod
    def _decode(cls, ext: Mapping[str, str], plan: tuple[_Step, ...]) -> Self:
        values: dict[str, Any] = {}
        get = ext.get
        for attr, wire, fallback, convert, required, allow_empty, name in plan:
            raw = get(wire)
            if raw is None and fallback is not None:
                raw = get(fallback)
            if raw is None:
                if required:
                    raise HeaderError(cls.ERROR_CODE, f"missing header field {name}")
                continue
            if raw == "" and not allow_empty:
                if required:
                    raise HeaderError(cls.ERROR_CODE, f"header field {name} is empty")
                continue  # an empty optional value means "not set", as Java's null
            values[attr] = raw if convert is None else convert(raw)
        return cls(**values)

    def to_ext(self) -> dict[str, str]:
        """extFields for the wire: strings only, absent (None) fields left out."""
        out: dict[str, str] = {}
        for spec in self._specs():
            value = getattr(self, spec.attr)
            if value is None:
                continue
            if spec.kind == "bool":
                out[spec.wire] = "true" if value else "false"
            else:
                out[spec.wire] = value if isinstance(value, str) else str(int(value))
        return out


_PLANS: dict[tuple[type, int], tuple[_Step, ...]] = {}


def _converter(cls: type[Header], spec: _Spec, name: str) -> Callable[[str], Any] | None:
    """A function from the wire string to the field's value, raising HeaderError; None for a
    plain string (no conversion, no check)."""
    code = cls.ERROR_CODE
    kind = spec.kind
    if kind == "str":
        choices = spec.choices
        if choices is None:
            return None

        def to_choice(raw: str) -> str:
            if raw not in choices:
                raise HeaderError(code, f"header field {name} must be one of "
                                        f"{', '.join(choices)}, got {raw!r}")
            return raw
        return to_choice
    if kind == "bool":
        def to_bool(raw: str) -> bool:
            value = _BOOLS.get(raw)
            if value is None:
                value = _BOOLS.get(raw.strip().lower())
                if value is None:
                    raise HeaderError(code, f"header field {name} must be a boolean "
                                            f"(true/false or 1/0), got {raw[:40]!r}")
            return value
        return to_bool
    type_lo, type_hi = _BOUNDS[kind]
    lo = type_lo if spec.lo is None else max(type_lo, spec.lo)
    hi = type_hi if spec.hi is None else min(type_hi, spec.hi)
    label = "an integer" if kind == "int" else "a long integer"
    width = "an int32" if kind == "int" else "an int64"

    def to_int(raw: str) -> int:
        try:
            if "_" in raw:  # Python's int() takes "1_000"; Java's parseLong does not
                raise ValueError
            value = int(raw)
        except ValueError:
            raise HeaderError(code, f"header field {name} must be {label}, "
                                    f"got {raw[:40]!r}") from None
        if lo <= value <= hi:
            return value
        if not type_lo <= value <= type_hi:
            raise HeaderError(code, f"header field {name} = {value} is out of range for {width}")
        if value < lo:
            raise HeaderError(code, f"header field {name} = {value} must be >= {lo}")
        raise HeaderError(code, f"header field {name} = {value} must be <= {hi}")
    return to_int


_header = dataclass(kw_only=True, slots=True)


# --- send --------------------------------------------------------------------------------------


@_header
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
        return cls._decode(ext, cls._plan(SEND_V1_KEYS))

    def to_ext_v2(self) -> dict[str, str]:
        return {SEND_V1_KEYS[k]: v for k, v in self.to_ext().items()}

    @classmethod
    def from_command(cls, code: int, ext: Mapping[str, str]) -> SendMessageRequestHeader:
        """Decode the header of any of the three send codes into one type."""
        if code == RequestCode.SEND_MESSAGE:
            return cls.from_ext(ext)
        header = cls.from_ext_v2(ext)
        if code == RequestCode.SEND_BATCH_MESSAGE:
            header.batch = True
        return header


@_header
class SendMessageResponseHeader(Header):
    """Send result; ``msg_id`` is the offsetMsgId (a transaction's END uses it to find the half)."""

    msg_id: str = h_str("msgId")
    queue_id: int = h_int("queueId", lo=0)
    queue_offset: int = h_long("queueOffset", lo=0)
    transaction_id: str | None = h_str("transactionId", None)
    msg_region: str = h_str("MSG_REGION", "DefaultRegion")
    trace_on: bool = h_bool("TRACE_ON", False)


# --- pull and offsets --------------------------------------------------------------------------

#: PullSysFlag bits (docs/protocol.md §4.5).
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10


@_header
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


@_header
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int = h_long("suggestWhichBrokerId", 0)
    next_begin_offset: int = h_long("nextBeginOffset", lo=0)
    min_offset: int = h_long("minOffset", lo=0)
    max_offset: int = h_long("maxOffset", lo=0)


@_header
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)


@_header
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)
    commit_offset: int = h_long("commitOffset", lo=0)


@_header
class GetMaxOffsetRequestHeader(Header):
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)


@_header
class GetMinOffsetRequestHeader(Header):
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)


@_header
class SearchOffsetRequestHeader(Header):
    topic: str = h_str("topic")
    queue_id: int = h_int("queueId", lo=0)
    timestamp: int = h_long("timestamp", lo=0)


@_header
class OffsetResponseHeader(Header):
    """The ``offset`` answer of GET_MAX/MIN_OFFSET, SEARCH_OFFSET and QUERY_CONSUMER_OFFSET."""

    offset: int = h_long("offset", lo=0)


QueryConsumerOffsetResponseHeader = OffsetResponseHeader


@_header
class ViewMessageByIdRequestHeader(Header):
    #: Commitlog offset of the record.
    offset: int = h_long("offset", lo=0)


# --- clients -----------------------------------------------------------------------------------


@_header
class UnregisterClientRequestHeader(Header):
    client_id: str = h_str("clientID")
    producer_group: str | None = h_str("producerGroup", None, allow_empty=True)
    consumer_group: str | None = h_str("consumerGroup", None, allow_empty=True)


@_header
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


@_header
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")


@_header
class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str = h_str("consumerGroup")


# --- transactions ------------------------------------------------------------------------------


@_header
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


@_header
class CheckTransactionStateRequestHeader(Header):
    """Broker-to-producer check-back; the body is the half message record."""

    tran_state_table_offset: int = h_long("tranStateTableOffset", lo=0)
    commit_log_offset: int = h_long("commitLogOffset", lo=0)
    msg_id: str | None = h_str("msgId", None)
    transaction_id: str | None = h_str("transactionId", None)
    offset_msg_id: str | None = h_str("offsetMsgId", None)
    bname: str | None = h_str("bname", None)


@_header
class ResumeCheckHalfMessageRequestHeader(Header):
    msg_id: str = h_str("msgId")


# --- name server and admin ---------------------------------------------------------------------


@_header
class GetRouteInfoRequestHeader(Header):
    topic: str = h_str("topic")
    accept_standard_json_only: bool = h_bool("acceptStandardJsonOnly", False)


#: PermName bits (docs/protocol.md §4.9).
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1


@_header
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


@_header
class DeleteTopicRequestHeader(Header):
    """DELETE_TOPIC_IN_BROKER (215)."""

    topic: str = h_str("topic")


@_header
class TxnListRequestHeader(Header):
    """TXN_LIST (txbroker admin): which half messages to list, at most ``limit`` of them."""

    state: str = h_str("state", "pending", choices=TXN_LIST_STATES)
    limit: int = h_int("limit", 1000, lo=1, hi=100_000)
    topic: str | None = h_str("topic", None)
    producer_group: str | None = h_str("producerGroup", None)


@_header
class TxnShowRequestHeader(Header):
    """TXN_SHOW (txbroker admin): one half message by UNIQ_KEY or offsetMsgId."""

    id: str = h_str("id")


@_header
class TxnDecideRequestHeader(Header):
    """TXN_DECIDE (txbroker admin): an operator's commit/rollback/resume, recorded with who."""

    id: str = h_str("id")
    decision: str = h_str("decision", choices=TXN_DECISIONS)
    operator: str = h_str("operator")
    reason: str | None = h_str("reason", None, allow_empty=True)
