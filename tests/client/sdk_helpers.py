"""Helpers for SDK tests: bounded waiting and collecting messages from a consumer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Every wait in these tests is bounded by this (seconds); typical waits are far shorter.
WAIT = 15.0


async def wait_until(cond: Callable[[], object], timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.02)


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
