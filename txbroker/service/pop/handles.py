"""Receipt handles: txbroker's own, opaque to clients.  Pure.

``p1 <serial hex> <queue id> <queue offset> <topic>``: the version, the serial of the
delivery (63 random bits, so a handle cannot be guessed, and a redelivery or a change of
invisibility makes the old one stale), and where the message is.  The group comes with the
ack request, as in RocketMQ.  Topic names hold no spaces, so the topic is the last field
whole.  RocketMQ's own handle (the broker's checkpoint fields) is different and need not be
matched: clients never read one (docs/grpc.md, "POP consumption").
"""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.service.pop.state import PopError, PopErrorKind

VERSION = "p1"
#: Longest handle accepted: the fixed fields plus the longest stored topic name, with room.
MAX_HANDLE = 512


@dataclass(frozen=True, slots=True)
class Handle:
    topic: str
    queue_id: int
    offset: int
    serial: int

    def encode(self) -> str:
        return f"{VERSION} {self.serial:x} {self.queue_id} {self.offset} {self.topic}"


def decode(text: str) -> Handle:
    """The handle ``text`` names; :class:`PopError` INVALID_HANDLE when it is not one of ours."""
    if not text or len(text) > MAX_HANDLE:
        raise PopError(PopErrorKind.INVALID_HANDLE, "receipt handle is empty or too long")
    parts = text.split(" ", 4)
    if len(parts) != 5 or parts[0] != VERSION:
        raise PopError(PopErrorKind.INVALID_HANDLE,
                       f"receipt handle {text[:64]!r} is not a receipt handle of this broker")
    try:
        serial = int(parts[1], 16)
        queue_id = int(parts[2])
        offset = int(parts[3])
    except ValueError:
        raise PopError(PopErrorKind.INVALID_HANDLE,
                       f"receipt handle {text[:64]!r} is malformed") from None
    if serial < 0 or queue_id < 0 or offset < 0 or not parts[4]:
        raise PopError(PopErrorKind.INVALID_HANDLE, f"receipt handle {text[:64]!r} is malformed")
    return Handle(parts[4], queue_id, offset, serial)
