"""The check service: ask producers about half messages nobody decided.

Every ``transaction_check_interval`` one pass runs over the *pending index* (never the half
queue), and only over its due part: the index keeps halves in store-time order and hands out
those older than their immunity (:meth:`~.pending.PendingIndex.due`), so a pass costs time in
proportion to what is due, not to what is pending.  For each pending half:

* younger than its immunity (``CHECK_IMMUNITY_TIME_IN_SECONDS`` or ``transaction_timeout``),
  measured on the broker's store timestamp — never the producer's born timestamp, whose clock
  may be skewed (apache/rocketmq #1517, #9640) — it is left alone;
* a decision on it is being written right now: left alone (the decision wins);
* the store refuses writes (its fence: a master whose lease is not known valid, a demotion;
  or the disk guard): the whole pass is skipped, nothing counted; a refusal that begins while
  a pass yields between batches ends the pass there;
* already checked ``transaction_check_max`` times, or older than ``file_reserved_time`` (its
  segment is about to be deleted): discarded to TRANS_CHECK_MAX_TIME_TOPIC;
* otherwise CHECK_TRANSACTION_STATE goes, one-way, to the connection that sent the half if it
  is still open (it is the one that knows the transaction, #9791); later checks rotate over
  every live connection of its producer group, so a member that cannot answer does not absorb
  them all.  No connection: logged and counted as ``tx_no_producer``, and the half's check
  count is **not** incremented (#8311 burned counts without sending, then discarded halves
  whose producer was merely restarting);
* a check sent at an earlier pass to a connection that then closed without answering (a
  producer instance shutting down or killed as the check went out: nobody received it) is
  given back: the count it burned is returned, at most ``transaction_check_max`` times per
  half, so a half is discarded only after checks that reached a producer which could answer
  them, while a group whose instances keep dying still ends in the discard.  An answer of any
  kind, UNKNOW included, means the check arrived (:meth:`CheckService.answered`);
* the chosen connection is not reading what was already sent to it (its transport is above
  the high-water mark): the check is deferred to a later pass, not counted.  A check carries
  the whole half (up to the maximum message size), so without this a pass over many halves
  of a stalled producer would pile them all up in the broker's memory.

The request (docs/protocol.md §4.4): ext ``tranStateTableOffset``, ``commitLogOffset``, ``msgId`` and
``transactionId`` (= UNIQ_KEY) and ``offsetMsgId``, all strings (the C++ client ignores
numbers); body = the half record re-encoded with its real topic and queue id.

Sends are one-way and never wait for the peer, so "bounded concurrency" means the pass sends
``check_concurrency`` checks, then yields to the event loop before the next batch: a pass over
many halves never starves request handling, and what waits for a slow producer is bounded by
its connection's high-water mark (the check thread-pool overflows of #1519 cannot happen).  The counts of all halves checked in a
pass are persisted as one record at the end of the pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.transaction.pending import HalfEntry
from txbroker.service.transaction.state import HalfState
from txbroker.store.record import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    Message,
    StoredMessage,
    encode_record,
)

log = logging.getLogger(__name__)


class CheckTarget(Protocol):
    """What a check pass needs of the transaction service, and nothing more: the pending
    halves, a way to read one, and the three things a pass may do to one (discard it, forget
    it, persist its check count)."""

    metrics: BrokerMetrics

    def clock(self) -> float: ...
    def write_refusal(self) -> str: ...
    def pending_count(self) -> int: ...
    def due_entries(self, now_ms: int) -> list[HalfEntry]: ...
    def is_busy(self, phys: int) -> bool: ...
    def producer_connections(self, group: str) -> list[Any]: ...
    def read_half(self, phys: int) -> StoredMessage | None: ...
    async def discard(self, entry: HalfEntry) -> bool: ...
    def forget(self, entry: HalfEntry, reason: str) -> None: ...
    async def record_checks(self, entries: list[HalfEntry]) -> None: ...
    def trim_resolved(self) -> None: ...


@dataclass
class CheckPassReport:
    """What one pass did (returned by ``check_now``; logged by the periodic service)."""

    pending: int = 0            # halves pending when the pass started
    due: int = 0                # older than their immunity
    sent: int = 0               # checks actually sent (and counted)
    no_producer: int = 0        # due, but no live connection of the group
    discarded: int = 0
    failed: int = 0             # half unreadable or the send raised
    deferred: int = 0           # its producer was not reading: asked at a later pass
    lost: int = 0               # earlier checks given back: their connection closed unanswered
    skipped: str = ""           # why the pass was skipped or stopped (the store refuses writes)
    elapsed: float = 0.0        # seconds
    no_producer_groups: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """The pass as one log sentence, with units (what the periodic service logs)."""
        parts = [f"{self.sent} of {self.due} due half messages checked back ({self.pending} pending)"]
        counts = [(self.no_producer, "with no producer online"), (self.discarded, "discarded"),
                  (self.failed, "failed"), (self.deferred, "deferred to a later pass"),
                  (self.lost, "earlier checks lost with their connection, not counted")]
        parts += [f"{n} {what}" for n, what in counts if n]
        return f"check pass: {', '.join(parts)}, in {self.elapsed * 1000:.1f} ms"


def check_request(half_phys: int, entry: HalfEntry, record: StoredMessage) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE for ``entry``; ``record`` is the stored half (StoredMessage)."""
    props = dict(record.properties)
    topic = props.get(PROPERTY_REAL_TOPIC, entry.topic)
    qid = props.get(PROPERTY_REAL_QUEUE_ID, str(entry.queue_id))
    restored = Message(topic=topic, queue_id=int(qid) if qid.isascii() and qid.isdigit() else entry.queue_id,
                       body=record.body, flag=record.flag, properties=props,
                       sys_flag=record.sys_flag, born_timestamp=record.born_timestamp,
                       born_host=record.born_host, reconsume_times=record.reconsume_times,
                       prepared_transaction_offset=record.prepared_transaction_offset)
    body = encode_record(restored, physical_offset=half_phys, queue_offset=record.queue_offset,
                         store_timestamp=record.store_timestamp, store_host=record.store_host)
    uniq = props.get(PROPERTY_UNIQ_KEY) or entry.msg_id
    ext = {
        "tranStateTableOffset": str(entry.queue_offset),
        "commitLogOffset": str(half_phys),
        "msgId": uniq,
        "transactionId": uniq,
        "offsetMsgId": entry.msg_id,
    }
    return RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, ext, body, oneway=True)


