"""A manual clock for the store, the transaction service and the broker: the check-pass bench
(``txcheck``) and the tests move time forward with :meth:`ManualClock.advance` instead of
waiting through immunity or delay times.  It lives here, not in ``txbroker/``: the broker
itself always runs on real time."""

from __future__ import annotations

import time


class ManualClock:
    """Seconds since the epoch, moved forward only by :meth:`advance` unless ``follows_real_time``.

    A frozen clock (the default) makes immunity and check timing exact.  A broker whose
    background work also needs ordinary time to pass (flushes, scheduled deliveries) gets
    ``follows_real_time=True``: real time plus everything advanced so far.
    """

    def __init__(self, *, follows_real_time: bool = False) -> None:
        self.follows_real_time = follows_real_time
        self.start = time.time()
        self.offset = 0.0

    def __call__(self) -> float:
        return (time.time() if self.follows_real_time else self.start) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
