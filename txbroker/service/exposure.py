"""The start-up warning of a process reachable beyond loopback with a port left open
(docs/security.md, "RocketMQ port and name servers").

The quick start listens on 127.0.0.1 in plaintext without authentication, and that is safe:
only the machine's own users reach it.  The same settings on 0.0.0.0 (or any other address)
let anyone on the network read message bodies and access keys off the wire and, where no
authentication is set, send what they like.  Nothing refuses to start (a private network may
be trusted on purpose), but the operator hears it once, in one line naming each open port:

    warning: listening on 0.0.0.0 without TLS on ports 10911 (remoting), 9092 (kafka); without
    authentication on 9092 (kafka)

Pure: the composition roots describe their listeners (:class:`Listener`) and print the line.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Listener:
    """One bound port as the warning sees it.

    ``tls``: every connection is encrypted (a permissive port also accepts plaintext, so it
    is not).  ``auth``: a peer must authenticate before it changes anything; None for a port
    that only answers reads anyone may make (a broker's name-server port serves routes).
    """

    port: int
    name: str
    tls: bool
    auth: bool | None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as given to bind) is reachable from this machine only.  ``""`` binds
    every interface, like 0.0.0.0; a name other than ``localhost`` is taken as reachable."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _ports(listeners: Iterable[Listener]) -> str:
    return ", ".join(f"{item.port} ({item.name})" for item in listeners)


def exposure_warning(host: str, listeners: Iterable[Listener]) -> str | None:
    """The one warning line for ``listeners`` bound on ``host``, or None: loopback, or every
    port is encrypted and authenticated."""
    if is_loopback(host):
        return None
    listeners = list(listeners)
    plaintext = [item for item in listeners if not item.tls]
    open_ = [item for item in listeners if item.auth is False]
    if not plaintext and not open_:
        return None
    parts = []
    if plaintext:
        parts.append(f"without TLS on {'port' if len(plaintext) == 1 else 'ports'} "
                     f"{_ports(plaintext)}")
    if open_:
        parts.append(f"without authentication on {'port' if len(open_) == 1 else 'ports'} "
                     f"{_ports(open_)}")
    return f"warning: listening on {host or '0.0.0.0'} " + "; ".join(parts)
