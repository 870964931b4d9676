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
    "" when it got no answer)."""

    def __init__(self, topic: str, attempts: list[str], last: BaseException | None) -> None:
        super().__init__(f"send to topic {topic!r} failed after {len(attempts)} attempt(s): "
                         + "; ".join(attempts))
        self.topic = topic
        self.attempts = attempts
        self.code = getattr(last, "code", None)
        self.remark = getattr(last, "remark", None)
        self.addr = getattr(last, "addr", "")
