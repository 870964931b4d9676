"""A participant's side of a Kafka transaction that spans broker groups (docs/kafka.md,
"Kafka on a cluster").

A transaction's coordinator lives in one broker group; its partitions and its consumer
group's coordinator may live in others.  Those other groups' masters *stage* what the
transaction sends them — each transactional Produce batch as received, each TxnOffsetCommit's
offsets — in their own system topic ``RMQ_SYS_KAFKA_TXN_STAGED`` (so it is replicated with
their log and survives their failover), invisible to every consumer, keyed by producer id and
epoch.  Nothing reaches a partition until the coordinator's WriteTxnMarkers says how the
transaction ended (:mod:`markers`):

- a *commit* marker (producer id, epoch, transaction number) first writes a marker record
  here (the decision, now durable in this group too), then appends every staged record of
  that producer id and epoch to its partition in one ``put_chain`` (each carrying the marker
  record's commitlog offset in ``prepared_transaction_offset``), sets the staged offsets, and
  writes a done record;
- an *abort* marker drops what is staged (one marker record, so a replay drops it too);
- a marker is idempotent: the transaction number of the last marker of each producer id is
  kept, so a marker sent again (a lost answer, a resend at the coordinator's recovery, a
  delayed duplicate) changes nothing, or finishes an apply a crash interrupted; staged
  batches of an older epoch than a marker's are a fenced producer's and never applied.

Recovery replays the topic: what is still staged, the last transaction and epoch of each
producer id, and how far an interrupted commit got (the records tied to its marker record),
which :meth:`TxnStaging.start` finishes without waiting for the coordinator to ask again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import RecordBatch, RecordsError, read_batches
from txbroker.service.kafka.commit_apply import (
    ApplyRefused,
    CommitProgress,
    apply_decided,
)
from txbroker.service.kafka.mapping import record_to_message
from txbroker.service.kafka.producers import BatchMeta, ProducerStates
from txbroker.service.kafka.txn_log import BORN_HOST, read_queue
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

log = logging.getLogger("txbroker.kafka")

STAGED_TOPIC = "RMQ_SYS_KAFKA_TXN_STAGED"

P_KIND = "KKIND"
P_PID = "KPID"
P_EPOCH = "KEPOCH"
P_TXN = "KTXN"
P_TOPIC = "KTOPIC"
P_QUEUE = "KQUEUE"
P_GROUP = "KGROUP"


class Kind(enum.Enum):
    """What a record of the staged topic holds (its ``KKIND`` property; the values are what
    the log holds, so they never change)."""

    BATCH = "batch"
    OFFSETS = "offsets"
    COMMIT = "commit"
    ABORT = "abort"
    DONE = "done"

    @classmethod
    def of(cls, text: str | None) -> Kind | None:
        """The kind a record's property names (None: none this version knows)."""
        try:
            return cls(text)
        except ValueError:
            return None

#: (consumer group, topic, broker group owning the queue, queue id, offset)
StagedOffset = tuple[str, str, str, int, int]
#: Stores a consumer offset in another broker group: (broker group, group, topic, queue,
#: offset) -> stored.
RemoteCommit = Callable[[str, str, str, int, int], Awaitable[bool]]


