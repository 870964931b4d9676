"""Applying a decided Kafka commit: the one procedure the transaction coordinator (for its
own partitions, after PrepareCommit) and a participant broker group (for what it staged,
after a commit marker) both run.

A commit is decided when its decision record is in the log; the commitlog offset of that
record (the *marker*) ties the commit's records to it: each record appended to a partition
carries it in ``prepared_transaction_offset``.  Applying is then, in this order:

1. append the records not appended yet, in one ``put_chain``;
2. set the consumer offsets this broker holds, through the offset log;
3. whatever the caller adds for other broker groups (markers, or offsets held elsewhere);
4. the caller's done record.

Every step may be interrupted (a refusal, a lapsed lease, a cancellation, a crash) and the
whole is run again until the done record is written.  What makes the rerun idempotent is
:class:`CommitProgress`: how many of the records are in the log.  It follows what the store
*appended*, not what it acknowledged: a put answered OUTCOME_UNKNOWN appended its record
(:attr:`PutResult.in_log`), so counting it as not stored appended it twice.  When the
answer was not seen at all (a cancelled put, or after a restart) the log itself is counted:
the records tied to the marker after it are a prefix of the chain, because ``put_chain``
stops at the first refusal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.topics import is_system_topic
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message

#: (consumer group, topic, queue, offset): an offset set by the commit on this broker.
LocalOffset = tuple[str, str, int, int]


class ApplyRefused(Exception):
    """A step of the apply was not stored; the commit stays decided and is applied again."""

    def __init__(self, code: ErrorCode, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass(slots=True)
class CommitProgress:
    """How far the apply of the commit decided at ``marker`` got."""

    #: Commitlog offset of the decision record (never 0: a record always precedes it).
    marker: int
    #: Records of the commit in the log; None while unknown (an append whose answer was not
    #: seen): the next attempt counts them in the log first.
    applied: int | None = 0


def count_applied(store: MessageStore, marker: int) -> int:
    """Records of the commit decided at ``marker`` that reached their partitions (they follow
    the marker in the commitlog and carry its offset)."""
    n = 0
    for m in store.scan(marker):
        if m.prepared_transaction_offset == marker and not is_system_topic(m.topic):
            n += 1
    return n


async def append_decided(store: MessageStore, progress: CommitProgress,
                         msgs: list[Message]) -> None:
    """Step 1: append those of ``msgs`` (every record of the commit, in order) not in the log
    yet.  Raises :class:`ApplyRefused` unless all of them are in and acknowledged."""
    for m in msgs:
        m.prepared_transaction_offset = progress.marker
    if progress.applied is None:
        progress.applied = count_applied(store, progress.marker)
    done = progress.applied
    rest = msgs[done:]
    if not rest:
        return
    progress.applied = None  # a cancellation while the chain waits leaves it unknown
    results = await store.put_chain(rest)
    progress.applied = done + sum(1 for r in results if r.in_log)
    if progress.applied < len(msgs) or not all(r.ok for r in results):
        status = results[-1].status.value if results else "nothing stored"
        raise ApplyRefused(ErrorCode.KAFKA_STORAGE_ERROR,
                           f"{progress.applied} of {len(msgs)} records in the log ({status})")


async def apply_decided(store: MessageStore, progress: CommitProgress, msgs: list[Message],
                        offsets: list[LocalOffset], *,
                        elsewhere: Callable[[], Awaitable[None]],
                        done: Callable[[], Awaitable[None]]) -> None:
    """Apply the decided commit (steps 1 to 4 above); run again after any exception until it
    returns.  ``elsewhere`` and ``done`` raise their own errors when refused."""
    await append_decided(store, progress, msgs)
    if offsets:
        # Through the offset log before the done record, so a log holding the done record
        # holds the offsets too (a replica promoted, a restart); the done record's flush and
        # replica wait covers this earlier record, so it is not waited for on its own.
        result = store.commit_offsets_now([(g, t, q, o, None) for g, t, q, o in offsets])
        if not result.ok:
            raise ApplyRefused(ErrorCode.KAFKA_STORAGE_ERROR,
                               f"offsets not stored ({result.status.value})")
    await elsewhere()
    await done()
