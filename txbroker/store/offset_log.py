"""Consumer offsets in the commitlog: the system topic ``RMQ_SYS_CONSUMER_OFFSETS`` (Kafka's
``__consumer_offsets``), queue 0.

Every change of the offset table a client asks for — a RocketMQ UPDATE_CONSUMER_OFFSET or a
pull's commit-offset flag, a Kafka OffsetCommit, the offsets a Kafka transaction commits, the
delay levels' cursors, an offset expired or a group deleted — is one record of this queue,
written by the master (a slave's write gate refuses it) and replicated byte for byte by HA
like every record.  The store applies the records to its :class:`ConsumerOffsetStore` in queue
order from one place, :meth:`MessageStore.apply_offset_log`: on the master right after the
append, on a slave when the replicated record is indexed, at start-up after recovery.  So a
slave holds every offset its log holds, and a promoted slave answers what the master
acknowledged.

The record is an ordinary message (the record codec of :mod:`txbroker.store.record`); its body
is JSON, one object per record:

- ``{"set": [[group, topic, queue, offset, metadata, commit_ms], ...]}``: offsets committed
  together (``metadata`` and ``commit_ms`` are a Kafka commit's, null otherwise);
- ``{"forget": [[group, topic, queue], ...]}``: offsets removed (expired, deleted);
- ``{"set": [...], "snap": ms}``: a part of a snapshot, the whole table written again at least
  every half ``file_reserved_time`` (:func:`set_messages` with ``snap_ms``), so retention, which deletes
  whole segments older than that time, never takes the last record of an offset: a slave that
  starts empty from the master's oldest segment still gets every offset.

The offsets file (``consumerOffset.json``) is a checkpoint of the table: it records ``log``,
the queue offset of the first record it does not cover, and recovery applies the records from
there.  Retention writes it before it deletes a segment, so no record it still needs is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from txbroker.store.offsets import ConsumerOffsetStore, KafkaCommit
from txbroker.store.record import Message

log = logging.getLogger(__name__)

TOPIC = "RMQ_SYS_CONSUMER_OFFSETS"
QUEUE = 0

#: (group, topic, queue id, offset, Kafka commit or None)
OffsetRow = tuple[str, str, int, int, "KafkaCommit | None"]


def set_messages(rows: list[OffsetRow], max_bytes: int, snap_ms: int | None = None) -> list[Message]:
    """``rows`` as ``set`` records of at most ``max_bytes`` of body each (one record unless
    they do not fit); ``snap_ms``: the parts of a snapshot taken then (at least one record,
    even of an empty table)."""
    def doc(part: list[OffsetRow]) -> dict:
        d: dict = {"set": [[g, t, q, o, None if k is None else k[0], None if k is None else k[1]]
                           for g, t, q, o, k in part]}
        if snap_ms is not None:
            d["snap"] = snap_ms
        return d
    return _records(rows, max_bytes, doc, at_least_one=snap_ms is not None)


def forget_messages(keys: list[tuple[str, str, int]], max_bytes: int) -> list[Message]:
    """``keys`` as ``forget`` records of at most ``max_bytes`` of body each: an expiry pass
    over many abandoned groups must not make one record larger than a message may be (it
    would be refused, and the pass would never make progress)."""
    return _records(keys, max_bytes, lambda part: {"forget": [list(k) for k in part]})


def _records(items: list, max_bytes: int, doc: Callable[[list], dict], *,
             at_least_one: bool = False) -> list[Message]:
    """``items`` cut into as few records as fit ``max_bytes`` each (halving the share until
    one fits; a single item always makes a record)."""
    out: list[Message] = []
    chunk = max(1, len(items))
    i = 0
    while i < len(items) or (at_least_one and not out):
        part = items[i:i + chunk]
        body = orjson.dumps(doc(part))
        if len(body) > max_bytes and len(part) > 1:
            chunk = max(1, len(part) // 2)
            continue
        out.append(Message(topic=TOPIC, queue_id=QUEUE, body=body))
        i += len(part)
    return out


def apply(offsets: ConsumerOffsetStore, body: bytes, where: int) -> None:
    """Apply one record's body to ``offsets``; a body that is not one (``where``: its queue
    offset) is logged and skipped: the records after it still apply."""
    try:
        doc = orjson.loads(body)
        for g, t, q, o, metadata, commit_ms in doc.get("set", ()):
            kafka = None if metadata is None else (str(metadata), int(commit_ms))
            offsets.set(str(g), str(t), int(q), int(o), kafka=kafka)
        for g, t, q in doc.get("forget", ()):
            offsets.forget(str(g), str(t), int(q))
        if "snap" in doc:
            offsets.snapshot_ms = max(offsets.snapshot_ms, int(doc["snap"]))
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
        log.error("consumer offset record %d of %s is not one (%s): skipped", where, TOPIC, exc)