class StagingUnavailable(Exception):
    """A record could not be stored or an offset not set: the marker is answered with a
    retriable error and the coordinator sends it again."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


@dataclass(slots=True)
class _Entry:
    epoch: int
    topic: str = ""
    queue: int = -1
    batch: RecordBatch | None = None
    offsets: list[StagedOffset] = field(default_factory=list)
    #: Bytes this entry holds (its record's body), counted against the caps.
    size: int = 0


@dataclass(slots=True)
class _Apply:
    """A commit decided here (its marker record is stored) and not yet fully applied."""

    pid: int
    txn: int
    entries: list[_Entry]
    #: Where its marker record is and how many of its records are in the log.
    progress: CommitProgress


@dataclass
class _Producer:
    #: Transaction number of the last marker (-1: none yet).
    last_txn: int = -1
    #: Highest epoch a marker named: staged batches below it are a fenced producer's.
    fence_epoch: int = -1
    staged: list[_Entry] = field(default_factory=list)
    #: Bytes of ``staged`` (capped by ``kafka_transaction_max_bytes``).
    staged_bytes: int = 0
    applying: _Apply | None = None
    #: Staging and markers of one producer id take turns (a marker sees a settled list).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class TxnStaging:
    """Staged transactional data of producers whose coordinator is in another group (or
    whose consumer group is coordinated here), applied or dropped on their markers."""

    def __init__(self, config: BrokerConfig, store: MessageStore, *,
                 commit_remote: RemoteCommit, coordinates: Callable[[str], bool],
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        #: Whether this broker coordinates a transactional id (then its batches go to the
        #: coordinator, not here).
        self.coordinates = coordinates
        self.store = store
        self.commit_remote = commit_remote
        self.producers = ProducerStates()
        self._by_pid: dict[int, _Producer] = {}
        #: Bytes staged by every producer (capped by ``kafka_transactions_max_bytes``).
        self.staged_bytes = 0
        #: Only a master stages and applies (see :meth:`recover`).
        self.ready = False

    # --- recovery and lifecycle ---------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild what is staged, each producer id's last marker, and the commits a crash
        interrupted, from the (replicated) topic."""
        self._by_pid.clear()
        self.producers = ProducerStates()
        self.staged_bytes = 0
        for _, m in read_queue(self.store, STAGED_TOPIC):
            p = m.properties
            kind, pid = Kind.of(p.get(P_KIND)), int(p.get(P_PID, "-1"))
            epoch = int(p.get(P_EPOCH, "-1"))
            prod = self._producer(pid)
            if kind is Kind.BATCH:
                batch = read_batches(m.body, check_crc=False)[0]
                self._add(prod, _Entry(epoch, p[P_TOPIC], int(p[P_QUEUE]), batch,
                                       size=len(m.body)))
            elif kind is Kind.OFFSETS:
                self._add(prod, _Entry(epoch, offsets=[tuple(o) for o in orjson.loads(m.body)],
                                       size=len(m.body)))
            elif kind is Kind.COMMIT or kind is Kind.ABORT:
                txn = int(p[P_TXN])
                prod.last_txn, prod.fence_epoch = txn, max(prod.fence_epoch, epoch)
                settled, rest = _split(prod.staged, epoch)
                self._keep(prod, rest)
                if kind is Kind.COMMIT:
                    # how far it got is counted in the log when it is finished
                    prod.applying = _Apply(pid, txn, [e for e in settled if e.epoch == epoch],
                                           CommitProgress(m.physical_offset, None))
            elif (kind is Kind.DONE and prod.applying is not None
                  and prod.applying.txn == int(p[P_TXN])):
                prod.applying = None
        now = self.now_ms()
        for pid, prod in self._by_pid.items():
            for e in prod.staged:
                if e.batch is not None:
                    self.producers.record(pid, e.epoch, e.topic, e.queue, BatchMeta(
                        e.batch.base_sequence, e.batch.last_sequence, -1, e.batch.max_timestamp), now)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def start(self) -> None:
        """Finish the commits recovery found interrupted (their decision is stored here)."""
        self.ready = True
        for prod in list(self._by_pid.values()):
            if prod.applying is None:
                continue
            async with prod.lock:
                try:
                    await self._finish(prod)
                except StagingUnavailable as exc:
                    log.error("staged kafka commit of txn %d: not finished at start (%s); the "
                              "coordinator's next marker retries", prod.applying.txn, exc)

    async def suspend(self) -> None:
        """No longer the master: keep nothing (the next master replays the log)."""
        self.ready = False
        self._by_pid.clear()
        self.producers = ProducerStates()
        self.staged_bytes = 0

    def _producer(self, pid: int) -> _Producer:
        prod = self._by_pid.get(pid)
        if prod is None:
            prod = self._by_pid[pid] = _Producer()
        return prod

    def unstable_offsets(self, group: str) -> set[tuple[str, str, int]]:
        """The (topic, broker group, queue) of ``group``'s offsets staged here by a
        transaction and not set yet: waiting for its marker, or decided and being applied
        (OffsetFetch's ``require_stable``)."""
        out: set[tuple[str, str, int]] = set()
        for prod in self._by_pid.values():
            entries = prod.staged + (prod.applying.entries if prod.applying is not None else [])
            for e in entries:
                out.update((topic, broker, queue) for g, topic, broker, queue, _ in e.offsets
                           if g == group)
        return out

    def staged_count(self) -> int:
        """Batches and offset commits waiting for a marker (operators and tests)."""
        return sum(len(p.staged) for p in self._by_pid.values())

    def _add(self, prod: _Producer, entry: _Entry) -> None:
        prod.staged.append(entry)
        prod.staged_bytes += entry.size
        self.staged_bytes += entry.size

    def _keep(self, prod: _Producer, rest: list[_Entry]) -> None:
        """``prod`` now stages ``rest`` only (a marker settled the others)."""
        size = sum(e.size for e in rest)
        self.staged_bytes += size - prod.staged_bytes
        prod.staged, prod.staged_bytes = rest, size

    def _over_cap(self, prod: _Producer, pid: int, size: int, what: str) -> ErrorCode:
        """The coordinator's bounds, here too: one producer may stage
        ``kafka_transaction_max_bytes`` (beyond: RECORD_LIST_TOO_LARGE, not retriable: the
        transaction may only abort), all of them ``kafka_transactions_max_bytes`` (beyond:
        KAFKA_STORAGE_ERROR, retriable, as for a full disk)."""
        cfg = self.config
        if prod.staged_bytes + size > cfg.kafka_transaction_max_bytes:
            log.warning("staged kafka %s of producer %d refused: it would stage %d bytes, above "
                        "kafka_transaction_max_bytes %d", what, pid, prod.staged_bytes + size,
                        cfg.kafka_transaction_max_bytes)
            return ErrorCode.RECORD_LIST_TOO_LARGE
        if self.staged_bytes + size > cfg.kafka_transactions_max_bytes:
            log.warning("staged kafka %s of producer %d refused: %d bytes are staged, "
                        "kafka_transactions_max_bytes is %d", what, pid, self.staged_bytes,
                        cfg.kafka_transactions_max_bytes)
            return ErrorCode.KAFKA_STORAGE_ERROR
        return ErrorCode.NONE

    # --- staging ------------------------------------------------------------------------------
    def takes(self, transactional_id: str | None) -> bool:
        """A transactional batch is staged here when another broker group coordinates it."""
        return bool(transactional_id) and not self.coordinates(transactional_id)

    async def stage_batch(self, topic: str, queue: int, batch: RecordBatch) -> tuple[ErrorCode, int]:
        """Stage a transactional batch for this group's queue: (error, -1); a retried batch
        already staged is answered NONE and not stored twice."""
        pid, epoch = batch.producer_id, batch.producer_epoch
        prod = self._producer(pid)
        async with prod.lock:
            if epoch < prod.fence_epoch:
                return ErrorCode.INVALID_PRODUCER_EPOCH, -1
            err, dup = self.producers.check(pid, epoch, topic, queue, batch.base_sequence,
                                            batch.last_sequence)
            if err is not ErrorCode.NONE or dup is not None:
                return err, -1
            try:  # a bomb or bad records refused now, not at the marker; the output is not kept
                batch.records(self.config.max_message_size)
            except RecordsError as exc:
                log.info("staged kafka batch for %s-%d of producer %d refused: %s", topic, queue,
                         pid, exc)
                return exc.error_code, -1
            meta = BatchMeta(batch.base_sequence, batch.last_sequence, -1, batch.max_timestamp)
            size = len(batch.data)
            if (err := self._over_cap(prod, pid, size, f"batch for {topic}-{queue}")) \
                    is not ErrorCode.NONE:
                if err is ErrorCode.RECORD_LIST_TOO_LARGE:
                    # Its sequence counts as used (the coordinator's rule): a client that does
                    # not bump its epoch at the abort goes on after it.
                    self.producers.record(pid, epoch, topic, queue, meta, self.now_ms())
                return err, -1
            self.producers.record(pid, epoch, topic, queue, meta, self.now_ms())
            result = await self.store.put(Message(
                topic=STAGED_TOPIC, queue_id=0, body=batch.data,
                properties={P_KIND: Kind.BATCH.value, P_PID: str(pid), P_EPOCH: str(epoch),
                            P_TOPIC: topic, P_QUEUE: str(queue)}))
            if not result.in_log:
                self.producers.forget(pid, topic, queue, meta)
                return ErrorCode.KAFKA_STORAGE_ERROR, -1
            # In the log, acknowledged or not (OUTCOME_UNKNOWN): staged, as a replay would
            # stage it, so the client's retry is a duplicate and not staged a second time.
            self._add(prod, _Entry(epoch, topic, queue, batch, size=size))
        return (ErrorCode.NONE if result.ok else ErrorCode.KAFKA_STORAGE_ERROR), -1

    async def stage_offsets(self, pid: int, epoch: int, offsets: list[StagedOffset]) -> ErrorCode:
        """Stage a TxnOffsetCommit's offsets (set when the commit marker arrives)."""
        prod = self._producer(pid)
        async with prod.lock:
            if epoch < prod.fence_epoch:
                return ErrorCode.INVALID_PRODUCER_EPOCH
            body = orjson.dumps(offsets)
            if (err := self._over_cap(prod, pid, len(body), "offsets")) is not ErrorCode.NONE:
                return err
            result = await self.store.put(Message(
                topic=STAGED_TOPIC, queue_id=0, body=body,
                properties={P_KIND: Kind.OFFSETS.value, P_PID: str(pid), P_EPOCH: str(epoch)}))
            if result.in_log:  # as a replay would stage it
                self._add(prod, _Entry(epoch, offsets=list(offsets), size=len(body)))
        return ErrorCode.NONE if result.ok else ErrorCode.COORDINATOR_NOT_AVAILABLE

    # --- markers ------------------------------------------------------------------------------
    async def apply(self, pid: int, epoch: int, txn: int, commit: bool) -> ErrorCode:
        """One WriteTxnMarkers entry: commit or drop what ``pid`` staged, once."""
        prod = self._producer(pid)
        async with prod.lock:
            try:
                if txn <= prod.last_txn:  # sent again: finish it if a crash interrupted it
                    if prod.applying is not None and prod.applying.txn == txn:
                        await self._finish(prod)
                    return ErrorCode.NONE
                if prod.applying is not None:  # an older commit first (never left behind)
                    await self._finish(prod)
                settled, rest = _split(prod.staged, epoch)
                if not settled:  # nothing here for it: nothing to write
                    prod.last_txn, prod.fence_epoch = txn, max(prod.fence_epoch, epoch)
                    self._keep(prod, rest)
                    return ErrorCode.NONE
                kind = Kind.COMMIT if commit else Kind.ABORT
                result = await self.store.put(Message(
                    topic=STAGED_TOPIC, queue_id=0, body=b"",
                    properties={P_KIND: kind.value, P_PID: str(pid),
                                P_EPOCH: str(epoch), P_TXN: str(txn)}))
                if not result.in_log:
                    raise StagingUnavailable(ErrorCode.KAFKA_STORAGE_ERROR)
                # In the log, acknowledged or not: the decision is taken here as a replay
                # takes it, so the marker's retry finishes this one instead of writing a
                # second (whose replay would stand for the first with no records).
                prod.last_txn, prod.fence_epoch = txn, max(prod.fence_epoch, epoch)
                self._keep(prod, rest)
                for e in settled:
                    if e.batch is not None:
                        self.producers.forget(pid, e.topic, e.queue, BatchMeta(
                            e.batch.base_sequence, e.batch.last_sequence, -1,
                            e.batch.max_timestamp))
                if commit:
                    prod.applying = _Apply(pid, txn, [e for e in settled if e.epoch == epoch],
                                           CommitProgress(result.physical_offset))
                if not result.ok:
                    raise StagingUnavailable(ErrorCode.KAFKA_STORAGE_ERROR)
                if commit:
                    await self._finish(prod)
            except StagingUnavailable as exc:
                return exc.code
        return ErrorCode.NONE

    async def _finish(self, prod: _Producer) -> None:
        """Apply ``prod``'s decided commit (commit_apply.py): append its records not in the log
        yet, set its offsets, write the done record.  Idempotent, so a marker sent again (or
        :meth:`start`) finishes where the last attempt stopped."""
        a = prod.applying
        assert a is not None
        msgs: list[Message] = []
        offsets: list[StagedOffset] = []
        for e in a.entries:
            offsets.extend(e.offsets)
            if e.batch is None:
                continue
            try:
                for record in e.batch.records(self.config.max_message_size):
                    msgs.append(record_to_message(e.topic, e.queue, record, born_host=BORN_HOST))
            except RecordsError as exc:  # checked when staged; the decision cannot be undone
                log.error("staged batch of %s-%d does not decode (%s): skipped", e.topic,
                          e.queue, exc)
        local = [o for o in offsets if o[2] == self.config.broker_name]

        async def elsewhere() -> None:
            for group, topic, broker, queue, offset in offsets:
                if broker != self.config.broker_name and not await self.commit_remote(
                        broker, group, topic, queue, offset):
                    raise StagingUnavailable(ErrorCode.COORDINATOR_NOT_AVAILABLE)

        async def done() -> None:
            result = await self.store.put(Message(
                topic=STAGED_TOPIC, queue_id=0, body=orjson.dumps(local) if local else b"",
                properties={P_KIND: Kind.DONE.value, P_PID: str(a.pid), P_TXN: str(a.txn)}))
            if not result.ok:
                raise StagingUnavailable(ErrorCode.KAFKA_STORAGE_ERROR)

        try:
            await apply_decided(self.store, a.progress, msgs,
                                [(g, t, q, o) for g, t, _, q, o in local],
                                elsewhere=elsewhere, done=done)
        except ApplyRefused as exc:
            log.warning("staged kafka commit of txn %d of producer %d: %s; the marker is retried",
                        a.txn, a.pid, exc)
            raise StagingUnavailable(exc.code) from exc
        prod.applying = None


def _split(staged: list[_Entry], epoch: int) -> tuple[list[_Entry], list[_Entry]]:
    """(what a marker of ``epoch`` settles, what stays staged for a later marker).  A commit
    applies the settled entries of its own epoch and drops older ones (a fenced producer's);
    an abort drops them all."""
    return [e for e in staged if e.epoch <= epoch], [e for e in staged if e.epoch > epoch]
