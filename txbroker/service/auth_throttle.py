"""Per-address back-off for failed authentications, one policy for every port that
authenticates peers: Kafka SASL (``service/kafka/listener.py``) and the RocketMQ port's
signed requests (``service/acl.py``).

Why a back-off and not a ban: a legitimate client with a stale password keeps retrying, and
must still get in once fixed; an address that keeps guessing is slowed exponentially (0.1 s
doubling up to 5 s per attempt, so about 12 guesses a minute per connection), and one
success or a quiet minute forgets it.  The caller delays *its own answer* by :meth:`delay`
(``await asyncio.sleep`` in that connection's handler): other connections are not held up.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class AuthThrottle:
    """Failed authentications per client address: an address that failed is answered later
    each time (``base`` doubling up to ``ceiling``, forgotten after ``window`` without a
    failure or by a success), and its failures are logged at most once per ``window``.  At most
    ``max_addresses`` are remembered (the oldest are forgotten first)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, base: float = 0.1,
                 ceiling: float = 5.0, window: float = 60.0, max_addresses: int = 10000) -> None:
        self._clock = clock
        self._base = base
        self._ceiling = ceiling
        self._window = window
        self._max = max_addresses
        #: address -> [failures, time of last failure, time of last log line]
        self._seen: OrderedDict[str, list[float]] = OrderedDict()

    def delay(self, address: str) -> float:
        """Seconds to wait before answering an authentication attempt from ``address``."""
        entry = self._seen.get(address)
        if entry is None or not entry[0] or self._clock() - entry[1] > self._window:
            return 0.0
        return min(self._base * 2 ** (entry[0] - 1), self._ceiling)

    def failed(self, address: str) -> bool:
        """Count a failure; True when it should be logged (the first in ``window``)."""
        now = self._clock()
        entry = self._seen.pop(address, None)
        if entry is None or now - entry[1] > self._window:
            entry = [0.0, now, -self._window - 1.0]
        entry[0] += 1
        entry[1] = now
        log_it = now - entry[2] > self._window
        if log_it:
            entry[2] = now
        self._seen[address] = entry
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return log_it

    def succeeded(self, address: str) -> None:
        """Forget the address's failures (its back-off), not when its last line was logged: a
        guesser that also holds a valid key still gets one line a minute."""
        entry = self._seen.get(address)
        if entry is not None:
            entry[0] = 0.0
