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
- ``{"forget": [[group, topic, queue], ...]}``: offsets removed (expired, deleted).

The offsets file (``consumerOffset.json``) is a checkpoint of the table: it records ``log``,
the queue offset of the first record it does not cover, and recovery applies the records from
there.  Retention writes it before it deletes a segment, so no record it still needs is lost.
"""

from __future__ import annotations

import logging

import orjson

from txbroker.store.offsets import ConsumerOffsetStore, KafkaCommit
from txbroker.store.record import Message

log = logging.getLogger(__name__)

TOPIC = "RMQ_SYS_CONSUMER_OFFSETS"
QUEUE = 0

#: (group, topic, queue id, offset, Kafka commit or None)
OffsetRow = tuple[str, str, int, int, "KafkaCommit | None"]


def set_message(rows: list[OffsetRow]) -> Message:
    body = orjson.dumps({"set": [[g, t, q, o, None if k is None else k[0],
                                  None if k is None else k[1]] for g, t, q, o, k in rows]})
    return Message(topic=TOPIC, queue_id=QUEUE, body=body)


def forget_message(keys: list[tuple[str, str, int]]) -> Message:
    return Message(topic=TOPIC, queue_id=QUEUE,
                   body=orjson.dumps({"forget": [list(k) for k in keys]}))


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
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
        log.error("consumer offset record %d of %s is not one (%s): skipped", where, TOPIC, exc)
