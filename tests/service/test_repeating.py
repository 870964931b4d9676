"""Repeating: close() ends the loop even when the repeated call swallows the cancel.

On Python 3.11 ``asyncio.wait_for`` can return a result and drop the cancel that arrived with
it; a call built on it then carries on as if nothing happened.  Before the closed flag, the
loop went on forever and close() never returned (a broker's stop hung in CI).
"""

from __future__ import annotations

import asyncio

from txbroker.service.repeating import Repeating


async def test_close_returns_when_the_call_swallows_the_cancel() -> None:
    calls = 0

    async def swallowing() -> None:
        nonlocal calls
        calls += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return  # what a lost cancel looks like from the outside

    r = Repeating(swallowing, 0.01, what="test call", errors=(OSError,))
    r.start()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(r.close(), 5.0)
    assert calls == 1
