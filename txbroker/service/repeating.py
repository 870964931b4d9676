"""A call repeated on a task of its own, for the broker's background conversations with its
master (metadata sync) and its controller (heartbeats).

Such a call fails for as long as its peer is away, so a failure is logged when it starts and
when it ends, not once per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Repeating:
    """``fn()`` every ``interval`` seconds until :meth:`close`; ``errors`` are the expected
    failures (logged on a change of state), anything else is logged with its traceback."""

    def __init__(self, fn: Callable[[], Awaitable[object]], interval: float, *, what: str,
                 errors: tuple[type[BaseException], ...]) -> None:
        self._fn = fn
        self.interval = interval
        self.what = what
        self._errors = errors
        self._task: asyncio.Task | None = None
        self._failing = False
        self._closed = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"txbroker-{self.what}")

    async def close(self) -> None:
        self._closed = True  # the loop ends even if ``fn`` swallowed the cancel below
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while not self._closed:
            try:
                await self._fn()
                if self._failing:
                    log.info("%s works again", self.what)
                self._failing = False
            except self._errors as exc:
                if not self._failing:
                    log.warning("%s failed: %s", self.what, exc)
                self._failing = True
            except Exception:
                log.exception("%s failed", self.what)
            await asyncio.sleep(self.interval)
