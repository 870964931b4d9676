"""Remoting requests between members of one cluster, signed with the cluster secret
(docs/cluster.md "Authentication").

With ``cluster_secret`` set, a broker signs its requests to the controller (register,
heartbeat, elect, alter the in-sync set) and the controller signs its answers and its
role-change notices.  The signature is RocketMQ's session-credential one
(:mod:`txbroker.remoting.signing`, the same computation the broker's ACL checks for clients):
``AccessKey`` is :data:`CLUSTER_ACCESS_KEY` and the secret key is the cluster secret, so no new
cryptography and no new wire field.  A peer without the secret can neither make a request the
controller obeys nor a notice a broker follows.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.signing import (
    ACCESS_KEY,
    SIGNATURE,
    SessionCredentials,
    signature,
)

log = logging.getLogger(__name__)

#: The ``AccessKey`` of a cluster-signed command (the account is the cluster itself).
CLUSTER_ACCESS_KEY = "txbroker-cluster"
#: (peer host, reason) pairs remembered (so a retrying broker is named once per reason).
MAX_REMEMBERED = 256


def sign(cmd: RemotingCommand, secret: str) -> None:
    """Add ``AccessKey`` and ``Signature``; call after every other field is set."""
    SessionCredentials(CLUSTER_ACCESS_KEY, secret).sign(cmd)


def check(cmd: RemotingCommand, secret: str | None) -> str | None:
    """None when ``cmd`` is signed as ``secret`` says it must be; else why it is not.

    Without a secret a cluster-signed command is refused too: the two ends were configured
    apart, and saying so at once beats half a cluster that trusts what the other half signs.
    """
    ext = cmd.ext_fields
    key = ext.get(ACCESS_KEY)
    if secret is None:
        if key == CLUSTER_ACCESS_KEY:
            return "it is signed with a cluster_secret, but none is set here (set the same one " \
                   "on every broker and controller)"
        return None
    if key is None or SIGNATURE not in ext:
        return "it is not signed (a cluster_secret is set here: is the same one set there?)"
    if key != CLUSTER_ACCESS_KEY:
        return f"it is signed for access key {key!r}, not with the cluster secret"
    expected = signature(secret, ext, cmd.body)
    if not hmac.compare_digest(expected.encode(), ext[SIGNATURE].encode()):
        return "its signature does not match (a different cluster_secret?)"
    return None


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
    """The controller port's ``before_request`` hook: the codes in ``codes`` must be signed
    with ``secret`` (see :func:`check`); a refusal is NO_PERMISSION with a remark saying why."""

    def __init__(self, secret: str | None, codes: frozenset[int]) -> None:
        self._secret = secret
        self.codes = codes
        self.refused = 0
        self._said = OncePerPeer()

    def __call__(self, conn: Any, cmd: RemotingCommand) -> None:
        if cmd.code not in self.codes:
            return
        why = check(cmd, self._secret)
        if why is None:
            return
        self.refused += 1
        peer = getattr(conn, "peer", "?")
        self._said(peer.rpartition(":")[0] or peer,
                   f"refused request code {cmd.code} from {peer}: {why}", why)
        raise Refusal(ResponseCode.NO_PERMISSION, f"request code {cmd.code} refused: {why}")
