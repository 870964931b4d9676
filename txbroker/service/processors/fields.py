"""Typed, validated access to a request's extFields.

The codec has already turned every extFields value into a string (real clients send some as
JSON numbers, booleans as "0"/"1"; protocol.md §2.5).  Here each processor states the type and
range it needs; anything else becomes :class:`FieldError` carrying the RocketMQ response code
and a remark that names the field, which the processor turns into the error response.
"""

from __future__ import annotations

from collections.abc import Mapping

from txbroker.remoting.codec import RemotingCommand
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.headers import HeaderError

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)

#: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE short keys (SendMessageRequestHeaderV2).
SEND_V2_KEYS = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
    "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
    "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "bname",
}


class FieldError(HeaderError):
    """A request the broker refuses; ``code`` is the response code, ``remark`` the reason.

    A :class:`HeaderError`, so a refusal that escapes a handler still becomes this response.
    """


def error_response(cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
    """Response for any refusal carrying ``code``/``remark`` (FieldError, TopicError, ...)."""
    code = getattr(exc, "code", ResponseCode.SYSTEM_ERROR)
    remark = getattr(exc, "remark", None) or str(exc)
    return cmd.response(int(code), remark)


class Fields:
    """Reads fields from an extFields mapping with type and range checks."""

    __slots__ = ("ext",)

    def __init__(self, ext: Mapping[str, str]) -> None:
        self.ext = ext

    def str(self, name: str, *, required: bool = True, default: str | None = None) -> str | None:
        value = self.ext.get(name)
        if value is None or (required and value == ""):
            if required:
                raise FieldError(ResponseCode.SYSTEM_ERROR, f"missing header field '{name}'")
            return default
        return value

    def int(self, name: str, *, required: bool = True, default: int | None = None,
            lo: int = INT32[0], hi: int = INT32[1]) -> int | None:
        raw = self.ext.get(name)
        if raw is None or raw == "":
            if required:
                raise FieldError(ResponseCode.SYSTEM_ERROR, f"missing header field '{name}'")
            return default
        try:
            value = int(raw)
        except ValueError:
            raise FieldError(ResponseCode.SYSTEM_ERROR,
                             f"header field '{name}'={raw!r} is not an integer") from None
        if not lo <= value <= hi:
            raise FieldError(ResponseCode.SYSTEM_ERROR,
                             f"header field '{name}'={value} out of range [{lo}, {hi}]")
        return value

    def long(self, name: str, *, required: bool = True, default: int | None = None,
             lo: int = INT64[0], hi: int = INT64[1]) -> int | None:
        return self.int(name, required=required, default=default, lo=lo, hi=hi)

    def bool(self, name: str, *, default: bool = False) -> bool:
        """Java's "true" and the C++ client's "1", any case; anything else is an error."""
        raw = self.ext.get(name)
        if raw is None or raw == "":
            return default
        text = raw.strip().lower()
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise FieldError(ResponseCode.SYSTEM_ERROR, f"header field '{name}'={raw!r} is not a boolean")


def send_fields(cmd: RemotingCommand, *, v2: bool) -> Fields:
    """SEND_MESSAGE uses long names; V2 and batch use the one-letter keys."""
    if not v2:
        return Fields(cmd.ext_fields)
    ext = cmd.ext_fields
    return Fields({SEND_V2_KEYS.get(k, k): v for k, v in ext.items()})
