"""What the client commands share: ``--namesrv``, running a coroutine, and error reporting.

Every client command runs its coroutine on a fresh event loop in a worker thread.  That keeps
the commands callable from anywhere — a shell, a test's click runner, or code that already
runs an event loop — and lets Ctrl-C cancel the coroutine cleanly (so a consumer still commits
its offsets) instead of killing it mid-request.  Failures become one line on stderr and exit
status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from txbroker.client.errors import ClientError

DEFAULT_NAMESRV = "127.0.0.1:9876"
T = TypeVar("T")

#: Errors that are the user's or the network's, reported as one line.
EXPECTED_ERRORS = (ClientError, ValueError, TypeError, OSError, TimeoutError, ConnectionError)

namesrv_option = click.option(
    "--namesrv", envvar="TXBROKER_NAMESRV", default=DEFAULT_NAMESRV, show_default=True,
    help="Name-server address host:port (env TXBROKER_NAMESRV); several separated by ';'.")


def credentials_options(fn: Callable) -> Callable:
    """``--access-key``/``--secret-key`` for brokers with access control.

    The command receives them as one ``credentials`` argument: keyword arguments for the SDK
    client (empty when unset), so each command passes ``**credentials`` and nothing else.
    """
    @functools.wraps(fn)
    def wrapper(*args: object, access_key: str | None, secret_key: str | None, **kwargs: object):
        if (access_key is None) != (secret_key is None):
            raise click.UsageError("--access-key and --secret-key must be given together")
        credentials = {} if access_key is None else {"access_key": access_key,
                                                      "secret_key": secret_key}
        return fn(*args, credentials=credentials, **kwargs)

    wrapper = click.option("--secret-key", envvar="TXBROKER_SECRET_KEY", default=None,
                           help="Secret of --access-key (env TXBROKER_SECRET_KEY).")(wrapper)
    return click.option("--access-key", envvar="TXBROKER_ACCESS_KEY", default=None,
                        help="Access key of a plain_acl.yml account; requests are signed "
                             "(env TXBROKER_ACCESS_KEY).")(wrapper)


def is_system_topic(topic: str) -> bool:
    """Broker-internal topics (halves, ops, schedules, retries, the auto-create template)."""
    return (topic.startswith(("RMQ_SYS_", "%RETRY%", "%DLQ%", "SCHEDULE_TOPIC"))
            or topic in ("TBW102", "TRANS_CHECK_MAX_TIME_TOPIC"))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, TimeoutError) and not str(exc):
        text = "timed out waiting for the broker"
    if isinstance(exc, ConnectionRefusedError):
        text = f"connection refused ({text})"
    return " ".join(text.split())  # one line


def run(make: Callable[[], Awaitable[T]]) -> T:
    """Run ``make()`` on its own loop in a worker thread; map failures to a click error."""
    result: dict[str, object] = {}
    loop = asyncio.new_event_loop()
    main: dict[str, asyncio.Task] = {}

    async def runner() -> T:
        main["task"] = asyncio.current_task()
        return await make()

    def target() -> None:
        try:
            result["value"] = loop.run_until_complete(runner())
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            result["error"] = exc
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            done.set()

    done = threading.Event()
    thread = threading.Thread(target=target, name="txbroker-cli", daemon=True)
    # SIGTERM (a service manager stopping us) gets the same clean stop as Ctrl-C: the
    # coroutine is cancelled, so a consumer still commits what it printed.
    signals: list[int] = []
    restore = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum: int, _frame: object) -> None:
            signals.append(signum)
            raise KeyboardInterrupt
        restore = signal.signal(signal.SIGTERM, on_term)
    thread.start()
    try:
        # Event.wait, not Thread.join: a join interrupted by a signal can leave the thread
        # marked as finished while it still runs (Python 3.11), and the clean stop below
        # would then not be waited for.
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        task = main.get("task")
        if task is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
        done.wait(30)
        raise click.exceptions.Exit(128 + (signals[0] if signals else signal.SIGINT)) from None
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
    if "error" in result:
        exc = result["error"]
        if isinstance(exc, click.exceptions.ClickException | click.exceptions.Exit):
            raise exc  # type: ignore[misc]
        if isinstance(exc, asyncio.CancelledError):
            raise click.exceptions.Exit(130)
        if isinstance(exc, EXPECTED_ERRORS):
            raise click.ClickException(_describe(exc))
        logging.getLogger("txbroker.cli").debug("unexpected error", exc_info=exc)
        raise click.ClickException(f"unexpected {type(exc).__name__}: {_describe(exc)}")
    return result["value"]  # type: ignore[return-value]
