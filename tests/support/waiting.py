"""Waiting on state instead of sleeping: a test waits for the condition it needs, bounded, and
fails with a message that says what did not happen."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: The default bound (seconds) on any wait; typical waits are far shorter.
WAIT = 15.0
#: How often a condition is re-evaluated (seconds).
INTERVAL = 0.01


async def eventually(predicate: Callable[[], object | Awaitable[object]], timeout: float = WAIT,
                     msg: str | Callable[[], str] = "condition") -> None:
    """Return as soon as ``predicate()`` is truthy; fail with ``msg`` after ``timeout`` seconds.

    ``predicate`` may be a plain or an async callable.  ``msg`` may be a callable, so the
    failure can describe the state at the moment it gave up.  Never returns a bool: a wait that
    runs out is a failed test, not a value to be forgotten.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            text = msg() if callable(msg) else msg
            raise AssertionError(f"not within {timeout:g}s: {text}")
        await asyncio.sleep(INTERVAL)
