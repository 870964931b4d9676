"""Remoting requests between members of one cluster, in the cluster envelope
(:mod:`txbroker.remoting.envelope`; docs/cluster.md "Links between nodes").

With ``cluster_secret`` set, a broker's requests to the controller (register, heartbeat,
elect, alter the in-sync set) and to the name servers (register, unregister) carry a
timestamp, a random nonce and an HMAC over their named fields and body; the receiver obeys
each at most once and only within :data:`~txbroker.remoting.envelope.MAX_CLOCK_SKEW` of its
making.  The controller's and the name servers' answers are signed over the request's nonce
too, and the controller's role-change notices are requests in the envelope of their own.  A
peer without the secret can make no request a node obeys and no answer or notice a broker
believes, and a recorded one is worth nothing later or elsewhere.

This module is where the envelope meets :class:`RemotingCommand`, the clocks and the
randomness; the envelope itself stays pure.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from txbroker.remoting import envelope
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.envelope import EnvelopeError, ReplayGuard
from txbroker.remoting.errors import Refusal

log = logging.getLogger(__name__)

#: The cluster's own account: the Kafka user brokers log in to each other as, and the name a
#: cluster-signed Kafka request's client id starts with (``kafka/peer_envelope.py``).
CLUSTER_ACCESS_KEY = "txbroker-cluster"
#: (peer host, reason) pairs remembered (so a retrying broker is named once per reason).
MAX_REMEMBERED = 256

Clock = Callable[[], float]


def sign_request(cmd: RemotingCommand, secret: str, *, clock: Clock = time.time) -> str:
    """Put ``cmd`` (a request or a one-way notice) in the envelope; call after every other
    field is set.  Returns its nonce: the answer must be signed over it."""
    return envelope.sign_request(secret, cmd.code, cmd.ext_fields, cmd.body, now=clock(),
                                 nonce=os.urandom(envelope.NONCE_BYTES))


def sign_answer(resp: RemotingCommand, secret: str, request: RemotingCommand) -> None:
    """Sign ``resp``, the answer to ``request``, over the request's nonce."""
    envelope.sign_answer(secret, resp.code, resp.remark, resp.ext_fields, resp.body,
                         request.ext_fields.get(envelope.NONCE, ""))


def check_request(cmd: RemotingCommand, secret: str | None, replays: ReplayGuard, *,
                  clock: Clock = time.time) -> str | None:
    """None when ``cmd`` may be obeyed as ``secret`` says; else why not.

    Without a secret a cluster-signed command is refused too: the two ends were configured
    apart, and saying so at once beats half a cluster that trusts what the other half signs.
    With one, the signature is checked first and the nonce remembered only then."""
    if secret is None:
        if envelope.is_signed(cmd.ext_fields):
            return "it is signed with a cluster_secret, but none is set here (set the same one " \
                   "on every broker, name server and controller)"
        return None
    try:
        stamp = envelope.verify_request(secret, cmd.code, cmd.ext_fields, cmd.body)
        replays.admit(stamp, clock())
    except EnvelopeError as exc:
        return _hint(exc)
    return None


def check_answer(resp: RemotingCommand, secret: str | None, request_nonce: str | None) -> str | None:
    """None when ``resp`` may be believed as the answer to the request of ``request_nonce``
    (the nonce :func:`sign_request` returned; None when the request went unsigned)."""
    if secret is None:
        if envelope.is_signed(resp.ext_fields):
            return "it is signed with a cluster_secret, but none is set here"
        return None
    try:
        envelope.verify_answer(secret, resp.code, resp.remark, resp.ext_fields, resp.body,
                               request_nonce or "")
    except EnvelopeError as exc:
        return _hint(exc)
    return None


def _hint(exc: EnvelopeError) -> str:
    if exc.reason == "it is not signed":
        return "it is not signed (a cluster_secret is set here: is the same one set there?)"
    return str(exc)


def reason_of(why: str) -> str:
    """The fixed part of a refusal (before any figures), to log each cause once."""
    return why.partition(":")[0]


class OncePerPeer:
    """Logs a peer's refusal once per (host, reason); repeats go to DEBUG (a broker retries
    every heartbeat, and one line says it all)."""

    def __init__(self) -> None:
        self._said: dict[tuple[str, str], None] = {}

    def __call__(self, host: str, line: str, reason: str) -> None:
        if (host, reason) in self._said:
            log.debug("%s", line)
            return
        if len(self._said) >= MAX_REMEMBERED:
            self._said.pop(next(iter(self._said)))
        self._said[(host, reason)] = None
        log.warning("%s", line)


class ClusterGuard:
    """A cluster port's ``before_request`` hook (controller, name server): the codes in
    ``codes`` must come in the envelope of ``secret``, fresh and never seen before (see
    :func:`check_request`); a refusal is NO_PERMISSION with a remark saying why.

    :meth:`signed` wraps a handler so its answers are signed over the request's nonce."""

    def __init__(self, secret: str | None, codes: frozenset[int], *,
                 clock: Clock = time.time) -> None:
        self._secret = secret
        self.codes = codes
        self.refused = 0
        self.replays = ReplayGuard()
        self._clock = clock
        self._said = OncePerPeer()

    def __call__(self, conn: Any, cmd: RemotingCommand) -> None:
        if cmd.code not in self.codes:
            return
        why = check_request(cmd, self._secret, self.replays, clock=self._clock)
        if why is None:
            return
        self.refused += 1
        peer = getattr(conn, "peer", "?")
        self._said(peer.rpartition(":")[0] or peer,
                   f"refused request code {cmd.code} from {peer}: {why}", reason_of(why))
        raise Refusal(ResponseCode.NO_PERMISSION, f"request code {cmd.code} refused: {why}")

    def signed(self, handler: Callable) -> Callable:
        """``handler`` whose answers are signed for the request they answer (when a secret is
        set), so a broker can tell this node's answers from anyone else's, and one answer
        from another."""
        secret = self._secret
        if secret is None:
            return handler

        async def signed(conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
            resp = await handler(conn, cmd)
            if resp is not None:
                sign_answer(resp, secret, cmd)
            return resp
        return signed
