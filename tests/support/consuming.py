"""Collecting messages from an SDK consumer, bounded like every other wait in the tests."""

from __future__ import annotations

import time

from support.waiting import WAIT


async def collect(consumer, count: int, timeout: float = WAIT) -> list:
    """Poll until ``count`` messages arrived (fails after ``timeout``)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"got {len(out)} of {count} messages within {timeout}s")
        msg = await consumer.poll(remaining)
        if msg is not None:
            out.append(msg)
    return out
