"""The transaction coordinator's recovery: every transactional id's metadata, the open
transactions' batches and offsets, the decided commits, the producer-id floor and the
producers' sequence state, rebuilt from the latest snapshot and the log after it.  Reads the
store and returns what it found; the coordinator (coordinator.py) takes it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from txbroker.remoting.kafka.records import RecordsError, read_batches
from txbroker.service.kafka.commit_apply import CommitProgress
from txbroker.service.kafka.producers import (
    PROPERTY_PRODUCER,
    BatchMeta,
    ProducerStates,
    parse_producer_property,
)
from txbroker.service.kafka.snapshot import read_latest
from txbroker.service.kafka.txn_log import (
    DATA_TOPIC,
    P_PARTITION,
    P_TOPIC,
    Replayed,
    StateRecord,
    replay_data,
    replay_state,
)
from txbroker.service.kafka.txn_record import Staged, TxnMeta
from txbroker.service.kafka.txn_state import TxnState
from txbroker.service.topics import is_system_topic
from txbroker.store.message_store import MessageStore
from txbroker.store.record import StoredMessage

log = logging.getLogger("txbroker.service.kafka.coordinator")


@dataclass
class Recovered:
    """What the log says the coordinator holds."""

    txns: dict[str, TxnMeta] = field(default_factory=dict)
    #: The latest snapshot's number, the state-topic queue offset it covers and when it was
    #: written (0: none).
    snapshot_no: int = 0
    snap_state_from: int = 0
    snap_ms: int = 0
    #: The highest producer-id block recorded (0: none).
    pid_upto: int = 0


def recover_txns(store: MessageStore, producers: ProducerStates, now: int) -> Recovered:
    """Rebuild every id's metadata, the open transactions (their batches staged in the
    returned ids, their offsets), the decided commits (their :class:`CommitProgress`, counted
    in the log when they are applied) and ``producers`` (cleared by the caller), from the
    latest snapshot and what the log holds after it."""
    out = Recovered()
    snap = read_latest(store)
    rep = Replayed()
    log_from = store.min_physical_offset
    if snap is not None:
        out.snapshot_no, s = snap
        rep.pid_upto = s.pid_upto
        for doc, offset in s.ids:
            rep.latest[doc["tid"]] = StateRecord(doc, offset)
        producers.load_doc(s.producers)
        out.snap_state_from, out.snap_ms = s.state_from, s.written_ms
        log_from = max(log_from, s.log_from)
    replay_state(store, start=out.snap_state_from, into=rep)
    out.pid_upto = rep.pid_upto
    for tid, rec in rep.latest.items():
        t = TxnMeta(tid, rec.doc["pid"], rec.doc["epoch"])
        t.load(rec.doc)
        t.record_offset = rec.physical_offset
        if t.state is TxnState.PREPARE_COMMIT:  # how far it got is counted at its apply
            t.progress = CommitProgress(rec.physical_offset, None)
        out.txns[tid] = t
    replay_producers(store, producers, log_from, now)
    wanted = {t.tid: t.txn for t in out.txns.values() if t.state.holds_data}
    if wanted:
        start = min(out.txns[tid].data_from for tid in wanted)
        for rec in replay_data(store, start, wanted):
            t = out.txns[rec.tid]
            if rec.group is not None:
                if t.state is TxnState.ONGOING:  # a PrepareCommit record holds the decided offsets
                    for topic, partition, offset in rec.offsets:
                        t.offsets[(rec.group, topic, partition)] = offset
                continue
            batch = read_batches(rec.data, check_crc=False)[0]
            t.stage(Staged(rec.topic, rec.partition, batch))
            producers.replay(batch.producer_id, batch.producer_epoch, rec.topic, rec.partition,
                             BatchMeta(batch.base_sequence, batch.last_sequence, -1,
                                       batch.max_timestamp), now)
    return out


def replay_producers(store: MessageStore, producers: ProducerStates, log_from: int,
                     now: int) -> None:
    """The sequence state of idempotent batches stored since ``log_from`` (their first
    message names producer, epoch and sequences; see producers.py), and of transactional
    batches staged since, whatever became of their transaction: a Kafka follower's
    producer state holds every batch it replicated, so a producer whose transactions
    completed after the snapshot continues its sequence on a promoted slave."""
    for m in store.scan(log_from):
        if m.topic == DATA_TOPIC:
            _replay_staged(producers, m, now)
            continue
        text = m.properties.get(PROPERTY_PRODUCER) if m.properties else None
        if text is None:
            continue
        parsed = parse_producer_property(text)
        if parsed is None or is_system_topic(m.topic):
            continue
        pid, epoch, first, last = parsed
        producers.replay(pid, epoch, m.topic, m.queue_id,
                         BatchMeta(first, last, m.queue_offset, m.born_timestamp),
                         m.store_timestamp or now)


def _replay_staged(producers: ProducerStates, m: StoredMessage, now: int) -> None:
    """The producer state of one transactional batch of the data topic (its offsets
    records carry no batch)."""
    topic, partition = m.properties.get(P_TOPIC), m.properties.get(P_PARTITION)
    if topic is None or partition is None:
        return
    try:
        batch = read_batches(m.body, check_crc=False)[0]
    except (RecordsError, IndexError):
        log.warning("kafka coordinator: a staged batch at commitlog offset %d does not "
                    "decode; its producer state is not replayed", m.physical_offset)
        return
    producers.replay(batch.producer_id, batch.producer_epoch, topic, int(partition),
                     BatchMeta(batch.base_sequence, batch.last_sequence, -1,
                               batch.max_timestamp), m.store_timestamp or now)
