"""Errors the SDK raises.  Every message says what failed and why, including the broker's
response code and remark when the broker refused, so a log line is enough to act on."""

from __future__ import annotations

from txbroker.remoting.codes import ResponseCode


def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


class ClientError(Exception):
    """Base class of everything the SDK raises on purpose."""


class ClientStateError(ClientError):
    """The client was used out of order (not started, already shut down)."""


class RouteError(ClientError):
    """No route for a topic (unknown topic, no writable queue, name server unreachable)."""


class LocatedError(ClientError):
    """A failure that belongs to one address: ``reason`` says what is wrong, ``addr`` where.

    The message joins the two; a caller that reports the address itself (the CLI's one-line
    errors) takes ``reason`` so the address is not named twice.
    """

    def __init__(self, reason: str, addr: str) -> None:
        super().__init__(f"{reason} at {addr}")
        self.reason = reason
        self.addr = addr


class TopicNotFoundError(LocatedError, RouteError):
    """The name server at ``namesrv`` knows no topic ``topic`` (nothing was created)."""

    def __init__(self, topic: str, namesrv: str) -> None:
        super().__init__(f"no such topic {topic!r}", namesrv)
        self.topic = topic
        self.namesrv = namesrv


class TopicExistsError(LocatedError):
    """Creating ``topic`` refused: the broker at ``addr`` already has it with ``queues`` queues."""

    def __init__(self, topic: str, addr: str, queues: int) -> None:
        super().__init__(f"topic {topic!r} already exists ({queues} queues)", addr)
        self.topic = topic
        self.queues = queues


class TopicShrinkError(LocatedError):
    """Shrinking ``topic`` refused: its queues past the new count still hold messages, which
    the fewer queues would hide from consumers.  ``held`` maps queue id -> message count."""

    def __init__(self, topic: str, addr: str, queues: int, held: dict[int, int]) -> None:
        total = sum(held.values())
        super().__init__(f"queue(s) {queue_ranges(sorted(held))} of topic {topic!r} hold {total} "
                         f"message(s) that shrinking to {queues} queue(s) would hide", addr)
        self.topic = topic
        self.queues = queues
        self.held = held


def queue_ranges(ids: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5" (sorted queue ids)."""
    runs: list[list[int]] = []
    for q in ids:
        if runs and q == runs[-1][1] + 1:
            runs[-1][1] = q
        else:
            runs.append([q, q])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class BrokerError(ClientError):
    """The broker answered with an error code; ``code`` and ``remark`` are the broker's."""

    def __init__(self, what: str, code: int, remark: str | None, addr: str = "") -> None:
        where = f" from {addr}" if addr else ""
        super().__init__(f"{what}: broker{where} answered {code_name(code)} ({code})"
                         + (f": {remark}" if remark else ""))
        self.what = what
        self.code = code
        self.remark = remark or ""
        self.addr = addr


class SendError(ClientError):
    """A send failed on every attempt; ``attempts`` holds one line per attempt.

    ``code``, ``remark`` and ``addr`` are the last attempt's broker refusal (None, None and
    "" when it got no answer).  ``may_be_stored``: the last attempt's outcome is unknown (no
    answer, or the broker said so); a transaction's half may then be stored, and its
    producer's check-back answer decides it."""

    def __init__(self, topic: str, attempts: list[str], last: BaseException | None, *,
                 may_be_stored: bool = False) -> None:
        tail = " (the message may have been stored)" if may_be_stored else ""
        super().__init__(f"send to topic {topic!r} failed after {len(attempts)} attempt(s): "
                         + "; ".join(attempts) + tail)
        self.may_be_stored = may_be_stored
        self.topic = topic
        self.attempts = attempts
        self.code = getattr(last, "code", None)
        self.remark = getattr(last, "remark", None)
        self.addr = getattr(last, "addr", "")