class CheckService:
    """The periodic check task over a :class:`CheckTarget` (the transaction service)."""

    def __init__(self, tx: CheckTarget, config: BrokerConfig) -> None:
        self.tx = tx
        self.config = config
        self._task: asyncio.Task | None = None
        #: One pass at a time: a periodic pass and check_now() never interleave.
        self._pass_lock = asyncio.Lock()
        #: Half (commitlog offset) -> (the connection its last check went to, or None when it
        #: was not sent; checks given back so far), for the halves checked and not answered
        #: since.  Rebuilt at each pass from the halves it sees, so decided halves drop out.
        self._unanswered: dict[int, tuple[Any, int]] = {}

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="txbroker-check-service")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        interval = self.config.transaction_check_interval
        while True:
            await asyncio.sleep(interval)
            try:
                report = await self.run_pass()
            except Exception:
                log.exception("transaction check pass failed")
                continue
            if report.sent or report.discarded or report.no_producer:
                log.info("%s", report.describe())

    def answered(self, phys: int) -> None:
        """A producer answered a check of the half at ``phys`` (any answer): it arrived."""
        self._unanswered.pop(phys, None)

    def _given_back(self, entry: HalfEntry, unanswered: dict[int, tuple[Any, int]]) -> int:
        """Return the count of the half's last check if its connection closed without an
        answer; how many were given back so far (carried to the next pass)."""
        sent_on, lost = unanswered.pop(entry.phys, (None, 0))
        if (sent_on is not None and sent_on.closed and entry.checks > 0
                and lost < self.config.transaction_check_max):
            entry.checks -= 1
            lost += 1
            self.tx.metrics.checks_lost.inc()
            log.debug("check of half %d lost with %s (closed unanswered): not counted",
                      entry.phys, getattr(sent_on, "peer", "?"))
        return lost

    async def run_pass(self) -> CheckPassReport:
        async with self._pass_lock:
            return await self._pass()

    async def _pass(self) -> CheckPassReport:
        tx = self.tx
        started = time.perf_counter()
        now_ms = int(tx.clock() * 1000)
        report = CheckPassReport(pending=tx.pending_count())
        refusal = tx.write_refusal()
        if refusal:
            # A commit answer could not be applied and a discard could not be stored, so a
            # check now would only burn a count, and enough of them would discard halves their
            # producers committed.  RocketMQ skips too (its check re-appends the half).
            report.skipped = refusal
            log.warning("check pass skipped: the store refuses writes (%s)", refusal)
            return report
        due = [e for e in tx.due_entries(now_ms) if not tx.is_busy(e.phys)]
        # Fewest checks first (stable: oldest first among equals), so halves deferred behind a
        # producer that stopped reading are not starved by the ones checked before them.
        due.sort(key=attrgetter("checks"))
        report.due = len(due)
        check_max = self.config.transaction_check_max
        # A half about to leave the retained log is discarded like RocketMQ's "needSkip": its
        # copy in TRANS_CHECK_MAX_TIME_TOPIC is fresh, so it stays listable and resumable.
        reserved_ms = self.config.file_reserved_time * 1000
        batch = self.config.check_concurrency
        checked: list[HalfEntry] = []
        missing: Counter[str] = Counter()
        in_batch = 0
        unanswered, self._unanswered = self._unanswered, {}
        for entry in due:
            if entry.state is not HalfState.PENDING or tx.is_busy(entry.phys):
                continue  # decided while this pass yielded
            before = entry.checks
            lost = self._given_back(entry, unanswered)
            report.lost += before - entry.checks
            if lost:
                self._unanswered[entry.phys] = (None, lost)
            if entry.checks >= check_max or now_ms - entry.store_ts > reserved_ms:
                if await tx.discard(entry):
                    report.discarded += 1
                continue
            conn = self._connection_for(entry)
            if conn is None:
                missing[entry.group] += 1
                tx.metrics.no_producer.inc()
                continue
            if not conn.writable:
                report.deferred += 1
                continue
            record = tx.read_half(entry.phys)
            if record is None:
                report.failed += 1
                tx.forget(entry, "its record can no longer be read (retention or damage)")
                continue
            try:
                conn.send_oneway(check_request(entry.phys, entry, record))
            except (OSError, RuntimeError) as exc:
                report.failed += 1
                log.info("check of half %d not sent to %s: %s", entry.phys,
                         getattr(conn, "peer", "?"), exc)
                continue
            entry.checks += 1
            self._unanswered[entry.phys] = (conn, lost)
            checked.append(entry)
            tx.metrics.checks_sent.inc()
            in_batch += 1
            if in_batch >= batch:
                in_batch = 0
                await asyncio.sleep(0)
                refusal = tx.write_refusal()
                if refusal:  # fenced meanwhile: the rest would only burn counts
                    report.skipped = refusal
                    log.warning("check pass stopped: the store refuses writes (%s)", refusal)
                    break
        report.sent = len(checked)
        report.no_producer = sum(missing.values())
        report.no_producer_groups = dict(missing)
        if missing:
            log.warning("no producer online for %d due half messages: %s", report.no_producer,
                        ", ".join(f"{g} ({n})" for g, n in sorted(missing.items())))
        if checked:
            await tx.record_checks(checked)
        tx.trim_resolved()
        tx.metrics.check_passes.inc()
        report.elapsed = time.perf_counter() - started
        return report

    def _connection_for(self, entry: HalfEntry) -> Any | None:
        """The first check goes to the connection that sent the half; later ones rotate over
        every live connection of the group.  A producer that cannot answer (a plain RocketMQ
        C++ producer sending TRAN_MSG, a producer that lost its state) must not absorb every
        check until the half is discarded while a capable member of the group is online."""
        conn = entry.conn
        if conn is not None and conn.closed:
            entry.conn = conn = None  # gone for good: do not keep the dead connection alive
        if conn is not None and entry.checks == 0:
            return conn
        live = [] if conn is None else [conn]
        for candidate in self.tx.producer_connections(entry.group):
            if not candidate.closed and candidate not in live:
                live.append(candidate)
        if not live:
            return None
        return live[entry.checks % len(live)]
