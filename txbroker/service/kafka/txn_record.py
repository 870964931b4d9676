"""What the Kafka transaction coordinator keeps of one transactional id: its metadata (what
every state record of the id holds, as a document: see txn_log.py) and, while a transaction
is open, its batches, offsets and how far a decided commit got.  No I/O.

The document's keys and the state names are what the log holds: a record written by an older
version loads as it did, and one written now loads in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from txbroker.remoting.kafka.records import RecordBatch
from txbroker.service.kafka.commit_apply import CommitProgress
from txbroker.service.kafka.txn_state import TxnState, TxnTransitionError, move
from txbroker.store.record import Message


@dataclass
class TxnView:
    """One id as operators and DescribeTransactions see it (``state`` is the state's name)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    partitions: list[tuple[str, int]]
    groups: list[str]
    timeout_ms: int
    started_ms: int | None
    updated_ms: int

    @property
    def open(self) -> bool:
        """A transaction is open or being decided."""
        return TxnState(self.state).open

    def hanging(self, now_ms: int) -> bool:
        """Ongoing for longer than its timeout (the scan aborts it; Kafka's find-hanging)."""
        return (self.state == TxnState.ONGOING.value and self.started_ms is not None
                and now_ms - self.started_ms > self.timeout_ms)


@dataclass(slots=True)
class Staged:
    """One transactional batch; :attr:`TxnMeta.staged` keeps them in data-topic order (a batch
    is staged right before the put that appends it, with no await in between)."""

    topic: str
    partition: int
    batch: RecordBatch


@dataclass
class TxnMeta:
    """The metadata of one transactional id (what a state record holds) plus the open
    transaction's batches and offsets, which live in the data topic."""

    tid: str
    pid: int
    epoch: int
    last_epoch: int = -1
    state: TxnState = TxnState.EMPTY
    timeout_ms: int = 60000
    txn: int = 0
    partitions: list[tuple[str, int]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    started_ms: int | None = None
    updated_ms: int = 0
    data_from: int = 0
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    staged: list[Staged] = field(default_factory=list)
    #: Bytes of ``staged`` (capped by ``kafka_transaction_max_bytes``).
    staged_bytes: int = 0
    #: The state a transition in progress moves to (Kafka's pendingState): its writes (and,
    #: for a commit, its appends) are under way, and other requests of this id get
    #: CONCURRENT_TRANSACTIONS.  None: no transition in progress.
    pending: TxnState | None = None
    #: Transactional batches being stored: EndTxn waits for them (CONCURRENT_TRANSACTIONS).
    inflight: int = 0
    #: A batch of this transaction could not be stored: it may only abort.
    failed: bool = False
    #: PrepareCommit: where its record is (ties the applied records to it) and how many of
    #: the records are in the log (commit_apply.py).
    progress: CommitProgress | None = None
    #: The decided commit's records, decoded once (None: decode from ``staged``).
    commit_msgs: list[Message] | None = None
    #: Commitlog offset of this id's latest state record (-1: none appended yet).
    record_offset: int = -1
    #: On a cluster, the other broker groups in the transaction (their partitions, global
    #: numbers; empty for a group that coordinates its consumer group): they get a marker.
    participants: dict[str, list[list]] = field(default_factory=dict)

    def doc(self, state: TxnState | None = None, **changes) -> dict:
        """The state record's document: this metadata with ``state`` and ``changes``."""
        d = {"tid": self.tid, "pid": self.pid, "epoch": self.epoch, "last_epoch": self.last_epoch,
             "state": (self.state if state is None else state).value,
             "timeout_ms": self.timeout_ms, "txn": self.txn,
             "partitions": [list(tp) for tp in self.partitions], "groups": list(self.groups),
             "started_ms": self.started_ms, "updated_ms": self.updated_ms,
             "data_from": self.data_from,
             "offsets": [[g, t, p, o] for (g, t, p), o in self.offsets.items()],
             "participants": self.participants}
        d.update(changes)
        return d

    def load(self, d: dict) -> None:
        """Take the document of a state record (recovery, or one just appended)."""
        self.pid, self.epoch, self.last_epoch = d["pid"], d["epoch"], d["last_epoch"]
        self.state, self.timeout_ms, self.txn = TxnState(d["state"]), d["timeout_ms"], d["txn"]
        self.partitions = [(t, p) for t, p in d["partitions"]]
        self.groups = list(d["groups"])
        self.started_ms, self.updated_ms, self.data_from = d["started_ms"], d["updated_ms"], d["data_from"]
        self.offsets = {(g, t, p): o for g, t, p, o in d["offsets"]}
        self.participants = {k: list(v) for k, v in (d.get("participants") or {}).items()}
        if not self.state.holds_data:
            self.staged = []
            self.failed = False
            self.commit_msgs = None
        if self.state is not TxnState.PREPARE_COMMIT:
            self.progress = None

    @property
    def busy(self) -> bool:
        """A transition is in progress (see :attr:`pending`)."""
        return self.pending is not None

    @contextlib.contextmanager
    def transition(self, target: TxnState) -> Iterator[None]:
        """Hold :attr:`pending` at ``target`` while the block moves the id there; a move the
        table does not allow, or a second transition while one is in progress, is a bug and
        raises before the block runs."""
        if self.pending is not None:
            raise TxnTransitionError(self.pending, target)
        self.pending = move(self.state, target)
        try:
            yield
        finally:
            self.pending = None

    def stage(self, staged: Staged) -> int:
        """Keep one more batch of the open transaction; returns its bytes."""
        self.staged.append(staged)
        self.staged_bytes += len(staged.batch.data)
        return len(staged.batch.data)

    def unstage(self, staged: Staged) -> int:
        """Drop a batch whose put appended nothing; returns its bytes."""
        self.staged.remove(staged)
        self.staged_bytes -= len(staged.batch.data)
        return len(staged.batch.data)

    @property
    def open(self) -> bool:
        return self.state.open

    @property
    def settled(self) -> bool:
        """No transaction open and none being decided: the id may expire."""
        return self.state.settled

    def view(self) -> TxnView:
        return TxnView(self.tid, self.pid, self.epoch, self.state.value, list(self.partitions),
                       list(self.groups), self.timeout_ms,
                       self.started_ms if self.open else None, self.updated_ms)
