"""POP state: what each (group, topic, queue) has popped and not yet acknowledged.  No I/O.

Every change is a record (a JSON document) that is applied to the state by :func:`apply`, live
and when the POP log is replayed after a restart or a promotion, so the two can never differ:

* ``ck`` (checkpoint): messages handed out at once, each with its queue offset, commitlog
  offset, delivery attempt and serial, all invisible until ``v`` (ms since the epoch); the
  queue's pop cursor moves past them.  A change of invisibility is a ``ck`` of one message
  with a new serial: the serial is what a receipt handle must match, so the old handle stops
  working.  A renewal (a PushConsumer's message while it is connected) is a ``ck`` with the
  same serial: its handle stays valid.
* ``ack``: the message at offset ``o`` is done (acknowledged, or moved to the dead-letter
  topic), if its serial is still ``s``; a stale one changes nothing.
* ``snap``: the whole state of one queue (a snapshot part; ``more`` parts add entries), so
  replay starts at the last snapshot instead of the beginning of the log.

A queue's *frontier* (everything below it is acknowledged) is the smallest in-flight offset,
or the cursor when nothing is in flight: the group's consumer offset in the store.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

Key = tuple[str, str, int]  # (group, topic, queue id)


class PopErrorKind(enum.Enum):
    """Why a POP request is refused; the protocol layer maps each to its status code."""

    BAD_REQUEST = "bad request"
    INVALID_HANDLE = "invalid receipt handle"
    TOPIC_NOT_FOUND = "topic not found"
    TOO_MANY = "too many requests"
    NOT_SERVING = "not serving"
    STORE_REFUSED = "store refused"


class PopError(Exception):
    """A POP request refused, with its reason for the client."""

    def __init__(self, kind: PopErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True)
class InFlight:
    offset: int
    #: Commitlog offset of the message: a redelivery reads it from there.
    phys: int
    #: This delivery's number (1 = the first).
    attempt: int
    #: When the message becomes visible again, ms since the epoch.
    visible_at: int
    #: Names this delivery; a receipt handle carries it.
    serial: int
    #: The client's attempt id of the receive that popped it (FIFO receive retries).
    attempt_id: str = ""
    #: Renewed while its consumer is connected, up to this time (ms; 0: never renewed), and
    #: that consumer's client id (a PushConsumer's receive, ``auto_renew``).
    renew_until: int = 0
    owner: str = ""
    #: In memory only: the revive service is moving it to the dead-letter topic.
    dead: bool = False


@dataclass(slots=True)
class QueueState:
    #: Next queue offset never popped; -1 until the queue is first popped.
    cursor: int = -1
    inflight: dict[int, InFlight] = field(default_factory=dict)
    #: Offsets of in-flight messages whose invisibility ended: they are popped again first.
    ready: set[int] = field(default_factory=set)

    def frontier(self) -> int:
        return min(self.inflight) if self.inflight else self.cursor

    def locked(self) -> bool:
        """FIFO: a message of the queue is still invisible, so nothing else may be popped."""
        return len(self.ready) < len(self.inflight)


class PopState:
    """Every queue's state, and in-flight counts per group (the per-group bound)."""

    def __init__(self) -> None:
        self.queues: dict[Key, QueueState] = {}
        self.inflight_by_group: dict[str, int] = {}

    def queue(self, key: Key) -> QueueState:
        qs = self.queues.get(key)
        if qs is None:
            qs = self.queues[key] = QueueState()
        return qs

    def inflight(self, group: str) -> int:
        return self.inflight_by_group.get(group, 0)

    def clear(self) -> None:
        self.queues.clear()
        self.inflight_by_group.clear()

    def _count(self, group: str, delta: int) -> None:
        n = self.inflight_by_group.get(group, 0) + delta
        if n:
            self.inflight_by_group[group] = n
        else:
            self.inflight_by_group.pop(group, None)

    def apply(self, doc: dict) -> list[tuple[Key, InFlight]]:
        """Apply one record; returns the entries that became in flight (their visibility
        must be watched).  A malformed record raises KeyError/TypeError/ValueError."""
        kind = doc["k"]
        key: Key = (doc["g"], doc["t"], int(doc["q"]))
        qs = self.queue(key)
        if kind == "ck":
            added = []
            for off, phys, attempt, serial in doc["e"]:
                entry = InFlight(off, phys, attempt, doc["v"], serial, doc.get("i", ""),
                                 doc.get("r", 0), doc.get("c", ""))
                if off not in qs.inflight:
                    self._count(key[0], 1)
                qs.inflight[off] = entry
                qs.ready.discard(off)
                qs.cursor = max(qs.cursor, off + 1)
                added.append((key, entry))
            return added
        if kind == "ack":
            entry = qs.inflight.get(doc["o"])
            if entry is not None and entry.serial == doc["s"]:
                del qs.inflight[entry.offset]
                qs.ready.discard(entry.offset)
                self._count(key[0], -1)
            return []
        if kind == "snap":
            if not doc.get("more"):
                self._count(key[0], -len(qs.inflight))
                qs.inflight.clear()
                qs.ready.clear()
                qs.cursor = doc["c"]
            added = []
            for off, phys, attempt, serial, visible_at, attempt_id, renew_until, owner in doc["e"]:
                entry = InFlight(off, phys, attempt, visible_at, serial, attempt_id, renew_until,
                                 owner)
                if off not in qs.inflight:
                    self._count(key[0], 1)
                qs.inflight[off] = entry
                added.append((key, entry))
            return added
        raise ValueError(f"unknown POP record kind {kind!r}")


def checkpoint(key: Key, entries: list[tuple[int, int, int, int]], visible_at: int,
               attempt_id: str = "", renew_until: int = 0, owner: str = "") -> dict:
    """A ``ck`` record: ``entries`` are (offset, phys, attempt, serial)."""
    doc = {"k": "ck", "g": key[0], "t": key[1], "q": key[2], "v": visible_at,
           "e": [list(e) for e in entries]}
    if attempt_id:
        doc["i"] = attempt_id
    if renew_until:
        doc["r"] = renew_until
        doc["c"] = owner
    return doc


def ack(key: Key, offset: int, serial: int, reason: str = "ack") -> dict:
    return {"k": "ack", "g": key[0], "t": key[1], "q": key[2], "o": offset, "s": serial,
            "r": reason}


#: In-flight entries per snapshot record (each ~60 bytes of JSON: a part stays far below
#: the smallest allowed message size).
SNAPSHOT_PART = 1000


def snapshot(key: Key, qs: QueueState) -> list[dict]:
    """The ``snap`` records that rebuild ``qs``: one, plus one per further
    :data:`SNAPSHOT_PART` in-flight entries."""
    entries = [[e.offset, e.phys, e.attempt, e.serial, e.visible_at, e.attempt_id,
                e.renew_until, e.owner]
               for e in sorted(qs.inflight.values(), key=lambda e: e.offset)]
    docs = []
    for i in range(0, max(len(entries), 1), SNAPSHOT_PART):
        doc = {"k": "snap", "g": key[0], "t": key[1], "q": key[2], "c": qs.cursor,
               "e": entries[i:i + SNAPSHOT_PART]}
        if i:
            doc["more"] = True
        docs.append(doc)
    return docs
