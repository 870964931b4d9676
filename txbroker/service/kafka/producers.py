"""Idempotent producers: per (producer id, topic, partition) sequence state (docs/kafka.md,
"Idempotent producers").

Kafka's partition leader keeps, for every producer id, its epoch and the last five batches it
appended (first and last sequence, first offset, timestamp).  A retried batch whose sequence
range equals a retained one is answered with the original offset and not stored again; an
older epoch is refused; a new epoch must start at sequence 0; within an epoch the next batch
must follow the last one (after INT32_MAX comes 0).  With no state at all (a new broker, or
state expired) any sequence is accepted, as Kafka does.  Pure bookkeeping: no I/O.

The state survives restarts and failover as Kafka's does: the coordinator's snapshots hold it
(:meth:`ProducerStates.to_doc`), and the first stored message of every idempotent batch
carries ``KAFKA_PRODUCER`` = ``pid,epoch,first sequence,last sequence``
(:func:`producer_property`), so recovery replays the batches stored after the snapshot
(:meth:`ProducerStates.replay`) from the commitlog, which replication copies to the slaves.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from txbroker.remoting.kafka.errors import ErrorCode

#: Kafka's NUM_BATCHES_TO_RETAIN: how many batches a retry can still be recognised among.
RETAINED_BATCHES = 5
INT32_MAX = 2**31 - 1
#: Idle producer state is dropped after this long (Kafka's producer.id.expiration.ms).
PRODUCER_EXPIRY_MS = 24 * 3600 * 1000

Key = tuple[int, str, int]

#: Set on the first stored message of an idempotent batch (see the module docstring).
PROPERTY_PRODUCER = "KAFKA_PRODUCER"


def producer_property(producer_id: int, epoch: int, first_seq: int, last_seq: int) -> str:
    return f"{producer_id},{epoch},{first_seq},{last_seq}"


def parse_producer_property(text: str) -> tuple[int, int, int, int] | None:
    """(producer id, epoch, first sequence, last sequence), None when it is not ours."""
    parts = text.split(",")
    if len(parts) != 4:
        return None
    try:
        pid, epoch, first, last = (int(x) for x in parts)
    except ValueError:
        return None
    return pid, epoch, first, last


@dataclass(slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    #: The partition offset of the first record; -1 for a transactional batch (placed at commit).
    first_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerState:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=RETAINED_BATCHES))
    touched_ms: int = 0


def next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


class ProducerStates:
    """Sequence state of every idempotent producer on every partition."""

    def __init__(self) -> None:
        self._states: dict[Key, ProducerState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def check(self, producer_id: int, epoch: int, topic: str, partition: int,
              first_seq: int, last_seq: int) -> tuple[ErrorCode, int | None]:
        """(NONE, None): append it; (NONE, offset): a duplicate of the batch stored at offset;
        otherwise the error to answer (§6 of docs/kafka.md's rules, in Kafka's order)."""
        state = self._states.get((producer_id, topic, partition))
        if state is None:
            return ErrorCode.NONE, None
        if epoch == state.epoch:
            for b in state.batches:
                if b.first_seq == first_seq and b.last_seq == last_seq:
                    return ErrorCode.NONE, b.first_offset
        if epoch < state.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, None
        if epoch > state.epoch:
            if first_seq != 0:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
            return ErrorCode.NONE, None
        if state.batches and first_seq != next_seq(state.batches[-1].last_seq):
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
        return ErrorCode.NONE, None

    def record(self, producer_id: int, epoch: int, topic: str, partition: int,
               meta: BatchMeta, now_ms: int) -> None:
        """Remember an appended batch (a newer epoch starts the history afresh)."""
        key = (producer_id, topic, partition)
        state = self._states.get(key)
        if state is None or epoch != state.epoch:
            state = self._states[key] = ProducerState(epoch)
        state.batches.append(meta)
        state.touched_ms = now_ms

    def replay(self, producer_id: int, epoch: int, topic: str, partition: int,
               meta: BatchMeta, now_ms: int) -> None:
        """:meth:`record` for recovery, which may see a batch the snapshot already holds (the
        replay starts before it, see the coordinator): a batch not newer than the state's is
        skipped, so replaying twice changes nothing."""
        state = self._states.get((producer_id, topic, partition))
        if state is not None:
            if epoch < state.epoch:
                return
            if epoch == state.epoch and state.batches:
                if any(b.first_seq == meta.first_seq and b.last_seq == meta.last_seq
                       for b in state.batches):
                    return
                if 0 <= meta.first_offset <= state.batches[-1].first_offset:
                    return
        self.record(producer_id, epoch, topic, partition, meta, now_ms)

    def to_doc(self) -> list[list]:
        """The whole state as JSON-ready lists (for a snapshot)."""
        return [[pid, topic, partition, s.epoch, s.touched_ms,
                 [[b.first_seq, b.last_seq, b.first_offset, b.timestamp] for b in s.batches]]
                for (pid, topic, partition), s in self._states.items()]

    def load_doc(self, doc: list[list]) -> None:
        """Replace the state with a snapshot's (:meth:`to_doc`)."""
        self._states.clear()
        for pid, topic, partition, epoch, touched, batches in doc:
            state = ProducerState(epoch, touched_ms=touched)
            state.batches.extend(BatchMeta(*b) for b in batches)
            self._states[(pid, topic, partition)] = state

    def clear(self) -> None:
        self._states.clear()

    def forget(self, producer_id: int, topic: str, partition: int, meta: BatchMeta) -> None:
        """Undo :meth:`record` of ``meta`` (its append failed, so a retry must be stored)."""
        state = self._states.get((producer_id, topic, partition))
        if state is not None and meta in state.batches:
            state.batches.remove(meta)

    def expire(self, now_ms: int, idle_ms: int = PRODUCER_EXPIRY_MS) -> int:
        """Drop state idle for ``idle_ms``; returns how many entries went."""
        old = [k for k, s in self._states.items() if now_ms - s.touched_ms > idle_ms]
        for k in old:
            del self._states[k]
        return len(old)

    def on_partition(self, topic: str, partition: int) -> list[tuple[int, ProducerState]]:
        """(producer id, state) of every producer with state on one partition, for Kafka's
        DescribeProducers."""
        return [(pid, s) for (pid, t, p), s in self._states.items() if t == topic and p == partition]
