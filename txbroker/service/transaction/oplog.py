"""The op log: the records the transaction service writes besides halves and finals, and
how their bodies are spelled and parsed (pure: no I/O).

All of them go through ``MessageStore.put``, so they are recovered, flushed and retained like
any message:

=====================  =====  ==============================================================
topic / queue 0        tag    body and properties
=====================  =====  ==============================================================
RMQ_SYS_TRANS_OP_HALF  ``d``  RocketMQ 4.x op message: body = the half queue offset in
_TOPIC                        decimal, one record per decision (no 5.x batching: a 4.x
                              checker can still read the store; the reader here also accepts
                              5.x bodies ``"17,18,"``).  Property ``TXB_STATE`` = ``committed``
                              or ``rolled_back``; ``TXB_SOURCE`` = ``producer``, ``check`` or
                              ``operator``; ``TXB_OPERATOR`` when an operator decided;
                              ``__transactionId__`` = the half's UNIQ_KEY;
                              ``TRANSACTION_CHECK_TIMES`` = check-backs sent before the
                              decision; born timestamp = the decision time.  A record without
                              them (RocketMQ's, or older txbroker's) replays as source
                              ``unknown`` and an unknown count.
same                   ``c``  check counts, one record per check pass: body
                              ``"<half queue offset>:<checks so far>,"`` repeated.  Counts are
                              absolute, so replaying is idempotent.
same                   ``r``  operator resume of a discarded half: body ``"<queue offset>,"``;
                              the count starts again from 0.
TRANS_CHECK_MAX_TIME   —      the discarded half, copied as RocketMQ does (same body and
_TOPIC                        properties) plus ``TRAN_PREPARED_QUEUE_OFFSET`` = its half queue
                              offset and ``TRANSACTION_CHECK_TIMES``.
=====================  =====  ==============================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from txbroker.service.transaction.history import Decided
from txbroker.store.record import (
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
)

#: RocketMQ's op tag (TransactionalMessageUtil.REMOVETAG): the half is decided.
OP_TAG_DONE = "d"
#: txbroker: check counts of one pass.
OP_TAG_CHECKS = "c"
#: txbroker: an operator resumed a discarded half.
OP_TAG_RESUME = "r"
PROPERTY_STATE = "TXB_STATE"
PROPERTY_OPERATOR = "TXB_OPERATOR"
PROPERTY_SOURCE = "TXB_SOURCE"


def is_uint(text: str) -> bool:
    """ASCII decimal digits only (``str.isdigit`` also accepts "²", which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def parse_offsets(body: bytes) -> list[int]:
    """``"17"`` (4.x) or ``"17,18,"`` (5.x batch) → [17, 18]; junk pieces are skipped."""
    out = []
    for piece in body.decode("utf-8", "replace").split(","):
        piece = piece.strip()
        if is_uint(piece):
            out.append(int(piece))
    return out


def parse_counts(body: bytes) -> list[tuple[int, int]]:
    """A ``c`` body ``"3:1,4:15,"`` → [(3, 1), (4, 15)]; junk pieces are skipped."""
    out = []
    for piece in body.decode("utf-8", "replace").split(","):
        qo, sep, n = piece.strip().partition(":")
        if sep and is_uint(qo) and is_uint(n):
            out.append((int(qo), int(n)))
    return out


def counts_bodies(counts: Iterable[tuple[int, int]], limit: int) -> Iterator[str]:
    """``c`` bodies for (half queue offset, checks) pairs, each cut once it reaches ``limit``
    characters (one body unless a pass checked very many halves)."""
    chunk: list[str] = []
    size = 0
    for queue_offset, checks in counts:
        piece = f"{queue_offset}:{checks},"
        chunk.append(piece)
        size += len(piece)
        if size >= limit:
            yield "".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield "".join(chunk)


def decision_properties(decided: Decided) -> dict[str, str]:
    """What a ``d`` record carries so a replay knows who decided which transaction."""
    props = {}
    if decided.source != "unknown":
        props[PROPERTY_SOURCE] = decided.source
    if decided.operator:
        props[PROPERTY_OPERATOR] = decided.operator
    if decided.txn_id:
        props[PROPERTY_TRANSACTION_ID] = decided.txn_id
    if decided.checks is not None:
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(decided.checks)
    return props


def check_times(properties: dict[str, str]) -> int | None:
    """``TRANSACTION_CHECK_TIMES`` of a ``d`` record or discard copy; None when absent or
    malformed (a count not known is not shown as 0)."""
    raw = properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "")
    return int(raw) if is_uint(raw) else None
