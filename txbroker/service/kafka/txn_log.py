"""The transaction coordinator's durable records: two system topics of the commitlog
(docs/kafka.md, "Transaction coordinator").

``RMQ_SYS_KAFKA_TXN_STATE`` (queue 0) holds one JSON record per state change of a
transactional id — the whole metadata each time, so the latest record of an id is its state —
the producer-id blocks handed out (``{"pid_block": upto}``: ids below ``upto`` may have
been used, so a restart allocates from ``upto`` on) and the tombstones of expired ids
(``{"tid", "pid", "expired": true}``).  ``RMQ_SYS_KAFKA_TXN_DATA`` (queue 0)
holds what an open transaction has gathered: each transactional Produce batch exactly as
received (properties: transactional id, transaction number, topic, partition) and each
TxnOffsetCommit's offsets (JSON, with the group).  The transaction number (``txn``) counts the
transactions of an id, so a replay takes only the data of the transaction its state names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message, StoredMessage

STATE_TOPIC = "RMQ_SYS_KAFKA_TXN_STATE"
DATA_TOPIC = "RMQ_SYS_KAFKA_TXN_DATA"

P_TID = "KTID"
P_TXN = "KTXN"
P_TOPIC = "KTOPIC"
P_PARTITION = "KPART"
P_GROUP = "KGROUP"

#: Kafka records are born at the client; the commitlog's born host is not known here.
BORN_HOST = ("127.0.0.1", 0)

#: (group, topic, partition, offset)
Offset = tuple[str, str, int, int]


def state_message(doc: dict) -> Message:
    return Message(topic=STATE_TOPIC, queue_id=0, body=orjson.dumps(doc))


def pid_block_message(upto: int) -> Message:
    return Message(topic=STATE_TOPIC, queue_id=0, body=orjson.dumps({"pid_block": upto}))


def expired_message(tid: str, pid: int) -> Message:
    """The tombstone of an expired transactional id (it names the producer id, so the floor
    replay derives from the state topic never falls)."""
    return Message(topic=STATE_TOPIC, queue_id=0,
                   body=orjson.dumps({"tid": tid, "pid": pid, "expired": True}))


def batch_message(tid: str, txn: int, topic: str, partition: int, data: bytes) -> Message:
    return Message(topic=DATA_TOPIC, queue_id=0, body=data,
                   properties={P_TID: tid, P_TXN: str(txn), P_TOPIC: topic,
                               P_PARTITION: str(partition)})


def offsets_message(tid: str, txn: int, group: str, offsets: list[tuple[str, int, int]]) -> Message:
    return Message(topic=DATA_TOPIC, queue_id=0, body=orjson.dumps(offsets),
                   properties={P_TID: tid, P_TXN: str(txn), P_GROUP: group})


def read_queue(store: MessageStore, topic: str, start: int = 0) -> Iterator[tuple[int, StoredMessage]]:
    """(queue offset, message) of queue 0 of ``topic`` from ``start`` to its end."""
    offset = max(start, store.min_offset(topic, 0))
    end = store.max_offset(topic, 0)
    while offset < end:
        result = store.get(topic, 0, offset, 256)
        msgs = result.messages()
        if not msgs:
            if result.next_offset <= offset:
                return
            offset = result.next_offset
            continue
        for m in msgs:
            yield m.queue_offset, m
        offset = msgs[-1].queue_offset + 1


@dataclass
class StateRecord:
    doc: dict
    physical_offset: int


@dataclass
class Replayed:
    """What the state topic says: the latest record of every id and the producer-id floor."""

    latest: dict[str, StateRecord] = field(default_factory=dict)
    pid_upto: int = 0


def replay_state(store: MessageStore, start: int = 0, into: Replayed | None = None) -> Replayed:
    """Apply the state records from queue offset ``start`` on to ``into`` (a snapshot's
    state; empty when None)."""
    out = into if into is not None else Replayed()
    for _, m in read_queue(store, STATE_TOPIC, start):
        doc = orjson.loads(m.body)
        if "pid_block" in doc:
            out.pid_upto = max(out.pid_upto, doc["pid_block"])
            continue
        out.pid_upto = max(out.pid_upto, doc["pid"] + 1)
        if doc.get("expired"):
            out.latest.pop(doc["tid"], None)
            continue
        out.latest[doc["tid"]] = StateRecord(doc, m.physical_offset)
    return out


@dataclass
class DataRecord:
    tid: str
    queue_offset: int
    topic: str | None = None
    partition: int = -1
    data: bytes = b""
    group: str | None = None
    offsets: list[tuple[str, int, int]] = field(default_factory=list)


def replay_data(store: MessageStore, start: int, wanted: dict[str, int]) -> Iterator[DataRecord]:
    """The data records from queue offset ``start`` on of each transactional id in ``wanted``
    whose transaction number is the one given."""
    for qoff, m in read_queue(store, DATA_TOPIC, start):
        p = m.properties
        tid = p.get(P_TID)
        if tid is None or wanted.get(tid) != int(p.get(P_TXN, "-1")):
            continue
        if P_GROUP in p:
            yield DataRecord(tid, qoff, group=p[P_GROUP],
                             offsets=[tuple(o) for o in orjson.loads(m.body)])
        else:
            yield DataRecord(tid, qoff, topic=p[P_TOPIC], partition=int(p[P_PARTITION]),
                             data=m.body)
