"""What the client commands share: ``--namesrv``, running a coroutine, and error reporting.

Every client command runs its coroutine on a fresh event loop in a worker thread.  That keeps
the commands callable from anywhere — a shell, a test's click runner, or code that already
runs an event loop — and lets Ctrl-C cancel the coroutine cleanly (so a consumer still commits
its offsets) instead of killing it mid-request.  Failures become one line on stderr,
``error: <what> at <address>: <why>``, and exit status 1 (usage errors: 2), never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import IO, Any, TypeVar

import click

from txbroker.client.errors import (
    BrokerError,
    ClientError,
    LocatedError,
    SendError,
    code_name,
)
from txbroker.config import ConfigError, check_environ
from txbroker.remoting.tls import ClientTLS
from txbroker.service.exposure import Listener, exposure_warning

DEFAULT_NAMESRV = "127.0.0.1:9876"
T = TypeVar("T")

#: Errors that are the user's or the network's, reported as one line.
EXPECTED_ERRORS = (ClientError, ValueError, TypeError, OSError, TimeoutError, ConnectionError)

namesrv_option = click.option(
    "--namesrv", envvar="TXBROKER_NAMESRV", default=DEFAULT_NAMESRV, show_default=True,
    help="Name-server address host:port (env TXBROKER_NAMESRV); several separated by ';'.")


def credentials_options(fn: Callable) -> Callable:
    """``--access-key``/``--secret-key`` for brokers with access control, and ``--tls``,
    ``--tls-ca``, ``--tls-insecure``, ``--tls-client-cert``/``--tls-client-key`` for brokers
    with TLS (docs/security.md "TLS").

    The command receives them as one ``credentials`` argument: keyword arguments for the SDK
    client (empty when unset), so each command passes ``**credentials`` and nothing else.
    Any of the ``--tls-*`` options implies ``--tls``.
    """
    @functools.wraps(fn)
    def wrapper(*args: object, access_key: str | None, secret_key: str | None, tls: bool,
                tls_ca: str | None, tls_insecure: bool, tls_client_cert: str | None,
                tls_client_key: str | None, **kwargs: object):
        if (access_key is None) != (secret_key is None):
            raise click.UsageError("--access-key and --secret-key must be given together")
        credentials: dict[str, Any] = {} if access_key is None else {"access_key": access_key,
                                                                      "secret_key": secret_key}
        if (tls_client_cert is None) != (tls_client_key is None):
            raise click.UsageError("--tls-client-cert and --tls-client-key must be given together")
        if tls or tls_ca is not None or tls_insecure or tls_client_cert is not None:
            if tls_ca is not None and tls_insecure:
                raise click.UsageError("--tls-ca and --tls-insecure contradict each other")
            credentials["tls"] = ClientTLS(ca=tls_ca, insecure=tls_insecure,
                                           cert=tls_client_cert, key=tls_client_key)
        return fn(*args, credentials=credentials, **kwargs)

    wrapper = click.option("--tls-client-key", envvar="TXBROKER_TLS_CLIENT_KEY", default=None,
                           metavar="PATH", help="PEM key of --tls-client-cert "
                                                "(env TXBROKER_TLS_CLIENT_KEY).")(wrapper)
    wrapper = click.option("--tls-client-cert", envvar="TXBROKER_TLS_CLIENT_CERT", default=None,
                           metavar="PATH", help="PEM client certificate, for brokers with "
                                                "--tls-client-auth (env TXBROKER_TLS_CLIENT_CERT)."
                           )(wrapper)
    wrapper = click.option("--tls-insecure", is_flag=True, envvar="TXBROKER_TLS_INSECURE",
                           help="TLS without verifying the broker's certificate or host name: "
                                "for tests and development only (env TXBROKER_TLS_INSECURE)."
                           )(wrapper)
    wrapper = click.option("--tls-ca", envvar="TXBROKER_TLS_CA", default=None, metavar="PATH",
                           help="PEM CA file the broker's certificate is verified against "
                                "(implies --tls; default: the system store) "
                                "(env TXBROKER_TLS_CA).")(wrapper)
    wrapper = click.option("--tls", is_flag=True, envvar="TXBROKER_TLS",
                           help="Connect to name servers and brokers with TLS, verifying their "
                                "certificates (env TXBROKER_TLS).")(wrapper)
    wrapper = click.option("--secret-key", envvar="TXBROKER_SECRET_KEY", default=None,
                           help="Secret of --access-key (env TXBROKER_SECRET_KEY).")(wrapper)
    return click.option("--access-key", envvar="TXBROKER_ACCESS_KEY", default=None,
                        help="Access key of a plain_acl.yml account; requests are signed "
                             "(env TXBROKER_ACCESS_KEY).")(wrapper)


def server_tls_options(fn: Callable) -> Callable:
    """``--tls-mode``, ``--tls-cert``, ``--tls-key``, ``--tls-ca``, ``--tls-client-auth`` for
    a server other than ``serve`` (namesrv, controller): the broker's settings, with the same
    names and ``TXBROKER_*`` variables, passed to the command as they are."""
    options = [
        ("--tls-mode", "TXBROKER_TLS_MODE", click.Choice(["off", "permissive", "enforcing"]),
         "off", ("TLS on this port: permissive also accepts plaintext, enforcing closes "
                "plaintext connections")),
        ("--tls-cert", "TXBROKER_TLS_CERT", None, None,
         "PEM server certificate (chain); re-read when the file changes"),
        ("--tls-key", "TXBROKER_TLS_KEY", None, None, "PEM key of --tls-cert"),
        ("--tls-ca", "TXBROKER_TLS_CA", None, None,
         "PEM CA that client certificates are verified against"),
        ("--tls-client-auth", "TXBROKER_TLS_CLIENT_AUTH",
         click.Choice(["none", "optional", "required"]), "none",
         ("client certificates: none, optional (verified when sent) or required (mTLS; needs "
         "--tls-ca)")),
    ]
    for flag, envvar, kind, default, help_text in reversed(options):
        fn = click.option(flag, envvar=envvar, type=kind, default=default,
                          show_default=default is not None, metavar=None if kind else "PATH",
                          help=f"{help_text} (env {envvar})")(fn)
    return fn


def option_env_vars(command: click.Command) -> set[str]:
    """Every environment variable an option of ``command`` or of its sub-commands reads."""
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            names |= option_env_vars(sub)
    return names


def check_setting_variables() -> None:
    """At a server's start-up (serve, namesrv, controller): a ``TXBROKER_*`` variable that no
    setting and no option of any command reads is one ``error:`` line naming the closest known
    one, exit 2.  The options' variables count as known because the client commands' ones
    (``TXBROKER_NAMESRV``, ...) are often exported in the shell that starts the broker."""
    ctx = click.get_current_context(silent=True)
    known = option_env_vars(ctx.find_root().command) if ctx is not None else set()
    try:
        check_environ(os.environ, known)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def is_system_topic(topic: str) -> bool:
    """Broker-internal topics (halves, ops, schedules, retries, the auto-create template)."""
    return (topic.startswith(("RMQ_SYS_", "%RETRY%", "%DLQ%", "SCHEDULE_TOPIC"))
            or topic in ("TBW102", "TRANS_CHECK_MAX_TIME_TOPIC"))


class CommandError(click.ClickException):
    """A failed command, shown as the one line ``error: <what> at <address>: <why>`` (exit 1).

    Every client command fails through this class, so a script or a person reading stderr
    always learns what was attempted, against which address, and why it failed.
    """

    def __init__(self, what: str, address: str | None, why: str) -> None:
        self.what, self.address, self.why = what, address, why
        where = f" at {address}" if address else ""
        super().__init__(" ".join(f"{what}{where}: {why}".split()))  # one line

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class _UsageLine(click.UsageError):
    """A usage error as one ``error:`` line pointing at ``--help`` (exit 2), not click's block."""

    def show(self, file: IO[Any] | None = None) -> None:
        path = self.ctx.command_path if self.ctx is not None else "txbroker"
        click.echo(f"error: {self.format_message()} (see '{path} --help')", err=True)


