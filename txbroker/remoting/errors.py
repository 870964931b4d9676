"""The one wire-level error: a request refused with a RocketMQ response code and a remark.

A refusal is the peer's mistake or a state of the broker the peer must hear about (a bad header,
an unknown topic, a denied ACL check, a contradicting transaction decision), never a bug.  Every
refusal class of the broker derives from :class:`Refusal` so that the transport can recognise
it by type: a handler (or the ``before_request`` gate) raises it, and
:class:`~txbroker.remoting.server.Connection` answers it with :meth:`Refusal.answer` and keeps
the connection; any other exception is a handler bug answered with SYSTEM_ERROR.  Handlers
therefore raise refusals instead of building error responses themselves.
"""

from __future__ import annotations

from txbroker.remoting.command import RemotingCommand


class Refusal(Exception):
    """A refused request: the error response carries ``code`` and ``remark`` as they are."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark

    def answer(self, cmd: RemotingCommand) -> RemotingCommand:
        """The error response to ``cmd`` (the transport sets opaque and flags)."""
        return cmd.response(self.code, self.remark)
