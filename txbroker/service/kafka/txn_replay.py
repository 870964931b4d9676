"""The producers' sequence state, rebuilt from the log at the transaction coordinator's
recovery (after the latest snapshot): idempotent batches appended to partitions, and
transactional batches staged in the data topic.  Reads the store; keeps nothing."""

from __future__ import annotations

import logging

from txbroker.remoting.kafka.records import RecordsError, read_batches
from txbroker.service.kafka.producers import (
    PROPERTY_PRODUCER,
    BatchMeta,
    ProducerStates,
    parse_producer_property,
)
from txbroker.service.kafka.txn_log import DATA_TOPIC, P_PARTITION, P_TOPIC
from txbroker.service.topics import is_system_topic
from txbroker.store.message_store import MessageStore
from txbroker.store.record import StoredMessage

log = logging.getLogger("txbroker.service.kafka.coordinator")


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
