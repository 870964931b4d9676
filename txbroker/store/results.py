"""What a put or a get answers: the statuses (RocketMQ's ``PutMessageStatus`` and
``GetMessageStatus``, the names the service maps to response codes), the result records, and
why a store takes no client writes (:class:`Fence`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from txbroker.store.record import StoredMessage, decode_records


class PutStatus(enum.Enum):
    #: Members are singletons compared by identity, so the identity hash will do (Enum's own
    #: hashes the name in Python, a measurable share of a transaction's dict lookups).
    __hash__ = object.__hash__

    OK = "OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    #: SYNC_MASTER: stored here, not replicated to enough slaves in time (RocketMQ counts it sent).
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    #: SYNC_MASTER: stored here, but too few slaves are connected to wait for.
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    #: Stored here, but this store may no longer speak for its group (its master lease is not
    #: known to be valid, or the in-sync set could not be shrunk): the message may or may not
    #: be delivered.  Not counted as sent (:attr:`PutResult.ok` is False): the client retries.
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"


class Fence(enum.Enum):
    """Why a store takes no client writes now (a write gate answers None when it does).

    The value is the sentence a refusal's remark and the status document show.  Replicated
    bytes never pass the gate: a slave's store appends them while fenced."""

    STARTING = "the broker is starting and does not know its role yet"
    SLAVE = "the broker is a slave: its group's master takes writes"
    PROMOTING = "the broker is becoming its group's master: writes are taken once it has recovered"
    LEASE_NOT_VALID = ("the broker's master lease is not known to be valid (the controller or "
                       "etcd has not renewed it): another replica may be promoted")
    STOPPING = "the broker is stopping"

    @property
    def text(self) -> str:
        return self.value

    @property
    def revokes_acks(self) -> bool:
        """Whether a put stored before this fence went up may still be acknowledged when its
        answer leaves after it.  Only a stopping broker may: it is still the master (its
        lease is checked too, see the roles' gate) and finishes what it took.  Any other fence
        means another replica may speak for the group: the answer is OUTCOME_UNKNOWN."""
        return self is not Fence.STOPPING


@dataclass(slots=True)
class PutResult:
    status: PutStatus
    physical_offset: int = -1
    queue_offset: int = -1
    msg_id: str = ""
    store_timestamp: int = 0
    size: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Stored (a flush or replication time-out still stored it)."""
        return self.status in _STORED

    @property
    def in_log(self) -> bool:
        """The record is in this log: acknowledged (:attr:`ok`), or answered OUTCOME_UNKNOWN
        (appended, but the answer left after this store stopped speaking for its group).

        The one answer to "did this put append?": whoever keeps memory beside the log (an
        index, a staged transaction, a count of applied records) follows it, so a retry never
        appends a second copy of what is already there.  ``ok`` answers a different question,
        whether the write may be acknowledged."""
        return self.status in _IN_LOG


_STORED = frozenset({PutStatus.OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT,
                     PutStatus.SLAVE_NOT_AVAILABLE})
_IN_LOG = _STORED | {PutStatus.OUTCOME_UNKNOWN}


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"


@dataclass
class GetResult:
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    raw: list[bytes] = field(default_factory=list)

    def messages(self) -> list[StoredMessage]:
        return decode_records(b"".join(self.raw))
