"""Snapshots of the transaction coordinator's state (docs/kafka.md, "Transaction coordinator",
"Snapshots"), so that recovery reads the latest snapshot plus what was written after it, not
the whole history — Kafka's producer-state snapshots and compacted transaction log, on
txbroker's commitlog.

A snapshot is one JSON document: every transactional id's metadata, the producer-id floor, every idempotent producer's sequence state, the state-topic
queue offset it covers up to (``state_from``: replay the state topic from there) and the
commitlog offset from which Kafka-produced batches are replayed into the producer state
(``log_from``).  It is written to queue 0 of ``RMQ_SYS_KAFKA_TXN_SNAPSHOT`` in parts of at most
``part_size`` bytes (one snapshot may exceed ``max_message_size``); every part carries the
snapshot's number, its index and the part count, so the reader takes the newest snapshot whose
parts are all there, walking back from the queue's end past a torn one.  Sans-IO apart from the
store reads and the message building: the coordinator decides when to write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

SNAPSHOT_TOPIC = "RMQ_SYS_KAFKA_TXN_SNAPSHOT"

P_SNAP = "KSNAP"
P_PART = "KPART"
P_PARTS = "KPARTS"
#: Bytes of properties and header a part needs beside its body.
PART_OVERHEAD = 1024
#: Parts read back at most when looking for the newest whole snapshot (a snapshot of this many
#: parts of ``max_message_size`` is far beyond any real coordinator).
MAX_PARTS_WALKED = 100_000


@dataclass
class Snapshot:
    state_from: int
    log_from: int
    pid_upto: int
    #: [doc, physical offset of the id's latest state record] per id.
    ids: list[list[Any]] = field(default_factory=list)
    #: Read and ignored: snapshots of older versions carried their recent commits' consumer
    #: offsets here (the offsets file was then the only copy); a commit's offsets now go
    #: through the offset log (txbroker/store/offset_log.py).
    commits: list[list[Any]] = field(default_factory=list)
    #: ProducerStates.to_doc()
    producers: list[list[Any]] = field(default_factory=list)
    #: Written by the coordinator at this store time (ms).
    written_ms: int = 0

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        return cls(**orjson.loads(data))


def snapshot_messages(number: int, snap: Snapshot, part_size: int) -> list[Message]:
    """The parts of ``snap`` as messages for queue 0 of the snapshot topic, in order."""
    data = snap.encode()
    size = max(1, part_size - PART_OVERHEAD)
    chunks = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
    return [Message(topic=SNAPSHOT_TOPIC, queue_id=0, body=chunk,
                    properties={P_SNAP: str(number), P_PART: str(i), P_PARTS: str(len(chunks))})
            for i, chunk in enumerate(chunks)]


def read_latest(store: MessageStore) -> tuple[int, Snapshot] | None:
    """(number, snapshot) of the newest snapshot whose parts are all stored, or None."""
    low = store.min_offset(SNAPSHOT_TOPIC, 0)
    end = store.max_offset(SNAPSHOT_TOPIC, 0)
    offset = end - 1
    walked = 0
    while offset >= low and walked < MAX_PARTS_WALKED:
        last = _read(store, offset)
        walked += 1
        if last is None:
            offset -= 1
            continue
        number, part, parts = _part_of(last)
        if part != parts - 1 or offset - part < low:
            offset -= 1  # not the last part of a snapshot (a torn one): keep walking back
            continue
        chunks = [_read(store, offset - part + i) for i in range(parts)]
        walked += parts
        if all(c is not None and _part_of(c) == (number, i, parts) for i, c in enumerate(chunks)):
            try:
                return number, Snapshot.decode(b"".join(bytes(c.body) for c in chunks if c is not None))
            except (orjson.JSONDecodeError, TypeError):
                pass  # not ours to trust: an older snapshot may be whole
        offset = offset - part - 1
    return None


def _read(store: MessageStore, offset: int):
    got = store.get(SNAPSHOT_TOPIC, 0, offset, 1).messages()
    return got[0] if got and got[0].queue_offset == offset else None


def _part_of(m) -> tuple[int, int, int]:
    p = m.properties
    try:
        return int(p[P_SNAP]), int(p[P_PART]), int(p[P_PARTS])
    except (KeyError, ValueError):
        return -1, -1, 0
