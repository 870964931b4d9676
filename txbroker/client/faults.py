"""Send fault tolerance: which broker groups a producer avoids for a while, and queue choice.

RocketMQ 5.x's ``MQFaultStrategy`` / ``LatencyFaultTolerance`` (docs/cluster.md, "Clients
across several brokers"): after every send attempt the producer records the broker group's
latency, or an *isolation* for an attempt that failed.  The latency picks a back-off from the
table below (a failure counts as 10 000 ms, i.e. 10 s); the group is unavailable until the
back-off has passed.  Queue choice then tries, in order: queues of available groups other than
the one that just failed, queues of reachable groups other than it, queues of any other group,
any queue.  RocketMQ ships this switched off; the SDK switches it on, because a broker group
that died or hangs would otherwise get a third of the first attempts until the name server
drops it (up to 120 s), each costing a time-out.

Pure: no I/O, and the clock is injected (seconds, monotonic), so the windows are testable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from txbroker.client.rebalance import MessageQueue

#: RocketMQ 5.x ``latencyMax`` (ms): the largest entry not above the latency picks ...
LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
#: ... the back-off (``notAvailableDuration``, ms) at the same index.
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
#: A failed attempt is recorded as this latency (5.x: 10 s of back-off).
ISOLATION_LATENCY_MS = 10_000


#: Latencies below this get no back-off: every attempt that went well is checked against it
#: first, so the common case does not walk the table.
NO_BACKOFF_BELOW_MS = min(limit for limit, duration in zip(LATENCY_MAX_MS, NOT_AVAILABLE_MS,
                                                          strict=True) if duration)


def not_available_ms(latency_ms: float) -> int:
    """The back-off for ``latency_ms`` (``MQFaultStrategy.computeNotAvailableDuration``)."""
    if latency_ms < NO_BACKOFF_BELOW_MS:
        return 0
    for limit, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS), strict=True):
        if latency_ms >= limit:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    """One broker group's last recorded attempt."""

    latency_ms: float
    #: Clock value (s) from which the group is available again.
    available_at: float
    #: False after a failure that never reached the broker (refused connection).
    reachable: bool


class FaultTracker:
    """Per-producer fault items and the queue choice that uses them.  ``enabled=False``
    keeps only the avoid-the-last-failed-group rule (RocketMQ with the feature off)."""

    def __init__(self, *, enabled: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.clock = clock
        self.items: dict[str, FaultItem] = {}
        #: Latest ``available_at`` recorded: while the clock is past it every group is
        #: available, and the choice needs no filtering (the common case, kept cheap).
        self._horizon = 0.0

    def update(self, broker_name: str, latency_ms: float, *, isolation: bool = False,
               reachable: bool = True) -> None:
        """Record one attempt on ``broker_name`` (``isolation``: it failed)."""
        if not self.enabled:
            return
        duration = not_available_ms(ISOLATION_LATENCY_MS if isolation else latency_ms)
        if not duration and broker_name not in self.items:
            return  # a fast answer from a group never in trouble changes nothing
        until = self.clock() + duration / 1000.0
        self.items[broker_name] = FaultItem(latency_ms, until, reachable)
        self._horizon = max(self._horizon, until)

    def available(self, broker_name: str) -> bool:
        item = self.items.get(broker_name)
        return item is None or self.clock() >= item.available_at

    def reachable(self, broker_name: str) -> bool:
        item = self.items.get(broker_name)
        return item is None or item.reachable

    def select(self, queues: Sequence[MessageQueue], n: int, last_broker: str | None) -> MessageQueue:
        """The ``n``-th round-robin queue among the best tier of ``queues`` (see the module
        docstring); ``last_broker`` is the group the previous attempt failed on."""
        if last_broker is None and (not self.enabled or self.clock() >= self._horizon):
            return queues[n % len(queues)]
        tiers: list[Callable[[MessageQueue], bool]] = []
        if self.enabled:
            tiers += [lambda q: q.broker_name != last_broker and self.available(q.broker_name),
                      lambda q: q.broker_name != last_broker and self.reachable(q.broker_name)]
        tiers.append(lambda q: q.broker_name != last_broker)
        for keep in tiers:
            chosen = [q for q in queues if keep(q)]
            if chosen:
                return chosen[n % len(chosen)]
        return queues[n % len(queues)]
