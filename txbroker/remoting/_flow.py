"""Running request handlers cheaply: the rest of a coroutine whose first step ran inline.

Most handlers finish without ever waiting (a lookup, an append to a buffer, a no-op), yet an
``asyncio.Task`` per request costs more than the handler itself.  So the connection core
(:mod:`txbroker.remoting.connection`) runs the first step of a handler's coroutine inline;
only a handler that actually waits gets a task, which :func:`continue_coroutine` uses to
drive the rest of the same coroutine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


async def continue_coroutine(coro: Coroutine[Any, Any, Any], yielded: Any,
                    on_done: Callable[[Any, BaseException | None], None]) -> None:
    """Drive a coroutine whose first step already ran and yielded ``yielded``.

    This is what ``asyncio.Task`` does for a coroutine, done from inside a task: wait for
    the future it yielded, then step it again.  The coroutine reads the future's outcome
    itself when resumed; a cancellation of *this* task is thrown into it.
    """
    try:
        while True:
            resume_with: BaseException | None = None
            if yielded is None:
                await asyncio.sleep(0)  # a bare yield: give others a turn
            else:
                try:
                    await _wait(yielded)
                except asyncio.CancelledError as exc:
                    resume_with = exc
            try:
                if resume_with is None:
                    yielded = coro.send(None)
                else:
                    yielded = coro.throw(resume_with)
            except StopIteration as stop:
                on_done(stop.value, None)
                return
    except BaseException as exc:
        on_done(None, exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
    finally:
        coro.close()


async def _wait(fut: Awaitable[Any]) -> None:
    """Wait until ``fut`` is done without consuming its outcome (the coroutine reads it)."""
    if isinstance(fut, asyncio.Future) and fut.done():
        return
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)

    fut.add_done_callback(wake)  # type: ignore[attr-defined]
    try:
        await waiter
    except asyncio.CancelledError:
        fut.remove_done_callback(wake)  # type: ignore[attr-defined]
        fut.cancel()  # type: ignore[attr-defined]  # as Task.cancel() cancels what it waits on
        raise
