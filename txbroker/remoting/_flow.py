"""Running request handlers cheaply, shared by the server and the client.

Most handlers finish without ever waiting (a lookup, an append to a buffer, a no-op), yet an
``asyncio.Task`` per request costs more than the handler itself.  So the first step of a
handler's coroutine runs inline; only a handler that actually waits gets a task, which then
drives the rest of the same coroutine.  The client uses :func:`run_fast`; the server inlines
the same first step in its dispatch (it is the hottest path there) and then hands over to
:func:`continue_coroutine` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


def run_fast(coro: Coroutine[Any, Any, Any], on_done: Callable[[Any, BaseException | None], None],
             loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
    """Run ``coro``; call ``on_done(result, exc)`` when it ends.

    The first step runs right here: a handler that never waits (a no-op, a lookup, an append
    to a buffer) finishes without creating a task, which is most of the per-request cost on
    a busy connection.  If it does wait, the rest runs in a task that is returned, so the
    caller can track and cancel it.
    """
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        on_done(stop.value, None)
        return None
    except BaseException as exc:  # noqa: BLE001 - handed to on_done, which decides
        on_done(None, exc)
        return None
    return loop.create_task(continue_coroutine(coro, yielded, on_done))


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
