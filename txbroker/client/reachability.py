"""Which broker addresses a client cannot reach now, so an outage is reported once.

A following consumer keeps a pull outstanding on every queue, commits offsets, heartbeats and
rebalances, and while a broker is down each of these retries on its own.  A line per failed
retry buries the one fact worth telling (the broker at X is gone, and later: it is back) under
dozens of lines.  So every request to a broker reports its outcome here: the first lost
connection to an address starts an outage, the next answer from it ends the outage, and the
client instance reports those two moments; the retries in between say nothing above DEBUG.

A time-out is not a lost connection (the broker is there but slow, or a long poll ran over):
callers keep reporting those themselves.  Pure state on an injected clock; event-loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def is_connection_loss(exc: BaseException) -> bool:
    """A refused, reset or closed connection.  ``TimeoutError`` is an ``OSError`` too, but a
    slow broker is not a gone one."""
    return isinstance(exc, OSError) and not isinstance(exc, TimeoutError)


class Reachability:
    """Outages per broker address: ``lost`` starts one, ``answered`` ends it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: address -> clock time its outage started
        self._down: dict[str, float] = {}

    def lost(self, addr: str, exc: BaseException) -> bool:
        """A request to ``addr`` failed with ``exc``: True when that starts an outage (the
        first connection loss since ``addr`` last answered), which the caller reports."""
        if addr in self._down or not is_connection_loss(exc):
            return False
        self._down[addr] = self._clock()
        return True

    def answered(self, addr: str) -> float | None:
        """``addr`` answered: the seconds its outage lasted when this ends one, else None."""
        if not self._down:  # the common case, on every answer: no dictionary lookup
            return None
        since = self._down.pop(addr, None)
        return None if since is None else self._clock() - since

    def is_down(self, addr: str) -> bool:
        return addr in self._down