class OneLineErrors(click.Group):
    """The root command group: usage and other click errors of every sub-command become one
    ``error:`` line too, the same style as :class:`CommandError`."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            raise _one_line(exc) from None


def _one_line(exc: click.ClickException) -> click.ClickException:
    if isinstance(exc, CommandError | _UsageLine | click.exceptions.NoArgsIsHelpError):
        return exc  # the last: a group called bare shows its help, which is no error line
    if isinstance(exc, click.UsageError):
        return _UsageLine(exc.format_message(), exc.ctx)
    ctx = click.get_current_context(silent=True)
    return CommandError(command_name(ctx), None, exc.format_message())


def command_name(ctx: click.Context | None) -> str:
    """``topic list`` for ``txbroker topic list``: the command path without the program."""
    if ctx is None:
        return "txbroker"
    return ctx.command_path.partition(" ")[2] or ctx.command_path


def _refused(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, ConnectionRefusedError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def explain(exc: BaseException, what: str, address: str | None) -> CommandError:
    """The one-line error for ``exc``, raised while doing ``what`` against ``address``.

    A broker's refusal names the broker's own address and its response code; a refused
    connection says that nothing is listening there, which almost always means no broker
    runs at that address.
    """
    if isinstance(exc, BrokerError):
        why = f"{code_name(exc.code)} ({exc.code})" + (f": {exc.remark}" if exc.remark else "")
        return CommandError(exc.what, exc.addr or address, why)
    if isinstance(exc, SendError):
        what = f"send to topic {exc.topic!r}"
        if exc.code is not None and len(exc.attempts) == 1:
            why = f"{code_name(exc.code)} ({exc.code})" + (f": {exc.remark}" if exc.remark else "")
            return CommandError(what, exc.addr or address, why)
        return CommandError(what, address, f"failed after {len(exc.attempts)} attempt(s): "
                                           + "; ".join(exc.attempts))
    if isinstance(exc, LocatedError):
        return CommandError(what, exc.addr, exc.reason)
    if _refused(exc):
        return CommandError(what, address, "connection refused: no broker is running there "
                                           "(start one with 'txbroker serve')")
    if isinstance(exc, TimeoutError) and not str(exc):
        return CommandError(what, address, "timed out waiting for the broker")
    return CommandError(what, address, str(exc).strip() or type(exc).__name__)


def run(make: Callable[[], Awaitable[T]], what: str | None = None, address: str | None = None) -> T:
    """Run ``make()`` on its own loop in a worker thread; map failures to a :class:`CommandError`.

    ``what`` names the action for the error line (default: the command, e.g. ``topic list``),
    ``address`` where it went (default: the command's ``--namesrv``).
    """
    ctx = click.get_current_context(silent=True)
    if what is None:
        what = command_name(ctx)
    if address is None and ctx is not None:
        address = ctx.params.get("namesrv")
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
            raise explain(exc, what, address) from None
        logging.getLogger("txbroker.cli").debug("unexpected error", exc_info=exc)
        raise CommandError(what, address, f"unexpected {type(exc).__name__}: {exc}") from None
    return result["value"]  # type: ignore[return-value]


def warn_exposure(host: str, listeners: Iterable[Listener]) -> None:
    """Print the one ``warning:`` line of :func:`~txbroker.service.exposure.exposure_warning`
    to stderr, when there is one (a port beyond loopback in plaintext or without
    authentication)."""
    line = exposure_warning(host, listeners)
    if line is not None:
        click.echo(line, err=True)
