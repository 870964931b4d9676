"""The store's background work: periodic tasks, and blocking file calls run in the executor.

Everything in the store mutates on the event-loop thread; what may block on the disk (flushes,
checkpoints, offset persistence, file deletion) is handed to the default executor through
:func:`off_loop`, so a request never waits behind a disk call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


async def off_loop(fn: Callable[..., object], *args: object) -> None:
    """Run blocking file work in the default executor.  A caller cancelled meanwhile still
    waits for it to finish before the cancellation goes on: :meth:`MessageStore.close` cancels
    the periodic tasks and then writes the same files, and a checkpoint or offsets write still
    running in a thread could otherwise land after the final one."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise


async def periodic(interval: float, fn: Callable[[], object]) -> None:
    """Call ``fn`` (plain or async) every ``interval`` seconds until cancelled; a failing call
    is logged and the next one still runs."""
    while True:
        await asyncio.sleep(interval)
        try:
            result = fn()
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            log.exception("store background task %s failed", getattr(fn, "__name__", fn))
