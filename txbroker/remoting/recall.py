"""The recall handle of a timer message (RocketMQ 5.3 ``RecallMessageHandle.HandleV1``):
URL-safe base64 of ``"v1 <topic> <brokerName> <deliverMs> <messageId>"``.  The broker builds
it for a stored timer, the SDK reads the broker name from it to know where to send the recall,
and RECALL_MESSAGE / gRPC RecallMessage carry it back (pure: no I/O)."""

from __future__ import annotations

import base64
import binascii
from typing import NamedTuple

_VERSION = "v1"
#: Longest deliverMs text accepted (an epoch in ms has 13 digits): no giant int parsing.
_MAX_DIGITS = 18


class RecallHandle(NamedTuple):
    topic: str
    broker_name: str
    deliver_ms: int
    msg_id: str


def encode_handle(topic: str, broker_name: str, deliver_ms: int, msg_id: str) -> str:
    raw = " ".join((_VERSION, topic, broker_name, str(deliver_ms), msg_id))
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii")


def decode_handle(handle: str) -> RecallHandle:
    """The handle's fields; ValueError naming the handle when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(handle.encode("ascii")).decode()
    except (UnicodeError, binascii.Error, ValueError):
        raw = ""
    items = raw.split(" ")
    if (len(items) < 5 or items[0] != _VERSION or not items[3].isascii()
            or not items[3].isdigit() or len(items[3]) > _MAX_DIGITS):
        raise ValueError(f"recall handle {handle[:80]!r} is invalid")
    return RecallHandle(items[1], items[2], int(items[3]), items[4])
