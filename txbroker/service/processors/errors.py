"""Refusals a processor answers with an error response instead of a result.

Field checks (presence, type, range) are the typed headers' job (``remoting.headers`` raises
:class:`~txbroker.remoting.headers.HeaderError`); what is left for a processor to refuse is
about broker state: the topic is a system topic or not writable, the queue id is beyond the
topic's queues, the body is too big.  Such a refusal is a :class:`Refusal` carrying the
RocketMQ response code and a remark, and every refusal kind (header, body, topic, transaction)
becomes the same kind of answer through :func:`error_response`.
"""

from __future__ import annotations

from txbroker.remoting.codec import RemotingCommand
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.headers import HeaderError


class Refusal(HeaderError):
    """A request the broker refuses for a reason of its own state; ``code`` and ``remark``.

    A :class:`HeaderError`, so a refusal that escapes a handler still becomes this response.
    """


def error_response(cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
    """Response for any refusal carrying ``code``/``remark`` (HeaderError, TopicError, ...)."""
    code = getattr(exc, "code", ResponseCode.SYSTEM_ERROR)
    remark = getattr(exc, "remark", None) or str(exc)
    return cmd.response(int(code), remark)
